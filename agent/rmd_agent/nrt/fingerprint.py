"""The pod-set fingerprint (PFP) the scheduler uses to tell whether its view of a node's pods matches ours.

Algorithm `v001` of k8stopologyawareschedwg/podfingerprint (reference notes numa-topology-podresources.md
§3.3): each pod hashes to XXH64(name, seed=XXH64(namespace)); the sorted hashes, as little-endian uint64s,
are hashed again with XXH64; the result is written as 16 hex digits after "pfp0v001". Order of the pods does
not matter, duplicates do (the upstream library does not deduplicate either).

Pod selection (`method`): "all" pods, or only those "with-exclusive-resources". The value is only useful if
the scheduler computes the same one: the NodeResourceTopologyMatch plugin recomputes it from the pod specs
it sees (scheduler-plugins `resourcerequests.AreExclusiveForPod`; reference numa-scheduler-interop.md) and
resyncs its cache for the node only while both agree. It counts a pod when a regular or restartable
("sidecar") init container requests

* a non-native resource (one with a domain outside *kubernetes.io/) that the NodeResourceTopology lists,
  whatever the pod's QoS class; or
* in a Guaranteed pod: an integral CPU quantity, memory, or hugepages.

Every container of a Guaranteed pod has memory limits > 0 equal to its requests (Kubernetes' QoS rules), so
the second case is just "the pod is Guaranteed". The agent sees no pod specs, so it decides from what the
kubelet exposes on the node (`counts_for_scheduler`): the QoS class of the pod (from the cgroup the kubelet
placed it in, nrt/pod_qos.py) and the devices PodResources reports for its containers (which, like the
scheduler, covers regular and sidecar containers and skips plain init containers). For a pod whose QoS class
is unknown, it falls back to the resource-topology-exporter rule (`has_exclusive_resources`): some container
holds exclusive CPUs, NUMA-bound memory, or devices with a NUMA node.

Known gap: a pod with pod-level resources (`spec.resources`, PodLevelResources) takes its QoS class from them,
so it can be Guaranteed while its containers request nothing; the scheduler then does not count it and we do.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterable, Mapping

import xxhash

from rmd_agent.kubelet.podresources import PodResources
from rmd_agent.power.cgroup_paths import QoS

PREFIX = "pfp0"
VERSION = "v001"
ATTRIBUTE = "nodeTopologyPodsFingerprint"
ATTRIBUTE_METHOD = "nodeTopologyPodsFingerprintMethod"
ANNOTATION = "topology.node.k8s.io/fingerprint"  # legacy location; the scheduler still reads it as fallback
METHOD_ALL = "all"
METHOD_EXCLUSIVE = "with-exclusive-resources"
METHODS = (METHOD_ALL, METHOD_EXCLUSIVE)

PodKey = tuple[str, str]  # (namespace, name): what PodResources identifies a pod by


def pod_hash(namespace: str, name: str) -> int:
    return xxhash.xxh64_intdigest(name.encode(), seed=xxhash.xxh64_intdigest(namespace.encode()))


def fingerprint(pods: Iterable[PodKey]) -> str:
    """The PFP of (namespace, name) pairs."""
    hashes = sorted(pod_hash(namespace, name) for namespace, name in pods)
    digest = xxhash.xxh64_intdigest(b"".join(struct.pack("<Q", h) for h in hashes))
    return f"{PREFIX}{VERSION}{digest:016x}"


def is_native_resource(name: str) -> bool:
    """Kubernetes' native resources (`IsNativeResource`): names without a domain (cpu, memory, hugepages-2Mi)
    or in a *kubernetes.io/ domain. Everything else is an extended resource (device plugins, ...)."""
    return "/" not in name or "kubernetes.io/" in name


def has_exclusive_resources(pod: PodResources) -> bool:
    """Whether the pod holds something NUMA-bound (podfingerprint's numalocality rule, RTE's selection)."""
    if pod.cpu_ids or any(block.numa_nodes for block in pod.memory):
        return True
    return any(
        c.cpu_ids
        or any(block.numa_nodes for block in c.memory)
        or any(d.ids and d.numa_nodes for d in c.devices)
        for c in pod.containers
    )


def holds_listed_device(pod: PodResources, nrt_resources: Collection[str]) -> bool:
    """Whether a container holds devices of an extended resource the NodeResourceTopology lists."""
    return any(
        d.ids and d.resource in nrt_resources and not is_native_resource(d.resource)
        for c in pod.containers
        for d in c.devices
    )


def counts_for_scheduler(pod: PodResources, qos: QoS | None, nrt_resources: Collection[str]) -> bool:
    """Whether the scheduler counts the pod with method with-exclusive-resources (module docstring).

    `qos`: the pod's QoS class, None when unknown (then the PodResources rule decides); `nrt_resources`:
    every resource name in the NodeResourceTopology's zones.
    """
    if holds_listed_device(pod, nrt_resources):
        return True
    if qos is None:
        return has_exclusive_resources(pod)
    return qos is QoS.GUARANTEED


def pods_fingerprint(
    pods: Iterable[PodResources],
    method: str,
    qos: Mapping[PodKey, QoS] | None = None,
    nrt_resources: Collection[str] = (),
) -> str:
    """The PFP of the pods the method selects. `qos` maps (namespace, name) to the pod's QoS class (pods
    missing from it are decided by the PodResources rule); `nrt_resources` are the resource names the
    NodeResourceTopology lists. ValueError for an unknown method."""
    if method not in METHODS:
        raise ValueError(f"unknown pod fingerprint method {method!r}; use one of {', '.join(METHODS)}")
    known = qos or {}
    chosen = (
        p
        for p in pods
        if method == METHOD_ALL or counts_for_scheduler(p, known.get((p.namespace, p.name)), nrt_resources)
    )
    return fingerprint((p.namespace, p.name) for p in chosen)
