"""Pod-set fingerprint (rmd_agent.nrt.fingerprint): the hash against the upstream podfingerprint vectors, and
the pod selection against the scheduler that consumes it.

Hash vectors: the empty set (reference notes §3.3); the `compat-tiny-3pods-1ns` and `compat-small-10pods-3ns`
golden cases of k8stopologyawareschedwg/podfingerprint (testdata/*.txt, *.sign); RTE's resource-scan case
with one pod default/test-pod-0. The 259-pod vector of testdata/pods.json is not reproduced: the reference
gives its result but not its input.

Selection vectors: pod manifests of every mix (reference numa-scheduler-interop.md). For each, a reference
implementation of the scheduler's rule (scheduler-plugins `AreExclusiveForPod` over the pod spec, written
here from its documented behaviour) is compared with the agent's decision, which only sees what the kubelet
exposes: the QoS class (the pod's cgroup) and PodResources (regular and sidecar containers, their devices,
exclusive CPUs). `kubelet_view` plays the kubelet: static CPU manager, no Static memory manager (the
measured setup).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pytest

from rmd_agent.kubelet.podresources import (
    AllocatableResources,
    ContainerResources,
    DeviceAssignment,
    MemoryBlock,
    PodResources,
)
from rmd_agent.nrt.fingerprint import (
    METHOD_ALL,
    METHOD_EXCLUSIVE,
    counts_for_scheduler,
    fingerprint,
    has_exclusive_resources,
    is_native_resource,
    pods_fingerprint,
)
from rmd_agent.nrt.zones import CacheWays, compute_zones
from rmd_agent.observe.numa import NumaNode
from rmd_agent.power.cgroup_paths import QoS
from rmd_api.names import CACHE_WAYS_RESOURCE
from rmd_sim.scheduler_view import container_requests, native, pod_qos, scheduler_counts, steady_containers

TINY = [("production", "jaeger-dpgjk"), ("production", "nginx-rt684"), ("production", "envoy-g9m22")]
SMALL = [
    ("analytics", "controller-69dkj"),
    ("kube-public", "subscriber-tq6v7"),
    ("kube-public", "transformer-hfbng"),
    ("kube-public", "validator-c6pn5"),
    ("kube-system", "proxy-wszrd"),
    ("middleware", "processor-jkrl4"),
    ("network", "gateway-vsll5"),
    ("network", "importer-kzdfr"),
    ("network", "importer-q5vt9"),
    ("staging", "prometheus-bwgbn"),
]


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([], "pfp0v001ef46db3751d8e999"),
        ([("default", "test-pod-0")], "pfp0v001fe53c4dbd2c5f4a0"),
        (TINY, "pfp0v001607b76a0e9d3aeb4"),
        (SMALL, "pfp0v001567144e4a561bb5a"),
    ],
    ids=["empty", "rte-scan", "compat-tiny-3pods-1ns", "compat-small-10pods-3ns"],
)
def test_upstream_vectors(pods: list[tuple[str, str]], expected: str) -> None:
    assert fingerprint(pods) == expected
    assert fingerprint(random.Random(12345).sample(pods, len(pods))) == expected  # order does not matter


def test_identity_is_namespace_and_name() -> None:
    base = fingerprint(TINY)
    assert fingerprint(TINY[:-1]) != base
    assert fingerprint([*TINY, ("staging", "extra")]) != base
    assert fingerprint([("production", "jaeger"), *TINY[1:]]) != base
    assert fingerprint([("prod", "jaeger-dpgjk"), *TINY[1:]]) != base


def pod(name: str, container: ContainerResources, **pod_level: object) -> PodResources:
    return PodResources("ns", name, (container,), **pod_level)  # type: ignore[arg-type]


SHARED = pod("shared", ContainerResources("c", frozenset()))
PINNED = pod("pinned", ContainerResources("c", frozenset({3})))
MEMORY = pod(
    "memory", ContainerResources("c", frozenset(), memory=(MemoryBlock("memory", 1 << 30, frozenset({1})),))
)
NIC = pod(
    "nic",
    ContainerResources("c", frozenset(), (DeviceAssignment("example.com/nic", ("n0",), frozenset({0})),)),
)
NIC_NO_NUMA = pod(
    "nic-anywhere",
    ContainerResources("c", frozenset(), (DeviceAssignment("example.com/nic", ("n1",), frozenset()),)),
)
POD_LEVEL = pod("pod-level", ContainerResources("c", frozenset()), cpu_ids=frozenset({4, 5}))


@pytest.mark.parametrize(
    ("candidate", "exclusive"),
    [(SHARED, False), (PINNED, True), (MEMORY, True), (NIC, True), (NIC_NO_NUMA, False), (POD_LEVEL, True)],
    ids=lambda v: v.name if isinstance(v, PodResources) else str(v),
)
def test_which_pods_hold_exclusive_resources(candidate: PodResources, exclusive: bool) -> None:
    assert has_exclusive_resources(candidate) is exclusive


def test_methods_select_pods() -> None:
    pods = [SHARED, PINNED, NIC, NIC_NO_NUMA]
    assert pods_fingerprint(pods, METHOD_ALL) == fingerprint((p.namespace, p.name) for p in pods)
    assert pods_fingerprint(pods, METHOD_EXCLUSIVE) == fingerprint([("ns", "pinned"), ("ns", "nic")])
    # Shared-pool pods coming and going leave the exclusive fingerprint alone.
    assert pods_fingerprint([PINNED, NIC], METHOD_EXCLUSIVE) == pods_fingerprint(pods, METHOD_EXCLUSIVE)
    with pytest.raises(ValueError, match="unknown pod fingerprint method"):
        pods_fingerprint(pods, "some")


# --- which pods count: the scheduler's rule over pod specs vs ours over what the kubelet exposes ----------

Obj = dict[str, Any]

# The node: device plugins (resource -> NUMA nodes its devices report; empty: no topology) and its NRT.
DEVICE_PLUGINS: dict[str, frozenset[int]] = {
    CACHE_WAYS_RESOURCE: frozenset({0}),  # our device plugin; the NRT lists it (cache ways per zone)
    "example.com/nic": frozenset({1}),  # NUMA-bound: in the NRT
    "example.com/fpga": frozenset(),  # no topology: node-level, not in the NRT
    "example.com/gpu": frozenset({0}),  # NUMA-bound, but left out by nrt_exclude: not in the NRT
}
NUMA = [
    NumaNode(0, frozenset(range(0, 8)), 16 << 30, 8 << 30, (), {0: 10, 1: 21}),
    NumaNode(1, frozenset(range(8, 16)), 16 << 30, 8 << 30, (), {0: 21, 1: 10}),
]


def nrt_resources() -> set[str]:
    """The resource names of the node's NRT zones, computed as the exporter does."""
    devices = tuple(
        DeviceAssignment(name, (f"{name}-{i}",), numa)
        for name, numa in DEVICE_PLUGINS.items()
        for i in range(4)
    )
    zones = compute_zones(
        NUMA,
        AllocatableResources(frozenset(range(16)), devices),
        [],
        [CacheWays(0, frozenset(range(16)), 11, 6)],
        exclude=("example.com/gpu",),
    )
    return {r.name for zone in zones for r in zone.resources}


