"""The simulated kubelet as a node of the real API server: the Node object with the cache-ways resource of
the agent's device plugin, pods bound to it admitted (CPUs, ways) or rejected like the kubelet does, and
deleted pods released. The kubelet, the device plugin and the PodResources client run in-process over real
unix sockets; the API server, etcd and the controller manager are real."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_agent.deviceplugin import CacheWaysPlugin, WayPool
from rmd_agent.deviceplugin.devices import ENV_WAYS, numa_nodes_of
from rmd_agent.deviceplugin.pools import read_numa_cpus
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.podresources import PodResources, PodResourcesClient
from rmd_agent.observe.caches import read_l3_caches
from rmd_api.cpuset import parse_cpu_list
from rmd_api.kubelet.checkpoint import decode_cpu_manager_state
from rmd_api.names import CACHE_WAYS_RESOURCE as RESOURCE_NAME
from rmd_sim.control_plane import ControlPlane
from rmd_sim.hosttree import write_host_tree
from rmd_sim.kubelet import STATE_REL, SimKubelet
from rmd_sim.kubelet_api import KubeletNode
from rmd_sim.spec import NodeSpec

pytestmark = pytest.mark.e2e

# 16 CPUs on 2 NUMA nodes (one L3 cache each), CPU 0 reserved: 15 allocatable.
SPEC = NodeSpec(cores_per_socket=4, reserved_cpus="0")
CPUS = SPEC.sockets * SPEC.cores_per_socket * SPEC.threads_per_core
TIMEOUT = 30.0
Obj = dict[str, Any]


@dataclass
class NodeClient:
    """One node seen from outside: its objects in the API server and its kubelet's PodResources socket."""

    name: str
    api: Any
    pod_resources_socket: Path

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    async def node(self) -> Obj:
        response = await asyncio.to_thread(self.core.read_node, self.name, _preload_content=False)
        return dict(response.json())

    async def pod(self, namespace: str, name: str) -> Obj | None:
        try:
            response = await asyncio.to_thread(
                self.core.read_namespaced_pod, name, namespace, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(response.json())

    async def create_pod(self, namespace: str, name: str, cpu: str, ways: int = 0) -> Obj:
        limits = {"cpu": cpu, "memory": "1Gi", **({RESOURCE_NAME: str(ways)} if ways else {})}
        body = client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(
                node_name=self.name,
                containers=[
                    client.V1Container(
                        name="app",
                        image="registry.example/app:1",
                        resources=client.V1ResourceRequirements(limits=limits),
                    )
                ],
            ),
        )
        await asyncio.to_thread(self.core.create_namespaced_pod, namespace, body)
        return await self.settled(namespace, name)

    async def settled(self, namespace: str, name: str) -> Obj:
        """The pod once the kubelet has decided: Running or Failed."""

        async def probe() -> Obj | None:
            pod = await self.pod(namespace, name)
            phase = (pod or {}).get("status", {}).get("phase")
            return pod if phase in ("Running", "Failed") else None

        result: Obj = await eventually(probe, f"pod {namespace}/{name} to run or fail")
        return result

    async def pod_resources(self) -> list[PodResources]:
        async with PodResourcesClient(self.pod_resources_socket) as pods:
            return await pods.list()


@dataclass
class SimNode(NodeClient):
    kubelet: SimKubelet
    plugin: CacheWaysPlugin
    ways: dict[int, int]  # the guaranteed pool per cache id, as the plugin's provider reports it


async def eventually(probe: Callable[[], Awaitable[Any]], what: str, within: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.1)


def ways_advertised(sim: SimNode) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        allocatable = (await sim.node())["status"].get("allocatable", {})
        return bool(allocatable.get(RESOURCE_NAME) == str(sum(sim.ways.values())))

    return probe


