"""The simulated kubelet's API-mode admission rules (rmd_sim.kubelet_api), without an API server: pod objects
to container specs, pod requests, the resource-fit predicate and the node's resources."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmd_sim.cpumanager import Topology
from rmd_sim.devicemanager import Device, is_extended_resource_name
from rmd_sim.hosttree import write_host_tree
from rmd_sim.kubelet import AdmissionError, ContainerSpec, SimKubelet
from rmd_sim.kubelet_api import (
    container_specs,
    fit_failure,
    format_quantity,
    node_resources,
    pod_requests,
    read_host_memory,
)
from rmd_sim.spec import GIB, NodeSpec


def pod(*containers: dict[str, object]) -> dict[str, object]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"containers": list(containers)},
    }


def test_container_specs_from_a_pod_object() -> None:
    specs = container_specs(
        pod(
            {
                "name": "app",
                "resources": {
                    "requests": {"cpu": "2", "memory": "1Gi"},
                    "limits": {"cpu": "2", "memory": "1Gi", "intel.com/l3_cache_ways": "3"},
                },
            },
            {"name": "side", "resources": {"requests": {"cpu": "250m", "hugepages-2Mi": "4Mi"}}},
            {"name": "bare"},
        )
    )
    assert specs == (
        ContainerSpec("app", "2", "2", "1Gi", "1Gi", {"intel.com/l3_cache_ways": 3}),
        ContainerSpec("side", "250m", None, None, None, {"hugepages-2Mi": 4 * 2**20}),
        ContainerSpec("bare"),
    )


def test_pod_requests_default_to_limits_and_add_up() -> None:
    specs = [
        ContainerSpec("a", cpu_limit="2", memory_limit="1Gi", resources={"x.io/dev": 2}),
        ContainerSpec("b", cpu_request="250m", memory_request="512Mi", resources={"x.io/dev": 1}),
        ContainerSpec("c"),
    ]
    assert pod_requests(specs) == {"cpu": 2250, "memory": 3 * 2**29, "x.io/dev": 3}


def test_fit_checks_pods_then_every_reported_resource() -> None:
    allocatable = {"cpu": 4000, "memory": 8 * GIB, "pods": 3, "intel.com/l3_cache_ways": 4}
    assert fit_failure({"cpu": 2000, "intel.com/l3_cache_ways": 4}, {"cpu": 2000}, allocatable, 2) is None
    assert fit_failure({"cpu": 2001}, {"cpu": 2000}, allocatable, 0) == (
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 2001, used: 2000, capacity: 4000",
    )
    reason, _ = fit_failure(
        {"intel.com/l3_cache_ways": 2}, {"intel.com/l3_cache_ways": 3}, allocatable, 0
    ) or ("", "")
    assert reason == "OutOfintel.com/l3_cache_ways"
    assert fit_failure({}, {}, allocatable, 3) == (
        "OutOfpods",
        "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3",
    )
    # A resource the node does not report is not checked (cluster-level extended resources).
    assert fit_failure({"example.com/license": 10}, {}, allocatable, 0) is None


@pytest.mark.parametrize(
    ("resource", "value", "text"),
    [
        ("cpu", 16000, "16"),
        ("cpu", 1500, "1500m"),
        ("memory", 64 * GIB, "64Gi"),
        ("memory", 3 * 2**20, "3Mi"),
        ("memory", 1000, "1000"),
        ("hugepages-2Mi", 2 * GIB, "2Gi"),
        ("intel.com/l3_cache_ways", 10, "10"),
    ],
)
def test_quantities_as_the_kubelet_writes_them(resource: str, value: int, text: str) -> None:
    assert format_quantity(resource, value) == text


def test_node_resources_of_a_host_tree(tmp_path: Path) -> None:
    spec = NodeSpec(
        cores_per_socket=4, reserved_cpus="0,8", hugepages_1g_per_numa=2, hugepages_2m_per_numa=512
    )
    write_host_tree(spec, tmp_path)
    memory = read_host_memory(tmp_path)
    assert memory == (
        spec.numa_nodes * spec.memory_per_numa_bytes,
        {"hugepages-2Mi": 2 * 512 * 2 * 2**20, "hugepages-1Gi": 2 * 2 * GIB},
    )
    kubelet = SimKubelet.from_host_tree(tmp_path, devices={"x.io/dev": [Device("d0", 0), Device("d1", 1)]})

    resources = node_resources(kubelet, memory)

    cpus = spec.sockets * spec.cores_per_socket * spec.threads_per_core
    hugepages = 2 * 512 * 2 * 2**20 + 2 * 2 * GIB
    assert resources.capacity["cpu"] == cpus * 1000
    assert resources.allocatable["cpu"] == (cpus - 2) * 1000
    assert resources.capacity["memory"] - resources.allocatable["memory"] == hugepages
    assert resources.capacity["x.io/dev"] == resources.allocatable["x.io/dev"] == 2
    assert resources.capacity["pods"] == 110


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("intel.com/l3_cache_ways", True),
        ("example.com/gpu", True),
        ("l3_cache_ways", False),
        ("kubernetes.io/ways", False),
        ("node.kubernetes.io/ways", False),
        ("intel.com/", False),
    ],
)
def test_extended_resource_names(name: str, ok: bool) -> None:
    assert is_extended_resource_name(name) is ok


# --- the topology manager (single-numa-node) ---

CACHE_WAYS = "intel.com/l3_cache_ways"


def numa_kubelet(root: Path, policy: str) -> SimKubelet:
    """8 CPUs on 2 NUMA nodes (0-3, 4-7), none reserved; 3 cache ways next to each NUMA node."""
    ways = [Device(f"ways-{numa}-{i}", numa) for numa in (0, 1) for i in range(3)]
    topology = Topology.uniform(sockets=2, cores_per_socket=4, threads=1)
    return SimKubelet(root, topology, devices={CACHE_WAYS: ways}, topology_manager_policy=policy)


def app(cpu: str, ways: int, memory: str | None = "1Gi", name: str = "app") -> ContainerSpec:
    return ContainerSpec(name, cpu, cpu, memory, memory, {CACHE_WAYS: ways})


def test_single_numa_node_refuses_what_no_numa_node_holds_like_the_kubelet(tmp_path: Path) -> None:
    kubelet = numa_kubelet(tmp_path, "single-numa-node")
    kubelet.add_pod("ns", "first", "u1", [app("1", 1)])
    state = kubelet.state_path.read_text()
    for containers in ([app("2", 4)], [app("5", 1)], [app("500m", 4, memory=None)]):
        with pytest.raises(AdmissionError) as refused:
            kubelet.add_pod("ns", "big", "u2", containers)
        assert refused.value.reason == "TopologyAffinityError"
        assert str(refused.value) == "Resources cannot be allocated with Topology locality"
        assert [p.name for p in kubelet.pods] == ["first"]  # nothing allocated
        assert kubelet.state_path.read_text() == state


def test_without_a_topology_manager_policy_resources_span_numa_nodes(tmp_path: Path) -> None:
    kubelet = numa_kubelet(tmp_path, "none")  # the kubelet's default: admitted, not aligned
    pod = kubelet.add_pod("ns", "big", "u", [app("2", 4)])
    assert {d.numa for d in pod.devices["app"][CACHE_WAYS]} == {0, 1}


def test_single_numa_node_puts_cpus_and_devices_on_one_node(tmp_path: Path) -> None:
    kubelet = numa_kubelet(tmp_path, "single-numa-node")
    # Node 0 has the CPUs for both containers, but only 3 ways: the second container goes to node 1.
    pod = kubelet.add_pod("ns", "pair", "u", [app("1", 2, name="a"), app("1", 2, name="b")])
    for container, numa in (("a", 0), ("b", 1)):
        assert {kubelet.topology.cpu(c).numa for c in pod.cpus[container]} == {numa}
        assert {d.numa for d in pod.devices[container][CACHE_WAYS]} == {numa}
    # Shared-pool CPUs do not count, the ways do: one left on each node, so 2 cannot be had, 1 can.
    with pytest.raises(AdmissionError, match="Topology locality"):
        kubelet.add_pod("ns", "shared", "u-s", [app("500m", 2, memory=None)])
    shared = kubelet.add_pod("ns", "shared", "u-s", [app("500m", 1, memory=None)])
    assert shared.cpus == {} and [d.numa for d in shared.devices["app"][CACHE_WAYS]] == [0]


def test_the_policy_comes_from_the_host_trees_kubelet_config(tmp_path: Path) -> None:
    write_host_tree(NodeSpec(cores_per_socket=4), tmp_path)
    assert SimKubelet.from_host_tree(tmp_path).topology_manager_policy == "single-numa-node"
    assert (
        SimKubelet.from_host_tree(tmp_path, topology_manager_policy="none").topology_manager_policy == "none"
    )