NRT = nrt_resources()


def test_the_node_lists_the_expected_resources() -> None:
    assert {"cpu", "memory", CACHE_WAYS_RESOURCE, "example.com/nic"} <= NRT
    assert "example.com/fpga" not in NRT and "example.com/gpu" not in NRT


# The scheduler's side (pod specs, Kubernetes' QoS rules, scheduler-plugins' rule): rmd_sim.scheduler_view.


# -- the agent's side: what the kubelet exposes for the pod --

_QOS = {"Guaranteed": QoS.GUARANTEED, "Burstable": QoS.BURSTABLE, "BestEffort": QoS.BESTEFFORT}


def kubelet_view(pod: Obj) -> tuple[QoS, PodResources]:
    """The pod's cgroup QoS class (the API's status.qosClass) and its PodResources List entry: sidecar and
    regular containers only, devices of device-plugin resources, exclusive CPUs for integral CPUs of
    Guaranteed pods (static policy), no memory blocks (memory manager policy None)."""
    qos = pod_qos(pod)
    containers = []
    next_cpu = iter(range(16))
    for container in steady_containers(pod):
        requests = container_requests(container)
        cpu = requests.get("cpu", Fraction(0))
        exclusive = int(cpu) if qos == "Guaranteed" and cpu.denominator == 1 else 0
        devices = tuple(
            DeviceAssignment(
                name, tuple(f"{name}-{container['name']}-{i}" for i in range(int(n))), DEVICE_PLUGINS[name]
            )
            for name, n in sorted(requests.items())
            if name in DEVICE_PLUGINS and n > 0
        )
        cpus = frozenset(next(next_cpu) for _ in range(exclusive))
        containers.append(ContainerResources(container["name"], cpus, devices))
    meta = pod["metadata"]
    return _QOS[qos], PodResources(meta["namespace"], meta["name"], tuple(containers))


