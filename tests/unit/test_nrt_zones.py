"""NUMA zone computation (rmd_agent.nrt.zones): RTE's resource-scan golden cases, our memory split and
cache-ways resource, exclusions, and properties that hold for any input.

The golden cases are resource-topology-exporter's `TestResourcesScan` (pkg/resourcemonitor/
resourcemonitor_test.go): a 2-NUMA, 24-CPU machine (even CPUs on node 0, odd on node 1, distances 10/20)
whose topology carries no memory information, devices fake.io/net and fake.io/gpu, and the same expected
zones. RTE sorts its zones before comparing; ours must already come out sorted.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmd_agent.cache_ways import Holding
from rmd_agent.kubelet.config import KubeletConfig
from rmd_agent.kubelet.podresources import (
    AllocatableResources,
    ContainerResources,
    DeviceAssignment,
    MemoryBlock,
    PodResources,
)
from rmd_agent.nrt.exporter import NrtExporter, node_exclusions, topology_attributes
from rmd_agent.nrt.quantity import decimal_si, parse_integer_quantity
from rmd_agent.nrt.zones import (
    CacheWays,
    NodeTopology,
    ResourceInfo,
    Zone,
    compute_zones,
    is_excluded,
)
from rmd_agent.observe.numa import Hugepages, NumaNode
from rmd_agent.settings import AgentSettings
from rmd_api.names import CACHE_WAYS_RESOURCE

GIB = 1024**3

# --- RTE's fixture machine ------------------------------------------------------------------------

RTE_NUMA = [
    NumaNode(0, frozenset(range(0, 24, 2)), 0, 0, (), {0: 10, 1: 20}),
    NumaNode(1, frozenset(range(1, 24, 2)), 0, 0, (), {0: 20, 1: 10}),
]


def dev(resource: str, device_id: str, numa: int | None) -> DeviceAssignment:
    return DeviceAssignment(resource, (device_id,), frozenset() if numa is None else frozenset({numa}))


ALL_DEVICES = (
    *(dev("fake.io/net", f"netAAA-{i}", 0) for i in range(4)),
    dev("fake.io/net", "netBBB-0", 1),
    dev("fake.io/net", "netBBB-1", 1),
    dev("fake.io/gpu", "gpuAAA", 1),
)
MINIMAL_DEVICES = (
    dev("fake.io/net", "netAAA", 0),
    dev("fake.io/resourceToBeExcluded", "excludeMeA", 0),
    dev("fake.io/net", "netBBB", 1),
    dev("fake.io/gpu", "gpuAAA", 1),
    dev("fake.io/resourceToBeExcluded", "excludeMeB", 1),
)
TEST_POD = PodResources(
    "default",
    "test-pod-0",
    (ContainerResources("test-cnt-0", frozenset({5, 7}), (dev("fake.io/net", "netBBB", 1),)),),
)
EXCLUDED = ("fake.io/resourceToBeExcluded",)


def res(name: str, available: str, allocatable: str, capacity: str) -> dict[str, str]:
    return {"name": name, "capacity": capacity, "allocatable": allocatable, "available": available}


def zone(numa: int, *resources: dict[str, str]) -> dict[str, Any]:
    costs = [
        {"name": "node-0", "value": 10 if numa == 0 else 20},
        {"name": "node-1", "value": 20 if numa == 0 else 10},
    ]
    return {"name": f"node-{numa}", "type": "Node", "costs": costs, "resources": list(resources)}


def rendered(zones: tuple[Zone, ...]) -> list[dict[str, Any]]:
    return [z.as_dict() for z in zones]


GOLDEN = {
    "no pods": (
        AllocatableResources(frozenset(range(24)), ALL_DEVICES),
        [],
        (),
        [
            zone(0, res("cpu", "12", "12", "12"), res("fake.io/net", "4", "4", "4")),
            zone(
                1,
                res("cpu", "12", "12", "12"),
                res("fake.io/gpu", "1", "1", "1"),
                res("fake.io/net", "2", "2", "2"),
            ),
        ],
    ),
    "reserved cpus": (
        AllocatableResources(frozenset(range(2, 24)), ALL_DEVICES),
        [],
        (),
        [
            zone(0, res("cpu", "11", "11", "12"), res("fake.io/net", "4", "4", "4")),
            zone(
                1,
                res("cpu", "11", "11", "12"),
                res("fake.io/gpu", "1", "1", "1"),
                res("fake.io/net", "2", "2", "2"),
            ),
        ],
    ),
    "pod allocations": (
        AllocatableResources(frozenset(range(24)), MINIMAL_DEVICES),
        [TEST_POD],
        EXCLUDED,
        [
            zone(0, res("cpu", "12", "12", "12"), res("fake.io/net", "1", "1", "1")),
            zone(
                1,
                res("cpu", "10", "12", "12"),
                res("fake.io/gpu", "1", "1", "1"),
                res("fake.io/net", "0", "1", "1"),
            ),
        ],
    ),
    "pod allocations and reserved cpus": (
        AllocatableResources(frozenset(range(1, 24)), MINIMAL_DEVICES),
        [TEST_POD],
        EXCLUDED,
        [
            zone(0, res("cpu", "11", "11", "12"), res("fake.io/net", "1", "1", "1")),
            zone(
                1,
                res("cpu", "10", "12", "12"),
                res("fake.io/gpu", "1", "1", "1"),
                res("fake.io/net", "0", "1", "1"),
            ),
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_rte_resource_scan_golden_cases(case: str) -> None:
    allocatable, pods, exclude, expected = GOLDEN[case]
    assert rendered(compute_zones(RTE_NUMA, allocatable, pods, exclude=exclude)) == expected


def test_excluded_resource_is_left_out_of_every_zone() -> None:
    allocatable, pods, _, _ = GOLDEN["pod allocations"]
    with_it = compute_zones(RTE_NUMA, allocatable, pods)
    without = compute_zones(RTE_NUMA, allocatable, pods, exclude=EXCLUDED)
    assert all(
        z.resource("fake.io/resourceToBeExcluded") == ResourceInfo("fake.io/resourceToBeExcluded", 1, 1, 1)
        for z in with_it
    )
    assert all(z.resource("fake.io/resourceToBeExcluded") is None for z in without)


class FakePodResources:
    """GetAllocatableResources and List answers set by the test (the kubelet's side is tested elsewhere)."""

    def __init__(self, allocatable: AllocatableResources, pods: list[PodResources]) -> None:
        self.allocatable = allocatable
        self.pods = pods

    async def get_allocatable(self) -> AllocatableResources:
        return self.allocatable

    async def list(self) -> list[PodResources]:
        return list(self.pods)


@pytest.fixture
def rte_host(make_tree: Any) -> Path:
    """A host tree describing RTE's fixture machine (NUMA nodes without memory, no L3 cache information)."""
    files = {
        "var/lib/kubelet/config.yaml": "apiVersion: kubelet.config.k8s.io/v1beta1\n"
        "kind: KubeletConfiguration\ntopologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\n"
    }
    for node in RTE_NUMA:
        base = f"sys/devices/system/node/node{node.id}"
        files[f"{base}/cpulist"] = ",".join(map(str, sorted(node.cpus))) + "\n"
        files[f"{base}/meminfo"] = f"Node {node.id} MemTotal:       0 kB\n"
        files[f"{base}/distance"] = " ".join(str(node.distances[i]) for i in (0, 1)) + "\n"
    root: Path = make_tree(files)
    return root


def exporter_for(host: Path, **overrides: Any) -> NrtExporter:
    settings = AgentSettings(node_name="TEST", host_root=host, **overrides)
    return NrtExporter(settings, api_client_factory=lambda: None)


async def test_rte_golden_refreshed_allocatable_is_read_on_every_refresh(rte_host: Path) -> None:
    """RTE's "with refresh allocation" case: a device registered after start shows up in the zones."""
    exporter = exporter_for(rte_host, nrt_exclude=EXCLUDED)
    without_gpu = tuple(d for d in MINIMAL_DEVICES if d.resource != "fake.io/gpu")
    kubelet = FakePodResources(AllocatableResources(frozenset(range(24)), without_gpu), [TEST_POD])
    before = await exporter.snapshot(kubelet)  # type: ignore[arg-type]
    assert all(z.resource("fake.io/gpu") is None for z in before.zones)
    kubelet.allocatable = AllocatableResources(frozenset(range(24)), MINIMAL_DEVICES)
    after = await exporter.snapshot(kubelet)  # type: ignore[arg-type]
    assert rendered(after.zones) == GOLDEN["pod allocations"][3]


async def test_rte_golden_pod_fingerprint(rte_host: Path) -> None:
    """RTE's "with pod fingerprinting enabled" case: one pod default/test-pod-0 -> the precomputed PFP."""
    kubelet = FakePodResources(AllocatableResources(frozenset(range(24)), MINIMAL_DEVICES), [TEST_POD])
    for method in ("with-exclusive-resources", "all"):
        topology = await exporter_for(rte_host, nrt_pods_fingerprint_method=method).snapshot(kubelet)  # type: ignore[arg-type]
        assert topology.attribute("nodeTopologyPodsFingerprint") == "pfp0v001fe53c4dbd2c5f4a0"
        assert topology.attribute("nodeTopologyPodsFingerprintMethod") == method
        assert topology.attribute("topologyManagerPolicy") == "single-numa-node"
        assert topology.attribute("topologyManagerScope") == "pod"


# --- CPUs -----------------------------------------------------------------------------------------


def shared_pod(name: str) -> PodResources:
    """A best-effort, burstable or fractional-CPU pod: the kubelet lists it with no exclusive CPUs."""
    return PodResources("ns", name, (ContainerResources("c", frozenset()),))


def test_only_exclusive_cpus_lower_available() -> None:
    allocatable = AllocatableResources(frozenset(range(24)))
    idle = compute_zones(RTE_NUMA, allocatable, [])
    assert compute_zones(RTE_NUMA, allocatable, [shared_pod("be"), shared_pod("half-cpu")]) == idle
    busy = compute_zones(
        RTE_NUMA, allocatable, [PodResources("ns", "g", (ContainerResources("c", frozenset({0, 2, 3})),))]
    )
    assert [z.resource("cpu") for z in busy] == [
        ResourceInfo("cpu", 12, 12, 10),
        ResourceInfo("cpu", 12, 12, 11),
    ]


def test_pod_level_cpus_are_not_counted_twice() -> None:
    """With pod-level resource managers the container CPUs are a subset of the pod's (reference §1.4)."""
    pod = PodResources(
        "ns", "p", (ContainerResources("c", frozenset({0, 2})),), cpu_ids=frozenset({0, 2, 4, 6})
    )
    zones = compute_zones(RTE_NUMA, AllocatableResources(frozenset(range(24))), [pod])
    assert zones[0].resource("cpu") == ResourceInfo("cpu", 12, 12, 8)


def test_cpu_is_present_on_a_node_without_cpus() -> None:
    memory_only = NumaNode(2, frozenset(), 8 * GIB, 0, (), {0: 30, 1: 30, 2: 10})
    zones = compute_zones([*RTE_NUMA, memory_only], AllocatableResources(frozenset(range(24))), [])
    assert zones[2].resource("cpu") == ResourceInfo("cpu", 0, 0, 0)


# --- memory ---------------------------------------------------------------------------------------


def numa_with_memory(memory: int = 16 * GIB, pages_2m: int = 512) -> list[NumaNode]:
    return [
        NumaNode(n.id, n.cpus, memory, 0, (Hugepages(2048, pages_2m, pages_2m),), n.distances)
        for n in RTE_NUMA
    ]


def block(kind: str, size: int, *nodes: int) -> MemoryBlock:
    return MemoryBlock(kind, size, frozenset(nodes))


def mem_pod(name: str, *blocks: MemoryBlock) -> PodResources:
    return PodResources("ns", name, (ContainerResources("c", frozenset(), memory=blocks),))


STATIC_ALLOCATABLE = AllocatableResources(
    frozenset(range(24)),
    memory=(
        block("memory", 10 * GIB, 0),
        block("memory", 10 * GIB, 1),
        block("hugepages-2Mi", GIB, 0),
        block("hugepages-2Mi", GIB, 1),
    ),
)


def test_memory_capacity_comes_from_sysfs_and_allocatable_from_the_memory_manager() -> None:
    zones = compute_zones(numa_with_memory(), STATIC_ALLOCATABLE, [mem_pod("p", block("memory", 3 * GIB, 1))])
    assert zones[0].resource("memory") == ResourceInfo("memory", 16 * GIB, 10 * GIB, 10 * GIB)
    assert zones[1].resource("memory") == ResourceInfo("memory", 16 * GIB, 10 * GIB, 7 * GIB)
    assert zones[1].resource("hugepages-2Mi") == ResourceInfo("hugepages-2Mi", GIB, GIB, GIB)


@pytest.mark.parametrize(
    "blocks",
    [
        [block("memory", 12 * GIB, 0, 1)],
        [block("memory", 6 * GIB, 0, 1), block("memory", 6 * GIB, 0, 1)],
        [block("memory", 2 * GIB, 0, 1), block("memory", 10 * GIB, 0, 1)],
    ],
    ids=["one block", "two halves", "small then large"],
)
def test_multi_numa_block_is_split_like_the_memory_manager_books_it(blocks: list[MemoryBlock]) -> None:
    """12 GiB over nodes {0,1} with 10 GiB allocatable each: node 0 is filled first, node 1 holds the rest.
    The total taken is the block size (RTE takes 12 GiB from each node), whatever the block order."""
    zones = compute_zones(
        numa_with_memory(), STATIC_ALLOCATABLE, [mem_pod(f"p{i}", b) for i, b in enumerate(blocks)]
    )
    assert [z.resource("memory").available for z in zones] == [0, 8 * GIB]  # type: ignore[union-attr]


def test_single_numa_bookings_come_before_a_group_fills_a_node() -> None:
    pods = [mem_pod("group", block("memory", 9 * GIB, 0, 1)), mem_pod("single", block("memory", 4 * GIB, 0))]
    zones = compute_zones(numa_with_memory(), STATIC_ALLOCATABLE, list(reversed(pods)))
    assert [z.resource("memory").available for z in zones] == [0, 7 * GIB]  # type: ignore[union-attr]
    assert compute_zones(numa_with_memory(), STATIC_ALLOCATABLE, pods) == zones


def test_pod_level_memory_replaces_the_containers_blocks() -> None:
    inner = block("memory", 2 * GIB, 0)
    pod = PodResources(
        "ns",
        "p",
        (ContainerResources("c", frozenset(), memory=(inner,)),),
        memory=(block("memory", 3 * GIB, 0),),
    )
    zones = compute_zones(numa_with_memory(), STATIC_ALLOCATABLE, [pod])
    assert zones[0].resource("memory").available == 7 * GIB  # type: ignore[union-attr]


def test_without_the_static_memory_manager_all_memory_is_allocatable() -> None:
    """No memory blocks from the kubelet: memory is still published (the scheduler rejects pods asking for
    a native resource no zone has), hugepages as capacity, regular memory less the hugepages."""
    zones = compute_zones(numa_with_memory(16 * GIB, 512), AllocatableResources(frozenset(range(24))), [])
    assert zones[0].resource("memory") == ResourceInfo("memory", 16 * GIB, 15 * GIB, 15 * GIB)
    assert zones[0].resource("hugepages-2Mi") == ResourceInfo("hugepages-2Mi", GIB, GIB, GIB)


def test_a_type_the_static_memory_manager_leaves_out_has_nothing_allocatable() -> None:
    only_memory = AllocatableResources(frozenset(range(24)), memory=STATIC_ALLOCATABLE.memory[:2])
    zones = compute_zones(numa_with_memory(), only_memory, [])
    assert zones[0].resource("hugepages-2Mi") == ResourceInfo("hugepages-2Mi", GIB, 0, 0)


# --- devices and cache ways -----------------------------------------------------------------------


def test_a_device_on_two_numa_nodes_counts_in_both_and_is_taken_from_both() -> None:
    nic = DeviceAssignment("example.com/nic", ("nic0",), frozenset({0, 1}))
    orphan = dev("example.com/nic", "nic-no-topology", None)
    allocatable = AllocatableResources(frozenset(range(24)), (nic, orphan))
    assert [z.resource("example.com/nic") for z in compute_zones(RTE_NUMA, allocatable, [])] == [
        ResourceInfo("example.com/nic", 1, 1, 1)
    ] * 2
    holder = PodResources(
        "ns", "p", (ContainerResources("c", frozenset(), (dev("example.com/nic", "nic0", 0),)),)
    )
    zones = compute_zones(RTE_NUMA, allocatable, [holder])
    assert [z.resource("example.com/nic") for z in zones] == [ResourceInfo("example.com/nic", 1, 1, 0)] * 2


def test_cache_ways_per_zone_follow_the_l3_domain_of_its_cpus() -> None:
    caches = [
        CacheWays(0, frozenset(range(0, 24, 2)), 11, 6, (Holding(frozenset({0, 2}), 4),)),
        CacheWays(1, frozenset(range(1, 24, 2)), 11, 6),
    ]
    zones = compute_zones(RTE_NUMA, AllocatableResources(frozenset(range(24))), [], caches)
    assert [z.resource(CACHE_WAYS_RESOURCE) for z in zones] == [
        ResourceInfo(CACHE_WAYS_RESOURCE, 11, 6, 2),
        ResourceInfo(CACHE_WAYS_RESOURCE, 11, 6, 6),
    ]


def test_a_zone_spanning_two_l3_domains_reports_the_tighter_one() -> None:
    caches = [
        CacheWays(0, frozenset({0, 2, 4}), 11, 8, (Holding(frozenset({2}), 3),)),
        CacheWays(1, frozenset({6, 8}), 12, 7),
    ]
    zones = compute_zones(RTE_NUMA, AllocatableResources(frozenset(range(24))), [], caches)
    assert zones[0].resource(CACHE_WAYS_RESOURCE) == ResourceInfo(CACHE_WAYS_RESOURCE, 11, 7, 5)
    assert zones[1].resource(CACHE_WAYS_RESOURCE) is None  # no cache information for its CPUs


def test_computed_cache_ways_replace_device_plugin_ways_of_the_same_name() -> None:
    ways = tuple(dev(CACHE_WAYS_RESOURCE, f"w{i}", 0) for i in range(4))
    caches = [CacheWays(0, RTE_NUMA[0].cpus, 11, 11, (Holding(frozenset({0}), 2),))]
    zones = compute_zones(RTE_NUMA, AllocatableResources(frozenset(range(24)), ways), [], caches)
    assert zones[0].resource(CACHE_WAYS_RESOURCE) == ResourceInfo(CACHE_WAYS_RESOURCE, 11, 11, 9)


# --- exclusions and the object --------------------------------------------------------------------


def test_exclusions_take_names_globs_and_node_prefixes() -> None:
    assert node_exclusions(
        ["memory", "worker-1:hugepages-*", "worker-2:cpu", "*:example.com/x"], "worker-1"
    ) == (
        "memory",
        "hugepages-*",
        "example.com/x",
    )
    assert is_excluded("hugepages-1Gi", ["hugepages-*"]) and not is_excluded("memory", ["hugepages-*"])
    zones = compute_zones(numa_with_memory(), STATIC_ALLOCATABLE, [], exclude=["memory", "hugepages-*"])
    assert [[r.name for r in z.resources] for z in zones] == [["cpu"], ["cpu"]]


def test_attributes_are_the_kubelet_topology_manager_values_and_sorted() -> None:
    topology = NodeTopology.of(
        (), topology_attributes(KubeletConfig(topology_manager_policy="restricted"), "pfp0v001x", "all")
    )
    assert topology.content()["attributes"] == [
        {"name": "nodeTopologyPodsFingerprint", "value": "pfp0v001x"},
        {"name": "nodeTopologyPodsFingerprintMethod", "value": "all"},
        {"name": "topologyManagerPolicy", "value": "restricted"},
        {"name": "topologyManagerScope", "value": "container"},
    ]
    assert "topologyPolicies" not in topology.content()


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (12, "12"),
        (1000, "1k"),
        (1500, "1500"),
        (33554432000, "33554432k"),
        (2147483648, "2147483648"),
        (16 * 10**9, "16G"),
        (10**18, "1E"),
        (-2000, "-2k"),
    ],
)
def test_quantities_are_canonical_decimal_si(value: int, text: str) -> None:
    assert decimal_si(value) == text
    assert parse_integer_quantity(text) == value


