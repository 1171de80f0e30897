"""Restarts on a real node: the kubelet (the device plugin must register again, allocations survive) and the
agent's own pod (the DaemonSet recreates it; it adopts what it enforced without touching resctrl)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from rmd_sim.realnode.stack import RELEASE_NAMESPACE, RealStack, wait_for
from rmd_sim.resctrl.sim import SimResctrl

WAYS = "intel.com/l3_cache_ways"
NAMESPACE = "restarts"
REGISTERED = f"registered {WAYS} with the kubelet"


@contextlib.contextmanager
def resctrl_operations(sim: SimResctrl) -> Iterator[list[tuple[str, str]]]:
    """Every write, mkdir and rmdir that reaches the simulated kernel while the block runs."""
    ops: list[tuple[str, str]] = []
    originals = {kind: getattr(sim, kind) for kind in ("write", "mkdir", "rmdir")}

    def recording(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(rel: str, *args: Any) -> Any:
            ops.append((kind, rel))
            return original(rel, *args)

        return call

    for kind, original in originals.items():
        setattr(sim, kind, recording(kind, original))
    try:
        yield ops
    finally:
        for kind in originals:
            delattr(sim, kind)  # the class's methods again


def agent_pod(stack: RealStack) -> dict[str, Any]:
    pods = stack.get_json("pods", "-n", RELEASE_NAMESPACE, "-l", "app.kubernetes.io/component=agent")["items"]
    (found,) = pods
    result: dict[str, Any] = found
    return result


def agent_log(stack: RealStack) -> str:
    return stack.kubectl("logs", "-n", RELEASE_NAMESPACE, agent_pod(stack)["metadata"]["name"]).stdout


def allocatable_ways(stack: RealStack) -> str | None:
    value: str | None = stack.get_json("node", stack.node.name)["status"]["allocatable"].get(WAYS)
    return value


@contextlib.contextmanager
def running_cache_pod(stack: RealStack) -> Iterator[str]:
    stack.wait_nothing_held()  # the pod needs the node's exclusive CPU
    stack.create_namespace(NAMESPACE)
    try:
        stack.create(stack.cache_pod("held", NAMESPACE))
        entry = stack.wait_applied(NAMESPACE, "held-rmd-workload-app")
        yield str(entry["cosName"])
    finally:
        stack.delete_namespace(NAMESPACE)


def test_the_kubelet_restarted_the_plugin_registers_again_and_allocations_survive(stack: RealStack) -> None:
    with running_cache_pod(stack) as cos_name:
        state_file = stack.node.kubelet_dir / "cpu_manager_state"
        cpus_before = json.loads(state_file.read_text())["entries"]
        ways_before = allocatable_ways(stack)
        registrations = agent_log(stack).count(REGISTERED)

        stack.node.restart_kubelet()
        wait_for(
            "the device plugin to register with the new kubelet",
            lambda: agent_log(stack).count(REGISTERED) > registrations,
            timeout=10,
        )
        wait_for(
            "the Node's cache ways back",
            lambda: allocatable_ways(stack) == ways_before,
            timeout=30,
            interval=0.1,
        )
        back_after = time.monotonic() - stack.node.kubelet_started
        print(f"the Node's cache ways were back {back_after:.1f}s after the kubelet started")
        assert back_after <= 10, f"the Node's ways came back {back_after:.1f}s after the kubelet started"

        assert json.loads(state_file.read_text())["entries"] == cpus_before
        pod = stack.get_json("pod", "-n", NAMESPACE, "held")
        assert pod["status"]["phase"] == "Running"
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
        assert stack.workload_entry(NAMESPACE, "held-rmd-workload-app")["status"] == "Successful"
        assert (stack.host.root / "sys/fs/resctrl" / cos_name).is_dir()


def test_the_agent_pod_recreated_adopts_its_state_without_a_resctrl_write(stack: RealStack) -> None:
    assert stack.host.resctrl is not None
    with running_cache_pod(stack) as cos_name:
        entry_before = stack.workload_entry(NAMESPACE, "held-rmd-workload-app")
        old = agent_pod(stack)["metadata"]["name"]
        with resctrl_operations(stack.host.resctrl.sim) as ops:
            stack.kubectl("delete", "pod", "-n", RELEASE_NAMESPACE, old, "--wait=true")
            new = wait_for(
                "the DaemonSet's new agent pod Ready",
                lambda: (
                    (p := agent_pod(stack))["metadata"]["name"] != old
                    and any(
                        c["type"] == "Ready" and c["status"] == "True"
                        for c in p["status"].get("conditions", [])
                    )
                    and p
                ),
                timeout=90,
            )
            time.sleep(3)  # let the new agent settle: a late write would show here
        assert ops == [], f"the restarted agent wrote to resctrl: {ops}"
        assert new["spec"]["nodeName"] == stack.node.name
        assert stack.workload_entry(NAMESPACE, "held-rmd-workload-app") == entry_before
        assert (stack.host.root / "sys/fs/resctrl" / cos_name).is_dir()
