"""NodeResourceTopology export on the real control plane: the exporter runs in-process against a simulated
kubelet (real PodResources gRPC, real cpu_manager_state renames) on a simulated host tree, and publishes to
a real kube-apiserver whose CRD is crds/noderesourcetopologies.topology.node.k8s.io.yaml.

Scenarios from the reference notes §8 (RTE's topology-updater and PodFingerprint e2e, NFD's): object
validity and owner, best-effort / burstable / fractional Guaranteed / exclusive pods, fingerprint stability
and changes (counting the pods the scheduler counts), recreation after deletion, excluded memory, devices,
cache ways, garbage collection with the Node.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_agent.cache_ways import Holding, parse_device_id
from rmd_agent.deviceplugin import CacheWaysPlugin, engine_pools
from rmd_agent.engine_api import AppliedWorkload, CacheDomainSummary, NodeSummary
from rmd_agent.hostfs import HostFS
from rmd_agent.kube import api_client_factory
from rmd_agent.nrt.exporter import NrtExporter, engine_l3_provider
from rmd_agent.nrt.fingerprint import fingerprint
from rmd_agent.nrt.publisher import GROUP, PLURAL, VERSION
from rmd_agent.nrt.quantity import parse_integer_quantity
from rmd_agent.nrt.zones import CacheWays
from rmd_agent.observe.caches import read_l3_caches
from rmd_agent.plan.workload import Workload
from rmd_agent.settings import AgentSettings
from rmd_api.names import CACHE_WAYS_RESOURCE, NRT_REQUEUE_ANNOTATION
from rmd_sim.control_plane import ControlPlane
from rmd_sim.hosttree import write_host_tree
from rmd_sim.kubelet import ContainerSpec, Device, SimKubelet
from rmd_sim.spec import NodeSpec

pytestmark = pytest.mark.e2e

TIMEOUT = 30.0
FAST: dict[str, Any] = {
    "nrt_resync_seconds": 0.5,
    "nrt_min_write_interval_seconds": 0.1,
    "nrt_poll_seconds": 0.2,
}
# Only the kubelet state-directory watch can make these react within TIMEOUT.
WATCH_ONLY: dict[str, Any] = {
    "nrt_resync_seconds": 600.0,
    "nrt_min_write_interval_seconds": 0.1,
    "nrt_poll_seconds": 600.0,
}
Obj = dict[str, Any]


@dataclass
class SimNode:
    name: str
    uid: str
    host: Path
    api: Any  # kubernetes.client.ApiClient of the test (the exporter makes its own)

    async def nrt(self) -> Obj | None:
        objects = client.CustomObjectsApi(self.api)
        try:
            result: Any = await asyncio.to_thread(
                objects.get_cluster_custom_object, GROUP, VERSION, PLURAL, self.name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(result)

    async def delete_nrt(self) -> None:
        objects = client.CustomObjectsApi(self.api)
        with contextlib.suppress(ApiException):
            await asyncio.to_thread(objects.delete_cluster_custom_object, GROUP, VERSION, PLURAL, self.name)


@pytest.fixture
def sim_node(control_plane: ControlPlane, short_tmp: Path) -> Iterator[SimNode]:
    """A Node object in the API server and the host tree of the simulated machine behind it."""
    name = f"nrt-{uuid.uuid4().hex[:8]}"
    host = short_tmp / "host"
    write_host_tree(NodeSpec.default(), host)
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        node = core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
        assert node.metadata is not None and node.metadata.uid
        node_state = SimNode(name, node.metadata.uid, host, api)
        try:
            yield node_state
        finally:
            with contextlib.suppress(ApiException):
                core.delete_node(name)
            with contextlib.suppress(ApiException):
                client.CustomObjectsApi(api).delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)


@contextlib.asynccontextmanager
async def exporting(
    control_plane: ControlPlane,
    node: SimNode,
    *,
    devices: Mapping[str, Sequence[Device]] | None = None,
    l3_provider: Callable[[], Awaitable[Sequence[CacheWays]]] | None = None,
    device_plugins: bool = False,
    **settings: Any,
) -> AsyncIterator[tuple[NrtExporter, SimKubelet]]:
    kubelet = SimKubelet.from_host_tree(node.host, devices=devices or {}, device_plugins=device_plugins)
    async with kubelet:
        exporter = NrtExporter(
            AgentSettings(node_name=node.name, host_root=node.host, **{**FAST, **settings}),
            api_client_factory(AgentSettings(kubeconfig=str(control_plane.kubeconfig))),
            l3_provider,
        )
        task = asyncio.create_task(exporter.run())
        try:
            yield exporter, kubelet
        finally:
            exporter.stop()
            await asyncio.wait_for(task, TIMEOUT)


async def eventually(probe: Callable[[], Awaitable[Any]], what: str, within: float = TIMEOUT) -> Any:
    """Poll `probe` until it returns something truthy; its last value otherwise fails the test."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.1)