def manifest(name: str, *containers: Obj, init: tuple[Obj, ...] = ()) -> Obj:
    spec: Obj = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": {"namespace": "ns", "name": name}, "spec": spec}


def ctr(name: str = "c", requests: Obj | None = None, limits: Obj | None = None, **extra: Any) -> Obj:
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return {"name": name, "resources": resources, **extra}


GIB = "1Gi"
L3 = CACHE_WAYS_RESOURCE


@dataclass(frozen=True)
class Vector:
    pod: Obj
    counts: bool  # what the scheduler decides, written down by hand (the reference is checked against it)

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])


VECTORS = [
    Vector(manifest("guaranteed-integer-cpu", ctr(limits={"cpu": "2", "memory": GIB})), True),
    # The measured bug: no exclusive CPUs, no NUMA memory, but Guaranteed with memory.
    Vector(
        manifest(
            "guaranteed-fractional",
            ctr(requests={"cpu": "500m", "memory": GIB}, limits={"cpu": "500m", "memory": GIB}),
        ),
        True,
    ),
    Vector(
        manifest(
            "guaranteed-1500m-two-containers",
            ctr("a", limits={"cpu": "1500m", "memory": GIB}),
            ctr("b", limits={"cpu": "100m", "memory": "64Mi"}),
        ),
        True,
    ),
    Vector(
        manifest(
            "guaranteed-hugepages", ctr(limits={"cpu": "250m", "memory": GIB, "hugepages-2Mi": "512Mi"})
        ),
        True,
    ),
    Vector(
        manifest(
            "guaranteed-unlisted-device", ctr(limits={"cpu": "1", "memory": GIB, "example.com/fpga": 1})
        ),
        True,
    ),
    Vector(
        manifest(
            "guaranteed-with-init",
            ctr(limits={"cpu": "300m", "memory": GIB}),
            init=(ctr("setup", limits={"cpu": "1", "memory": "128Mi"}),),
        ),
        True,
    ),
    Vector(
        manifest("burstable", ctr(requests={"cpu": "1", "memory": GIB}, limits={"cpu": "2", "memory": GIB})),
        False,
    ),
    Vector(manifest("burstable-integer-cpu-no-memory", ctr(limits={"cpu": "4"})), False),
    Vector(
        manifest(
            "burstable-one-container-guaranteed", ctr("a", limits={"cpu": "2", "memory": GIB}), ctr("b")
        ),
        False,
    ),
    Vector(
        manifest("burstable-ephemeral-storage", ctr(requests={"cpu": "100m", "ephemeral-storage": GIB})),
        False,
    ),
    Vector(manifest("besteffort", ctr()), False),
    Vector(manifest("burstable-cache-ways", ctr(requests={"cpu": "200m"}, limits={L3: 2})), True),
    Vector(manifest("besteffort-cache-ways", ctr(limits={L3: 1})), True),
    Vector(manifest("besteffort-nic", ctr(limits={"example.com/nic": 1})), True),
    # Devices the NRT does not list: node-level (no topology) or excluded although NUMA-bound.
    Vector(manifest("burstable-fpga", ctr(requests={"cpu": "1"}, limits={"example.com/fpga": 1})), False),
    Vector(manifest("besteffort-gpu-excluded", ctr(limits={"example.com/gpu": 1})), False),
    Vector(
        manifest(
            "sidecar-with-cache-ways", ctr(), init=(ctr("proxy", limits={L3: 1}, restartPolicy="Always"),)
        ),
        True,
    ),
    Vector(manifest("init-with-cache-ways", ctr(), init=(ctr("setup", limits={L3: 1}),)), False),
    Vector(
        manifest(
            "burstable-sidecar-nic",
            ctr(requests={"memory": GIB}),
            init=(
                ctr("proxy", requests={"cpu": "100m"}, limits={"example.com/nic": 1}, restartPolicy="Always"),
            ),
        ),
        True,
    ),
]


def vector_id(vector: Vector) -> str:
    return vector.name


@pytest.mark.parametrize("vector", VECTORS, ids=vector_id)
def test_the_reference_rule_gives_the_expected_answer(vector: Vector) -> None:
    assert scheduler_counts(vector.pod, NRT) is vector.counts