@pytest.fixture
async def sim_node(control_plane: ControlPlane, namespace: str, short_tmp: Path) -> AsyncIterator[SimNode]:
    host = short_tmp / "host"
    write_host_tree(SPEC, host)
    fs = HostFS(host)
    caches = read_l3_caches(fs)
    assert isinstance(caches, list)
    numa = read_numa_cpus(fs)
    ways = {0: 3, 1: 3}

    async def pools() -> list[WayPool]:
        return [WayPool(c.id, numa_nodes_of(c.cpus, numa), ways.get(c.id, 0)) for c in caches]

    name = f"sim-{uuid.uuid4().hex[:8]}"
    kubelet = SimKubelet.from_host_tree(host, device_plugins=True)
    assert kubelet.device_manager is not None
    plugin = CacheWaysPlugin(pools, kubelet.device_manager.plugin_dir, watch_seconds=0.1)
    with control_plane.api_client() as api:
        async with kubelet:
            plugin_task = asyncio.create_task(plugin.run())
            try:
                node = KubeletNode(kubelet, api, name, labels={"rmd.test/e2e": "true"}, resync_seconds=2.0)
                async with node:
                    sim = SimNode(name, api, kubelet.socket_path, kubelet, plugin, ways)
                    await eventually(ways_advertised(sim), "the cache ways in the node's allocatable")
                    try:
                        yield sim
                    finally:
                        # Nothing else would finish pods bound to this node once it is gone.
                        core = client.CoreV1Api(api)
                        listed = await asyncio.to_thread(
                            core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={name}"
                        )
                        for pod in listed.items:
                            assert pod.metadata is not None
                            with contextlib.suppress(ApiException):
                                await asyncio.to_thread(
                                    core.delete_namespaced_pod,
                                    str(pod.metadata.name),
                                    str(pod.metadata.namespace),
                                    grace_period_seconds=0,
                                )
            finally:
                plugin_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await plugin_task
        with contextlib.suppress(ApiException):
            client.CoreV1Api(api).delete_node(name)


@pytest.fixture
def other_namespace(control_plane: ControlPlane) -> Iterator[str]:
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        created = core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(generate_name="e2e-"))
        )
        assert created.metadata is not None and created.metadata.name
        name = created.metadata.name
        deadline = time.monotonic() + 30
        while True:  # pods need the namespace's default ServiceAccount
            try:
                core.read_namespaced_service_account("default", name)
                break
            except ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
        yield name
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)


def condition(obj: Obj, kind: str) -> str | None:
    return next((c["status"] for c in obj["status"].get("conditions") or () if c["type"] == kind), None)


def exclusive_cpus(pods: list[PodResources], namespace: str, name: str) -> frozenset[int] | None:
    pod = next((p for p in pods if (p.namespace, p.name) == (namespace, name)), None)
    return None if pod is None else frozenset().union(*(c.cpu_ids for c in pod.containers))


# --- the node ---


async def test_node_is_registered_with_cpus_and_the_cache_ways_of_the_device_plugin(
    sim_node: SimNode,
) -> None:
    node = await sim_node.node()  # the fixture waited for the plugin's ways to reach the Node

    labels = node["metadata"]["labels"]
    assert labels["rmd.test/e2e"] == "true"
    assert labels["kubernetes.io/hostname"] == sim_node.name
    status = node["status"]
    assert status["capacity"]["cpu"] == str(CPUS)
    assert status["allocatable"]["cpu"] == str(CPUS - 1)
    assert status["capacity"][RESOURCE_NAME] == status["allocatable"][RESOURCE_NAME] == "6"
    assert status["capacity"]["pods"] == "110"
    assert condition(node, "Ready") == "True"
    assert {"type": "InternalIP", "address": "127.0.0.1"} in status["addresses"]

    # The pool shrinks: the plugin re-advertises, the kubelet updates the Node.
    sim_node.ways[1] = 1
    sim_node.plugin.notify()
    await eventually(ways_advertised(sim_node), "4 cache ways on the node")
    assert (await sim_node.node())["status"]["capacity"][RESOURCE_NAME] == "4"


# --- pods ---