async def published(node: SimNode) -> Obj:
    result: Obj = await eventually(node.nrt, f"NodeResourceTopology {node.name}")
    return result


async def settled(exporter: NrtExporter) -> None:
    """Wait for a refresh that started after this call (two pokes: a refresh already running may have
    read its inputs before the caller's change)."""
    for _ in range(2):
        before = exporter.refreshes
        exporter.poke("test")

        async def done(before: int = before) -> bool:
            return exporter.refreshes > before

        await eventually(done, "a refresh")


def attributes(obj: Obj) -> dict[str, str]:
    return {a["name"]: a["value"] for a in obj.get("attributes", [])}


def available(obj: Obj, resource: str) -> dict[str, int]:
    """Zone name -> available amount of `resource`."""
    return {
        z["name"]: parse_integer_quantity(r["available"])
        for z in obj["zones"]
        for r in z["resources"]
        if r["name"] == resource
    }


def allocatable(obj: Obj, resource: str) -> dict[str, int]:
    """Zone name -> allocatable amount of `resource`."""
    return {
        z["name"]: parse_integer_quantity(r["allocatable"])
        for z in obj["zones"]
        for r in z["resources"]
        if r["name"] == resource
    }


def resource_names(obj: Obj) -> list[set[str]]:
    return [{r["name"] for r in z["resources"]} for z in obj["zones"]]


# --- the object ---------------------------------------------------------------------------------------------


async def test_object_is_valid_complete_and_owned_by_its_node(
    control_plane: ControlPlane, sim_node: SimNode
) -> None:
    async with exporting(control_plane, sim_node) as (exporter, _):
        obj = await published(sim_node)
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": sim_node.name, "uid": sim_node.uid}
        ]
        assert "topologyPolicies" not in obj  # deprecated; RTE's validity check refuses it
        attrs = attributes(obj)
        assert attrs["topologyManagerPolicy"] == "single-numa-node"  # NodeSpec.default()'s kubelet config
        assert attrs["topologyManagerScope"] == "container"
        assert attrs["nodeTopologyPodsFingerprint"].startswith("pfp0v001")
        assert attrs["nodeTopologyPodsFingerprintMethod"] in ("all", "with-exclusive-resources")
        assert (
            obj["metadata"]["annotations"]["topology.node.k8s.io/fingerprint"]
            == (attrs["nodeTopologyPodsFingerprint"])
        )
        assert [z["name"] for z in obj["zones"]] == ["node-0", "node-1"]
        for zone in obj["zones"]:
            assert zone["type"] == "Node"
            assert {c["name"]: c["value"] for c in zone["costs"]}[zone["name"]] == 10
            assert len(zone["costs"]) == 2
            names = [r["name"] for r in zone["resources"]]
            assert names == sorted(names)
            assert {"cpu", "memory", "hugepages-2Mi", "hugepages-1Gi", CACHE_WAYS_RESOURCE} <= set(names)
            for r in zone["resources"]:
                amounts = [parse_integer_quantity(r[k]) for k in ("capacity", "allocatable", "available")]
                assert amounts[0] >= amounts[1] >= amounts[2] >= 0, (zone["name"], r)
        cpu = {z["name"]: next(r for r in z["resources"] if r["name"] == "cpu") for z in obj["zones"]}
        assert cpu["node-0"] == {"name": "cpu", "capacity": "32", "allocatable": "31", "available": "31"}
        assert cpu["node-1"] == {"name": "cpu", "capacity": "32", "allocatable": "32", "available": "32"}
        # The CRD kept every field as written (nothing pruned, Strict validation accepted it).
        assert exporter.last_topology is not None
        assert {k: obj[k] for k in ("zones", "attributes")} == exporter.last_topology.content()