# --- properties -----------------------------------------------------------------------------------

cpu_sets = st.frozensets(st.integers(0, 15), max_size=16)


@st.composite
def node_states(
    draw: st.DrawFn,
) -> tuple[list[NumaNode], AllocatableResources, list[PodResources], list[CacheWays]]:
    count = draw(st.integers(1, 4))
    ids = sorted(draw(st.sets(st.integers(0, 7), min_size=count, max_size=count)))
    cpus = {i: frozenset(c for c in range(16) if c % count == k) for k, i in enumerate(ids)}
    numa = [
        NumaNode(
            i,
            cpus[i],
            draw(st.integers(0, 64)) * GIB,
            0,
            tuple(Hugepages(2048, n, n) for n in [draw(st.integers(0, 1024))]),
            {j: 10 if j == i else 20 for j in ids},
        )
        for i in ids
    ]
    kinds = st.sampled_from(["memory", "hugepages-2Mi"])
    memory = tuple(block(draw(kinds), draw(st.integers(0, 32)) * GIB, i) for i in ids if draw(st.booleans()))
    devices = tuple(
        dev("example.com/dev", f"d{k}", draw(st.sampled_from(ids))) for k in range(draw(st.integers(0, 5)))
    )
    allocatable = AllocatableResources(draw(cpu_sets), devices, memory)
    pods = [
        PodResources(
            "ns",
            f"p{k}",
            (
                ContainerResources(
                    "c",
                    draw(cpu_sets),
                    tuple(
                        dev("example.com/dev", f"d{j}", draw(st.sampled_from(ids)))
                        for j in draw(st.sets(st.integers(0, 6), max_size=3))
                    )
                    + tuple(
                        dev(CACHE_WAYS_RESOURCE, f"l3-{c}-way-{w}", draw(st.sampled_from(ids)))
                        for c, w in draw(
                            st.sets(st.tuples(st.integers(0, 1), st.integers(0, 20)), max_size=4)
                        )
                    ),
                    tuple(
                        block(
                            draw(kinds),
                            draw(st.integers(0, 40)) * GIB,
                            *draw(st.sets(st.sampled_from(ids), min_size=1)),
                        )
                        for _ in range(draw(st.integers(0, 2)))
                    ),
                ),
            ),
        )
        for k in range(draw(st.integers(0, 4)))
    ]
    caches = [
        CacheWays(
            k,
            draw(cpu_sets),
            draw(st.integers(1, 20)),
            draw(st.integers(0, 25)),
            tuple(Holding(draw(cpu_sets), draw(st.integers(0, 8))) for _ in range(draw(st.integers(0, 3)))),
        )
        for k in range(draw(st.integers(0, 2)))
    ]
    return numa, allocatable, pods, caches


@settings(max_examples=150, deadline=None)
@given(node_states(), st.randoms(use_true_random=False))
def test_any_state_gives_ordered_sane_and_deterministic_zones(
    state: tuple[list[NumaNode], AllocatableResources, list[PodResources], list[CacheWays]],
    rnd: random.Random,
) -> None:
    numa, allocatable, pods, caches = state
    zones = compute_zones(numa, allocatable, pods, caches)
    assert [z.numa_id for z in zones] == sorted(n.id for n in numa)
    for z in zones:
        names = [r.name for r in z.resources]
        assert names == sorted(names) and len(set(names)) == len(names) and "cpu" in names
        assert [i for i, _ in z.costs] == sorted(i for i, _ in z.costs)
        for r in z.resources:
            assert r.capacity >= r.allocatable >= r.available >= 0, r
    shuffled = (
        rnd.sample(numa, len(numa)),
        allocatable,
        rnd.sample(pods, len(pods)),
        rnd.sample(caches, len(caches)),
    )
    again = compute_zones(*shuffled)
    assert json.dumps(rendered(again)).encode() == json.dumps(rendered(zones)).encode()
