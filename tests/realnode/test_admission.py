"""Pods the node cannot hold: asked for more ways than the node's pool (a Deployment: refused once, no
schedule-then-delete loop), and refused by the real kubelet's topology manager (TopologyAffinityError:
nothing is created for it, and the reason is visible)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from rmd_agent.deviceplugin.devices import WayPool
from rmd_agent.deviceplugin.plugin import CacheWaysPlugin
from rmd_sim.realnode.stack import RealStack, wait_for

WAYS = "intel.com/l3_cache_ways"
FAR_DEVICE = "example.com/far-device"  # a second vendor's device, on a NUMA node the CPUs are not on
NAMESPACE = "admission"


def events_for(stack: RealStack, name: str) -> list[dict[str, Any]]:
    found = stack.get_json("events", "-n", NAMESPACE, f"--field-selector=involvedObject.name={name}")
    items: list[dict[str, Any]] = found["items"]
    return items


@contextlib.contextmanager
def namespace(stack: RealStack) -> Iterator[None]:
    stack.create_namespace(NAMESPACE)
    try:
        yield
    finally:
        stack.delete_namespace(NAMESPACE)


def test_a_deployment_asking_more_ways_than_the_node_holds_is_refused_once(stack: RealStack) -> None:
    pool = int(stack.get_json("node", stack.node.name)["status"]["allocatable"][WAYS])
    labels = {"app": "too-many-ways"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "too-many-ways", "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        stack.container("app", {"cpu": "1", "memory": "64Mi", WAYS: str(pool + 1)})
                    ]
                },
            },
        },
    }
    with namespace(stack):
        stack.create(deployment)
        first = wait_for(
            "the Deployment's pod",
            lambda: stack.get_json("pods", "-n", NAMESPACE, "-l", "app=too-many-ways")["items"],
            timeout=30,
        )
        uid = first[0]["metadata"]["uid"]
        why = wait_for(
            "an Event saying why",
            lambda: [
                e for e in events_for(stack, first[0]["metadata"]["name"]) if WAYS in e.get("message", "")
            ],
            timeout=30,
        )
        assert why[0]["type"] == "Warning", why
        time.sleep(15)  # a loop (schedule, fail, delete, recreate) would show within this
        pods = stack.get_json("pods", "-n", NAMESPACE, "-l", "app=too-many-ways")["items"]
        assert [p["metadata"]["uid"] for p in pods] == [uid]  # the one pod, never replaced
        assert pods[0]["status"]["phase"] == "Pending"
        assert stack.get_json("rmdworkloads", "-n", NAMESPACE)["items"] == []


@contextlib.contextmanager
def far_device_plugin(stack: RealStack) -> Iterator[CacheWaysPlugin]:
    """A device plugin whose two devices sit on NUMA node 1, which this machine's CPUs are not on."""

    async def pools() -> list[WayPool]:
        return [WayPool(0, frozenset({1}), 2)]

    plugin = CacheWaysPlugin(
        pools,
        stack.node.kubelet_dir / "device-plugins",
        socket_name="far-device.sock",
        resource_name=FAR_DEVICE,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(plugin.run(),), daemon=True)
    thread.start()
    try:
        yield plugin
    finally:
        loop.call_soon_threadsafe(plugin.stop)
        thread.join(timeout=10)


def test_a_pod_the_topology_manager_refuses_gets_nothing_and_says_why(stack: RealStack) -> None:
    with namespace(stack), far_device_plugin(stack):
        wait_for(
            f"the Node to offer {FAR_DEVICE}",
            lambda: stack.get_json("node", stack.node.name)["status"]["allocatable"].get(FAR_DEVICE) == "2",
            timeout=30,
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "unaligned", "namespace": NAMESPACE},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    stack.container("app", {"cpu": "1", "memory": "64Mi", WAYS: "2", FAR_DEVICE: "1"})
                ],
            },
        }
        stack.create(pod)

        def refused() -> dict[str, Any] | None:
            found: dict[str, Any] = stack.get_json("pod", "-n", NAMESPACE, "unaligned") or {}
            return found if found.get("status", {}).get("phase") == "Failed" else None

        failed = wait_for("the kubelet to refuse the pod", refused, timeout=60)
        assert failed["status"]["reason"] == "TopologyAffinityError", failed["status"]
        said = wait_for(
            "the operator's Event quoting the kubelet",
            lambda: [
                e
                for e in events_for(stack, "unaligned")
                if e.get("source", {}).get("component") != "kubelet"
                and e.get("reportingComponent") != "kubelet"
                and "TopologyAffinityError" in e.get("message", "")
            ],
            timeout=30,
        )
        assert said[0]["type"] == "Warning"
        time.sleep(3)
        assert stack.get_json("rmdworkloads", "-n", NAMESPACE)["items"] == []