@pytest.mark.parametrize("vector", VECTORS, ids=vector_id)
def test_our_decision_from_the_kubelet_view_equals_the_schedulers(vector: Vector) -> None:
    qos, resources = kubelet_view(vector.pod)
    assert counts_for_scheduler(resources, qos, NRT) is scheduler_counts(vector.pod, NRT)
    one = fingerprint([("ns", vector.name)]) if vector.counts else fingerprint([])
    assert pods_fingerprint([resources], METHOD_EXCLUSIVE, {("ns", vector.name): qos}, NRT) == one


def views() -> Iterator[tuple[QoS, PodResources]]:
    return (kubelet_view(v.pod) for v in VECTORS)


def test_the_node_fingerprint_equals_the_schedulers() -> None:
    pods = [resources for _, resources in views()]
    classes = {(r.namespace, r.name): qos for qos, r in views()}
    scheduler = fingerprint(("ns", v.name) for v in VECTORS if scheduler_counts(v.pod, NRT))
    ours = pods_fingerprint(pods, METHOD_EXCLUSIVE, classes, NRT)
    assert ours == scheduler == "pfp0v001a58e5cf634acbf01"
    assert pods_fingerprint(random.Random(7).sample(pods, len(pods)), METHOD_EXCLUSIVE, classes, NRT) == ours
    # RTE's rule (what the agent published before) disagrees: the fractional Guaranteed pods are missing.
    assert pods_fingerprint(pods, METHOD_EXCLUSIVE, {}, NRT) != scheduler
    assert pods_fingerprint(pods, METHOD_ALL, classes, NRT) == fingerprint(("ns", v.name) for v in VECTORS)


def test_the_measured_pod_counts() -> None:
    """A Guaranteed 500m/1Gi pod: the scheduler counted it, the agent did not, and the scheduler's cache for
    the node never resynced (reference numa-scheduler-interop.md)."""
    pod = PodResources("default", "fractional", (ContainerResources("c", frozenset()),))
    assert not has_exclusive_resources(pod)
    assert counts_for_scheduler(pod, QoS.GUARANTEED, NRT)
    assert pods_fingerprint([pod], METHOD_EXCLUSIVE, {("default", "fractional"): QoS.GUARANTEED}, NRT) == (
        fingerprint([("default", "fractional")])
    )


def test_without_a_qos_class_the_podresources_rule_decides() -> None:
    listed_nic = (DeviceAssignment("example.com/nic", ("n0",), frozenset({1})),)
    unlisted_gpu = (DeviceAssignment("example.com/gpu", ("g0",), frozenset({0})),)
    assert counts_for_scheduler(PINNED, None, NRT)
    assert counts_for_scheduler(MEMORY, None, NRT)
    assert not counts_for_scheduler(SHARED, None, NRT)
    assert counts_for_scheduler(pod("nic", ContainerResources("c", frozenset(), listed_nic)), None, NRT)
    # NUMA-bound but not in the NRT: only the fallback counts it (RTE's rule), a known class does not.
    gpu = pod("gpu", ContainerResources("c", frozenset(), unlisted_gpu))
    assert counts_for_scheduler(gpu, None, NRT)
    assert not counts_for_scheduler(gpu, QoS.BURSTABLE, NRT)
    # A listed device without topology counts whatever the class; RTE's rule alone would miss it.
    ways = pod("ways", ContainerResources("c", frozenset(), (DeviceAssignment(L3, ("w0",), frozenset()),)))
    assert not has_exclusive_resources(ways)
    assert counts_for_scheduler(ways, None, NRT) and counts_for_scheduler(ways, QoS.BESTEFFORT, NRT)
    # Pods missing from the class map are decided one by one.
    classes = {("ns", "shared"): QoS.GUARANTEED}
    assert pods_fingerprint([SHARED, PINNED, gpu], METHOD_EXCLUSIVE, classes, NRT) == fingerprint(
        [("ns", "shared"), ("ns", "pinned"), ("ns", "gpu")]
    )


@pytest.mark.parametrize(
    ("name", "is_native"),
    [
        ("cpu", True),
        ("memory", True),
        ("hugepages-1Gi", True),
        ("ephemeral-storage", True),
        ("kubernetes.io/batch-cpu", True),
        ("scheduling.kubernetes.io/foo", True),
        (L3, False),
        ("example.com/nic", False),
    ],
)
def test_native_resources(name: str, is_native: bool) -> None:
    assert is_native_resource(name) is is_native is native(name)


def test_a_native_name_listed_in_the_nrt_is_not_a_device() -> None:
    odd = pod("odd", ContainerResources("c", frozenset(), (DeviceAssignment("memory", ("m",), frozenset()),)))
    assert not counts_for_scheduler(odd, QoS.BURSTABLE, {"memory"})