async def test_pod_bound_to_the_node_runs_with_exclusive_cpus_and_ways(
    sim_node: SimNode, namespace: str
) -> None:
    pod = await sim_node.create_pod(namespace, "web", "2", ways=2)

    status = pod["status"]
    assert status["phase"] == "Running", status
    assert status["podIP"] and status["hostIP"] == "127.0.0.1"
    assert condition(pod, "Ready") == "True"
    assert status["containerStatuses"][0]["state"]["running"]
    assert (
        status["qosClass"] == "Guaranteed"
    )  # set by the API server, agreeing with the kubelet's CPU pinning

    async with PodResourcesClient(sim_node.kubelet.socket_path) as pods:
        listed = await pods.get(namespace, "web")
    assert listed is not None
    (container,) = listed.containers
    assert len(container.cpu_ids) == 2
    assert 0 not in container.cpu_ids  # reserved
    cpu_numa = {sim_node.kubelet.topology.cpu(c).numa for c in container.cpu_ids}
    ways = [d for d in container.devices if d.resource == RESOURCE_NAME]
    assert len(ways) == 2
    assert all(d.numa_nodes == cpu_numa for d in ways)
    sim_pod = sim_node.kubelet.find_pod(namespace, "web")
    assert sim_pod is not None and sim_pod.uid == pod["metadata"]["uid"]
    assert sim_pod.envs["app"][ENV_WAYS] == "2"  # from the plugin's Allocate


async def test_pods_that_do_not_fit_fail_with_the_kubelets_reason(sim_node: SimNode, namespace: str) -> None:
    too_many_cpus = await sim_node.create_pod(namespace, "cpus", str(CPUS))
    too_many_ways = await sim_node.create_pod(namespace, "ways", "1", ways=7)

    assert too_many_cpus["status"]["phase"] == "Failed"
    assert too_many_cpus["status"]["reason"] == "OutOfcpu"
    assert too_many_cpus["status"]["message"] == (
        f"Pod was rejected: Node didn't have enough resource: cpu, requested: {CPUS * 1000}, used: 0, "
        f"capacity: {(CPUS - 1) * 1000}"
    )
    assert too_many_ways["status"]["phase"] == "Failed"
    assert too_many_ways["status"]["reason"] == f"OutOf{RESOURCE_NAME}"
    assert sim_node.kubelet.pods == []
    assert await sim_node.pod_resources() == []


async def test_single_numa_node_refuses_what_one_numa_node_cannot_hold(
    sim_node: SimNode, namespace: str
) -> None:
    assert sim_node.kubelet.topology_manager_policy == "single-numa-node"  # the host tree's kubelet config
    per_numa = CPUS // SPEC.numa_nodes
    spanning = await sim_node.create_pod(namespace, "spanning", str(per_numa + 1))
    assert spanning["status"]["phase"] == "Failed"
    assert spanning["status"]["reason"] == "TopologyAffinityError"  # as the real kubelet's topology manager
    assert spanning["status"]["message"] == (
        "Pod was rejected: Resources cannot be allocated with Topology locality"
    )
    assert sim_node.kubelet.pods == [] and await sim_node.pod_resources() == []
    fits = await sim_node.create_pod(
        namespace, "fits", str(per_numa - 1)
    )  # NUMA node 0 holds the reserved CPU
    assert fits["status"]["phase"] == "Running"


async def test_deleting_a_pod_releases_its_cpus(sim_node: SimNode, namespace: str) -> None:
    # Pods of more CPUs than one NUMA node has: a kubelet without a topology manager policy admits them.
    sim_node.kubelet.topology_manager_policy = "none"
    first = await sim_node.create_pod(namespace, "first", "10")
    assert first["status"]["phase"] == "Running"
    held = exclusive_cpus(await sim_node.pod_resources(), namespace, "first")
    assert held is not None and len(held) == 10
    blocked = await sim_node.create_pod(namespace, "blocked", str(CPUS - 1))
    assert blocked["status"]["reason"] == "OutOfcpu"

    await asyncio.to_thread(sim_node.core.delete_namespaced_pod, "first", namespace)  # default grace period

    await eventually(lambda: _gone(sim_node, namespace, "first"), "the pod object to be deleted")
    assert exclusive_cpus(await sim_node.pod_resources(), namespace, "first") is None
    state_path = sim_node.kubelet.host_root / STATE_REL
    state = decode_cpu_manager_state(state_path.read_text(), str(state_path))
    assert first["metadata"]["uid"] not in state.entries
    assert parse_cpu_list(state.default_cpu_set) == frozenset(range(CPUS))

    whole = await sim_node.create_pod(namespace, "whole", str(CPUS - 1))
    assert whole["status"]["phase"] == "Running"
    assert exclusive_cpus(await sim_node.pod_resources(), namespace, "whole") == frozenset(range(1, CPUS))


