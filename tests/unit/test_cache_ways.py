"""L3 cache ways mean the same to the device plugin (the kubelet's books), the NodeResourceTopology (the
scheduler's zones) and the engine (#13 item 10; docs/topology.md "L3 cache ways").

A node of two NUMA nodes, one L3 each (11 ways, a guaranteed pool of 5), with an engine that books its
guaranteed workloads like the real one: free = pool - held.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from rmd_agent.cache_ways import Holding, device_holdings, ways_in_use
from rmd_agent.deviceplugin.devices import plan_devices
from rmd_agent.deviceplugin.pools import guaranteed_pools
from rmd_agent.engine_api import AppliedWorkload, CacheDomainSummary, NodeSummary
from rmd_agent.kubelet.podresources import (
    AllocatableResources,
    ContainerResources,
    DeviceAssignment,
    PodResources,
)
from rmd_agent.nrt.exporter import engine_l3_provider
from rmd_agent.nrt.zones import ResourceInfo, compute_zones
from rmd_agent.observe.numa import NumaNode
from rmd_agent.plan.workload import Workload
from rmd_api.names import CACHE_WAYS_RESOURCE

NUMA = [
    NumaNode(0, frozenset(range(0, 4)), 0, 0, (), {0: 10, 1: 20}),
    NumaNode(1, frozenset(range(4, 8)), 0, 0, (), {0: 20, 1: 10}),
]
NUMA_CPUS = {n.id: n.cpus for n in NUMA}
WAYS, POOL = 11, 5


class Engine:
    """Guaranteed pool of POOL ways on each L3 (cache id = NUMA id); `applied` is what it enforces."""

    def __init__(self) -> None:
        self.applied: list[AppliedWorkload] = []

    async def node(self) -> NodeSummary:
        caches = tuple(
            CacheDomainSummary(
                n.id,
                n.cpus,
                WAYS,
                {"guaranteed": POOL - sum(w.cache.get(n.id, 0).bit_count() for w in self.applied)},
            )
            for n in NUMA
        )
        return NodeSummary("n1", {}, 8, 2, caches, 16, 1, len(self.applied))

    async def list(self) -> list[AppliedWorkload]:
        return list(self.applied)

    def apply(self, name: str, cpus: set[int], cache: dict[int, int]) -> None:
        workload = Workload("default", name, core_ids=frozenset(cpus), cache_max=2, cache_min=2)
        self.applied.append(AppliedWorkload(workload, name, f"rmd-default.{name}", "guaranteed", cache))


async def views(
    engine: Engine, pods: Sequence[PodResources]
) -> tuple[dict[int, int], dict[int, ResourceInfo]]:
    """(cache id -> devices the plugin advertises, NUMA id -> the zone's cache-ways resource)."""
    pools = guaranteed_pools((await engine.node()).caches, await engine.list(), NUMA_CPUS)
    devices = plan_devices(pools)
    advertised = {p.cache_id: sum(d.cache_id == p.cache_id for d in devices) for p in pools}
    # The kubelet lists the plugin's devices as allocatable, one entry per device and NUMA node.
    allocatable = AllocatableResources(
        frozenset(range(8)),
        tuple(DeviceAssignment(CACHE_WAYS_RESOURCE, (d.id,), d.numa_nodes) for d in devices),
    )
    zones = compute_zones(NUMA, allocatable, pods, await engine_l3_provider(engine)())  # type: ignore[arg-type]
    ways = {z.numa_id: z.resource(CACHE_WAYS_RESOURCE) for z in zones}
    assert all(r is not None for r in ways.values())
    return advertised, {k: r for k, r in ways.items() if r is not None}


def pod_holding(name: str, cpus: set[int], device_ids: Sequence[str], numa: int) -> PodResources:
    """A pod whose container the kubelet gave exclusive `cpus` and the cache-way devices `device_ids`."""
    held = tuple(DeviceAssignment(CACHE_WAYS_RESOURCE, (i,), frozenset({numa})) for i in device_ids)
    return PodResources("default", name, (ContainerResources("c", frozenset(cpus), held),))


async def test_an_empty_node_advertises_its_pool_and_every_zone_has_all_of_it_available() -> None:
    advertised, zones = await views(Engine(), [])

    assert advertised == {0: POOL, 1: POOL}
    assert zones == {n: ResourceInfo(CACHE_WAYS_RESOURCE, WAYS, POOL, POOL) for n in (0, 1)}
    # The Node's allocatable (the plugin's devices, summed by the kubelet) is the sum of the zones'.
    assert sum(advertised.values()) == sum(r.allocatable for r in zones.values())


async def test_a_two_way_pod_lowers_available_by_two_once_from_admission_to_its_workload() -> None:
    engine = Engine()
    pod = pod_holding("p", {1, 2}, ["l3-0-way-0", "l3-0-way-1"], 0)

    # The kubelet admitted the pod and gave it 2 devices; its workload is not applied yet (the operator
    # creates it after the pod starts, or is down): the kubelet has 3 left, so must the zone.
    advertised, zones = await views(engine, [pod])
    assert advertised == {0: POOL, 1: POOL}
    assert zones[0] == ResourceInfo(CACHE_WAYS_RESOURCE, WAYS, POOL, POOL - 2)
    assert zones[1] == ResourceInfo(CACHE_WAYS_RESOURCE, WAYS, POOL, POOL)

    # The engine enforces its workload on the container's CPUs: the same 2 ways, not 2 more.
    engine.apply("p-rmd-workload-c", {1, 2}, {0: 0b11000})
    advertised, zones = await views(engine, [pod])
    assert advertised == {0: POOL, 1: POOL}
    assert zones[0] == ResourceInfo(CACHE_WAYS_RESOURCE, WAYS, POOL, POOL - 2)

    # A workload created for no pod holds ways the kubelet does not know of: they are taken too.
    engine.apply("direct", {3}, {0: 0b110})
    advertised, zones = await views(engine, [pod])
    assert advertised == {0: POOL, 1: POOL}
    assert zones[0] == ResourceInfo(CACHE_WAYS_RESOURCE, WAYS, POOL, POOL - 4)

    # The pod is gone (its workload not removed yet): the engine still holds its ways.
    _, zones = await views(engine, [])
    assert zones[0] == ResourceInfo(CACHE_WAYS_RESOURCE, WAYS, POOL, POOL - 4)


async def test_a_workload_on_cpus_of_two_caches_holds_ways_on_both_while_the_kubelet_charged_one() -> None:
    engine = Engine()
    pod = pod_holding("wide", {3, 4}, ["l3-0-way-0", "l3-0-way-1"], 0)
    engine.apply("wide-rmd-workload-c", {3, 4}, {0: 0b11000, 1: 0b11000})

    _, zones = await views(engine, [pod])

    assert [zones[n].available for n in (0, 1)] == [POOL - 2, POOL - 2]


def test_devices_of_the_resource_that_name_no_cache_are_not_counted() -> None:
    pod = PodResources(
        "ns",
        "p",
        (
            ContainerResources(
                "c",
                frozenset({1}),
                (
                    DeviceAssignment(CACHE_WAYS_RESOURCE, ("l3-1-way-0", "03"), frozenset({0})),
                    DeviceAssignment(CACHE_WAYS_RESOURCE, ("l3-1-way-0",), frozenset({1})),  # its 2nd node
                    DeviceAssignment("example.com/nic", ("l3-0-way-0",), frozenset({0})),
                ),
            ),
        ),
    )
    assert device_holdings([pod]) == {1: [Holding(frozenset({1}), 1)]}


holdings = st.lists(st.builds(Holding, st.frozensets(st.integers(0, 7), max_size=3), st.integers(0, 6)))


@given(holdings, holdings)
def test_ways_in_use_count_each_holder_at_most_once_and_nothing_less_than_either_book(
    workloads: list[Holding], containers: list[Holding]
) -> None:
    used = ways_in_use(workloads, containers)
    by_engine, by_kubelet = sum(w.ways for w in workloads), sum(c.ways for c in containers)
    assert max(by_engine, by_kubelet) <= used <= by_engine + by_kubelet
    assert used == ways_in_use(workloads[::-1], containers[::-1])


@given(st.lists(st.integers(1, 6), max_size=5), st.lists(st.integers(1, 6), max_size=3))
def test_applied_pods_count_once_and_workloads_for_no_pod_on_their_own(
    pod_ways: list[int], direct_ways: list[int]
) -> None:
    pods = [Holding(frozenset({2 * i, 2 * i + 1}), n) for i, n in enumerate(pod_ways)]
    direct = [Holding(frozenset({100 + i}), n) for i, n in enumerate(direct_ways)]
    applied = [Holding(p.cpus, p.ways) for p in pods]  # each pod's workload, on its container's CPUs

    assert ways_in_use(applied + direct, pods) == sum(pod_ways) + sum(direct_ways)
    assert ways_in_use(direct, pods) == sum(pod_ways) + sum(direct_ways)  # workloads not applied yet