async def test_deleting_the_node_garbage_collects_the_object(
    control_plane: ControlPlane, sim_node: SimNode
) -> None:
    async with exporting(control_plane, sim_node, nrt_resync_seconds=600.0):
        await published(sim_node)
        await asyncio.to_thread(client.CoreV1Api(sim_node.api).delete_node, sim_node.name)

        async def gone() -> bool:
            return await sim_node.nrt() is None

        await eventually(gone, "garbage collection of the NodeResourceTopology", within=60.0)


# --- pods -------------------------------------------------------------------------------------------------


async def test_shared_pods_change_nothing_and_a_fractional_guaranteed_pod_only_the_fingerprint(
    control_plane: ControlPlane, sim_node: SimNode
) -> None:
    async with exporting(control_plane, sim_node) as (exporter, kubelet):
        before = await published(sim_node)
        writes = exporter.publisher.writes if exporter.publisher else -1
        kubelet.add_pod("e2e", "best-effort", str(uuid.uuid4()), [ContainerSpec("c")])
        kubelet.add_pod("e2e", "burstable", str(uuid.uuid4()), [ContainerSpec("c", "1", "2", "1Gi", "2Gi")])
        await settled(exporter)
        after = await sim_node.nrt()
        assert after is not None
        assert available(after, "cpu") == available(before, "cpu") == {"node-0": 31, "node-1": 32}
        assert after["zones"] == before["zones"]
        assert attributes(after) == attributes(before)  # with-exclusive-resources: these pods do not count
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # no write
        assert exporter.publisher is not None and exporter.publisher.writes == writes

        # A Guaranteed pod with a fractional CPU pins nothing, but the scheduler counts it (it requests
        # memory), so the fingerprint must too: the agent knows its class from the cgroup the kubelet made.
        kubelet.add_pod(
            "e2e", "half-cpu", str(uuid.uuid4()), [ContainerSpec("c", "500m", "500m", "1Gi", "1Gi")]
        )
        expected = fingerprint([("e2e", "half-cpu")])

        async def counted() -> Obj | None:
            obj = await sim_node.nrt()
            return obj if obj and attributes(obj)["nodeTopologyPodsFingerprint"] == expected else None

        during = await eventually(counted, "the fractional Guaranteed pod in the fingerprint")
        assert during["zones"] == before["zones"]
        assert during["metadata"]["annotations"]["topology.node.k8s.io/fingerprint"] == expected