async def _gone(sim_node: NodeClient, namespace: str, name: str) -> bool:
    return await sim_node.pod(namespace, name) is None


async def test_same_pod_name_in_two_namespaces_is_two_pods(
    sim_node: SimNode, namespace: str, other_namespace: str
) -> None:
    a = await sim_node.create_pod(namespace, "web", "2", ways=1)
    b = await sim_node.create_pod(other_namespace, "web", "2", ways=1)
    assert a["status"]["phase"] == b["status"]["phase"] == "Running"
    assert a["status"]["podIP"] != b["status"]["podIP"]

    listed = await sim_node.pod_resources()
    cpus_a = exclusive_cpus(listed, namespace, "web")
    cpus_b = exclusive_cpus(listed, other_namespace, "web")
    assert cpus_a and cpus_b and not cpus_a & cpus_b

    await asyncio.to_thread(sim_node.core.delete_namespaced_pod, "web", other_namespace)
    await eventually(lambda: _gone(sim_node, other_namespace, "web"), "the second pod to go")

    listed = await sim_node.pod_resources()
    assert exclusive_cpus(listed, namespace, "web") == cpus_a
    assert exclusive_cpus(listed, other_namespace, "web") is None
    still = await sim_node.pod(namespace, "web")
    assert still is not None and still["status"]["phase"] == "Running"


# --- the command line ---


async def test_kubelet_command_in_api_mode(
    control_plane: ControlPlane, namespace: str, short_tmp: Path
) -> None:
    host = short_tmp / "cli"
    write_host_tree(SPEC, host)
    name = f"cli-{uuid.uuid4().hex[:8]}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rmd_sim",
        "kubelet",
        "--host-root",
        str(host),
        "--kubeconfig",
        str(control_plane.kubeconfig),
        "--node-name",
        name,
        "--node-label",
        "rmd.test/cli=yes",
        stderr=asyncio.subprocess.PIPE,
    )
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        try:

            async def registered() -> Any:
                assert proc.returncode is None, "the kubelet exited early"
                with contextlib.suppress(ApiException):
                    node = await asyncio.to_thread(core.read_node, name)
                    # The kubelet creates the Node, then reports its status in a second write.
                    return node if node.status and node.status.allocatable else None
                return None

            node = await eventually(registered, "the Node with its status")
            assert node.metadata.labels["rmd.test/cli"] == "yes"
            assert node.status.allocatable["cpu"] == str(CPUS - 1)
            sim = NodeClient(name, api, host / "var/lib/kubelet/pod-resources/kubelet.sock")
            pod = await sim.create_pod(namespace, "p", "2")
            assert pod["status"]["phase"] == "Running"
            # The subprocess's PodResources socket, read by the agent's client.
            assert exclusive_cpus(await sim.pod_resources(), namespace, "p") == frozenset(
                parse_cpu_list(
                    decode_cpu_manager_state((host / STATE_REL).read_text(), "state").entries[
                        pod["metadata"]["uid"]
                    ]["app"]
                )
            )
            await asyncio.to_thread(core.delete_namespaced_pod, "p", namespace)
            await eventually(lambda: _gone(sim, namespace, "p"), "the pod to be deleted")
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(proc.communicate(), 20)
            with contextlib.suppress(ApiException):
                core.delete_node(name)
    assert proc.returncode == 0, stderr.decode()[-2000:]