async def test_exclusive_pod_lowers_available_and_its_deletion_restores_it(
    control_plane: ControlPlane, sim_node: SimNode
) -> None:
    async with exporting(control_plane, sim_node, **WATCH_ONLY) as (_, kubelet):
        before = await published(sim_node)
        initial_cpu, initial_pfp = available(before, "cpu"), attributes(before)["nodeTopologyPodsFingerprint"]
        kubelet.add_pod("e2e", "pinned", "uid-pinned", [ContainerSpec("c", "2", "2", "1Gi", "1Gi")])
        pinned = kubelet.pods[0].cpus["c"]

        async def lowered() -> Obj | None:
            obj = await sim_node.nrt()
            return (
                obj if obj and sum(available(obj, "cpu").values()) == sum(initial_cpu.values()) - 2 else None
            )

        during = await eventually(lowered, "available cpu to drop by 2")
        zone = f"node-{kubelet.topology.cpu(min(pinned)).numa}"
        assert available(during, "cpu")[zone] == initial_cpu[zone] - 2
        assert attributes(during)["nodeTopologyPodsFingerprint"] != initial_pfp

        kubelet.remove_pod("uid-pinned")

        async def restored() -> Obj | None:
            obj = await sim_node.nrt()
            return obj if obj and available(obj, "cpu") == initial_cpu else None

        after = await eventually(restored, "available cpu to come back")
        assert attributes(after)["nodeTopologyPodsFingerprint"] == initial_pfp  # the same pod set again


async def test_a_change_is_written_again_one_requeue_delay_later_and_then_nothing(
    control_plane: ControlPlane, sim_node: SimNode
) -> None:
    """The echo for the NUMA-aware scheduler (docs/topology.md): after an allocation change, one more update
    event, annotation only, `nrt_requeue_seconds` later; a node where nothing changes gets no write."""
    requeue = 1.0
    async with exporting(control_plane, sim_node, **WATCH_ONLY, nrt_requeue_seconds=requeue) as (_, kubelet):
        created = await published(sim_node)
        await asyncio.sleep(requeue + 0.5)
        before = await sim_node.nrt()  # the start changed no allocation: no echo
        assert (
            before is not None
            and before["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
        )

        kubelet.add_pod("e2e", "pinned", "uid-pinned", [ContainerSpec("c", "2", "2", "1Gi", "1Gi")])
        seen: list[tuple[float, Obj]] = []  # each new resourceVersion, when this client saw it
        deadline = time.monotonic() + requeue + 3.0
        while time.monotonic() < deadline:
            obj = await sim_node.nrt()
            last = seen[-1][1] if seen else before
            if obj and obj["metadata"]["resourceVersion"] != last["metadata"]["resourceVersion"]:
                seen.append((time.monotonic(), obj))
            await asyncio.sleep(0.02)

    assert len(seen) == 2, [o["metadata"]["resourceVersion"] for _, o in seen]
    (changed_at, changed), (echoed_at, echoed) = seen
    assert changed["zones"] != before["zones"]  # the allocation
    assert echoed["zones"] == changed["zones"] and echoed["attributes"] == changed["attributes"]
    stamps = [
        o["metadata"].get("annotations", {}).get(NRT_REQUEUE_ANNOTATION) for o in (before, changed, echoed)
    ]
    assert stamps[0] is stamps[1] is None and stamps[2]  # only the echo wrote it
    print(f"change seen -> echo seen: {echoed_at - changed_at:.2f}s (nrt_requeue_seconds {requeue:g})")
    assert requeue - 0.2 <= echoed_at - changed_at <= requeue + 1.0


async def test_fingerprint_is_stable_while_pods_do_not_change(
    control_plane: ControlPlane, sim_node: SimNode
) -> None:
    async with exporting(control_plane, sim_node) as (exporter, kubelet):
        kubelet.add_pod("e2e", "pinned", "uid-pinned", [ContainerSpec("c", "1", "1", "1Gi", "1Gi")])
        await settled(exporter)
        first = await sim_node.nrt()
        assert first is not None
        start = exporter.refreshes

        async def three_resyncs() -> bool:
            return exporter.refreshes >= start + 3

        await eventually(three_resyncs, "three periodic refreshes")
        later = await sim_node.nrt()
        assert later is not None
        assert (
            attributes(later)["nodeTopologyPodsFingerprint"]
            == attributes(first)["nodeTopologyPodsFingerprint"]
        )
        assert later["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


# --- object lifecycle and configuration ----------------------------------------------------------------


async def test_deleted_object_is_recreated(control_plane: ControlPlane, sim_node: SimNode) -> None:
    async with exporting(control_plane, sim_node):
        first = await published(sim_node)
        await sim_node.delete_nrt()

        async def recreated() -> Obj | None:
            obj = await sim_node.nrt()
            return obj if obj and obj["metadata"]["uid"] != first["metadata"]["uid"] else None

        again = await eventually(recreated, "the NodeResourceTopology to be recreated")
        assert again["zones"] == first["zones"]


async def test_excluded_memory_is_not_published(control_plane: ControlPlane, sim_node: SimNode) -> None:
    async with exporting(control_plane, sim_node, nrt_exclude=("memory",)):
        obj = await published(sim_node)
        for names in resource_names(obj):
            assert "memory" not in names
            assert {"cpu", "hugepages-2Mi"} <= names


async def test_devices_and_cache_ways_follow_allocations(
    control_plane: ControlPlane, sim_node: SimNode
) -> None:
    guaranteed_used = {0: 0, 1: 0}
    spec = NodeSpec.default()

    async def l3_provider() -> list[CacheWays]:
        # What the engine would report: 6 guaranteed ways per L3 (one per socket), some held by a workload.
        return [
            CacheWays(
                s,
                frozenset(spec.cpus_of_socket(s)),
                spec.l3_ways,
                6,
                (Holding(frozenset(spec.cpus_of_socket(s)[:1]), guaranteed_used[s]),),
            )
            for s in range(spec.sockets)
        ]

    nics = {"example.com/nic": [Device("nic0", 0), Device("nic1", 1)]}
    async with exporting(control_plane, sim_node, devices=nics, l3_provider=l3_provider) as (
        exporter,
        kubelet,
    ):
        before = await published(sim_node)
        assert available(before, "example.com/nic") == {"node-0": 1, "node-1": 1}
        assert available(before, CACHE_WAYS_RESOURCE) == {"node-0": 6, "node-1": 6}

        kubelet.add_pod(
            "e2e", "nic-user", "uid-nic", [ContainerSpec("c", "1", "1", "1Gi", "1Gi", {"example.com/nic": 1})]
        )
        nic_zone = f"node-{kubelet.pods[0].devices['c']['example.com/nic'][0].numa}"
        guaranteed_used[1] = 4
        exporter.poke("cache allocation changed")

        async def updated() -> Obj | None:
            obj = await sim_node.nrt()
            ok = (
                obj
                and available(obj, "example.com/nic")[nic_zone] == 0
                and available(obj, CACHE_WAYS_RESOURCE)["node-1"] == 2
            )
            return obj if ok else None

        after = await eventually(updated, "devices and cache ways to be taken")
        assert available(after, CACHE_WAYS_RESOURCE)["node-0"] == 6


class PoolEngine:
    """The engine's side of the cache ways, booked like the real one: a guaranteed pool of `pool` ways on each
    L3 of the host tree, free = pool - what the applied guaranteed workloads hold."""

    def __init__(self, host: Path, pool: int) -> None:
        caches = read_l3_caches(HostFS(host))
        assert isinstance(caches, list)
        self.caches, self.pool = caches, pool
        self.applied: dict[str, AppliedWorkload] = {}

    async def node(self) -> NodeSummary:
        held = [w.cache for w in self.applied.values()]
        summaries = tuple(
            CacheDomainSummary(
                c.id,
                c.cpus,
                c.ways,
                {"guaranteed": self.pool - sum(m.get(c.id, 0).bit_count() for m in held)},
            )
            for c in self.caches
        )
        return NodeSummary("n", {}, 64, 2, summaries, 16, 1, len(self.applied))

    async def list(self) -> list[AppliedWorkload]:
        return list(self.applied.values())

    def apply(self, name: str, cpus: frozenset[int], cache: dict[int, int]) -> None:
        workload = Workload("e2e", name, core_ids=cpus, cache_max=2, cache_min=2)
        self.applied[name] = AppliedWorkload(workload, name, f"rmd-e2e.{name}", "guaranteed", cache)


async def test_cache_ways_mean_the_same_to_the_kubelet_the_plugin_and_the_zones(
    control_plane: ControlPlane, sim_node: SimNode
) -> None:
    """#13 item 10: a zone's allocatable is the plugin's devices for its L3 (what the kubelet has), available
    drops by a pod's ways once: at admission (the kubelet's books), not again when its workload is applied
    (the engine's)."""
    engine = PoolEngine(sim_node.host, 5)
    l3_provider = engine_l3_provider(engine)  # type: ignore[arg-type]
    pools = engine_pools(engine, HostFS(sim_node.host))  # type: ignore[arg-type]
    async with exporting(control_plane, sim_node, l3_provider=l3_provider, device_plugins=True) as (
        exporter,
        kubelet,
    ):
        assert kubelet.device_manager is not None
        plugin = CacheWaysPlugin(pools, kubelet.device_manager.plugin_dir, watch_seconds=0.05)
        plugin_task = asyncio.create_task(plugin.run())
        try:

            def kubelet_ways() -> dict[str, int]:
                """NUMA zone -> the plugin's devices the kubelet lists there."""
                per_zone: dict[str, int] = {}
                for device in kubelet.devices.get(CACHE_WAYS_RESOURCE, ()):
                    for numa in device.numa_nodes:
                        per_zone[f"node-{numa}"] = per_zone.get(f"node-{numa}", 0) + 1
                return per_zone

            async def ways_with(want: dict[str, int]) -> Obj | None:
                obj = await sim_node.nrt()
                return obj if obj and available(obj, CACHE_WAYS_RESOURCE) == want else None

            async def registered() -> bool:
                return kubelet_ways() == {"node-0": 5, "node-1": 5}

            await eventually(registered, "the plugin's 5 ways per L3 in the kubelet")
            empty = await eventually(lambda: ways_with({"node-0": 5, "node-1": 5}), "all ways available")
            assert allocatable(empty, CACHE_WAYS_RESOURCE) == kubelet_ways()

            pod = await kubelet.admit_pod(
                "e2e",
                "ways",
                "uid-ways",
                [ContainerSpec("c", "2", "2", "1Gi", "1Gi", {CACHE_WAYS_RESOURCE: 2})],
            )
            held = pod.devices["c"][CACHE_WAYS_RESOURCE]
            caches = {parsed[0] for parsed in (parse_device_id(d.id) for d in held) if parsed}
            assert len(held) == 2 and len(caches) == 1
            cache = caches.pop()  # one L3 per socket and NUMA node here, numbered alike
            zone, other = f"node-{cache}", f"node-{1 - cache}"
            await eventually(lambda: ways_with({zone: 3, other: 5}), "the pod's 2 ways taken at admission")

            engine.apply("ways-rmd-workload-c", pod.cpus["c"], {cache: 0b11000})
            plugin.notify()
            exporter.poke("workloads changed")
            await settled(exporter)
            applied = await sim_node.nrt()
            assert applied is not None
            assert available(applied, CACHE_WAYS_RESOURCE) == {zone: 3, other: 5}  # the same 2, not 2 more
            assert allocatable(applied, CACHE_WAYS_RESOURCE) == kubelet_ways() == {"node-0": 5, "node-1": 5}

            kubelet.remove_pod("uid-ways")
            del engine.applied["ways-rmd-workload-c"]
            exporter.poke("workloads changed")
            await eventually(lambda: ways_with({"node-0": 5, "node-1": 5}), "the ways back")
        finally:
            plugin.stop()
            await asyncio.wait_for(plugin_task, TIMEOUT)
