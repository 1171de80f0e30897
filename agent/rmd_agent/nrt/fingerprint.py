"""The pod-set fingerprint (PFP) the scheduler uses to tell whether its view of a node's pods matches ours.

Algorithm `v001` of k8stopologyawareschedwg/podfingerprint (reference notes numa-topology-podresources.md
§3.3): each pod hashes to XXH64(name, seed=XXH64(namespace)); the sorted hashes, as little-endian uint64s,
are hashed again with XXH64; the result is written as 16 hex digits after "pfp0v001". Order of the pods does
not matter, duplicates do (the upstream library does not deduplicate either).

Pod selection (`method`): "all" pods, or only those "with-exclusive-resources" (RTE's default, and what the
scheduler assumes when the method attribute says so): a pod counts when some container holds exclusive
CPUs, NUMA-bound memory, or devices with a NUMA node.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import xxhash

from rmd_agent.kubelet.podresources import PodResources

PREFIX = "pfp0"
VERSION = "v001"
ATTRIBUTE = "nodeTopologyPodsFingerprint"
ATTRIBUTE_METHOD = "nodeTopologyPodsFingerprintMethod"
ANNOTATION = "topology.node.k8s.io/fingerprint"  # legacy location; the scheduler still reads it as fallback
METHOD_ALL = "all"
METHOD_EXCLUSIVE = "with-exclusive-resources"
METHODS = (METHOD_ALL, METHOD_EXCLUSIVE)


def pod_hash(namespace: str, name: str) -> int:
    return xxhash.xxh64_intdigest(name.encode(), seed=xxhash.xxh64_intdigest(namespace.encode()))


def fingerprint(pods: Iterable[tuple[str, str]]) -> str:
    """The PFP of (namespace, name) pairs."""
    hashes = sorted(pod_hash(namespace, name) for namespace, name in pods)
    digest = xxhash.xxh64_intdigest(b"".join(struct.pack("<Q", h) for h in hashes))
    return f"{PREFIX}{VERSION}{digest:016x}"


def has_exclusive_resources(pod: PodResources) -> bool:
    """Whether the pod holds something NUMA-bound (podfingerprint's numalocality rule)."""
    if pod.cpu_ids or any(block.numa_nodes for block in pod.memory):
        return True
    return any(
        c.cpu_ids
        or any(block.numa_nodes for block in c.memory)
        or any(d.ids and d.numa_nodes for d in c.devices)
        for c in pod.containers
    )


def pods_fingerprint(pods: Iterable[PodResources], method: str) -> str:
    """The PFP of the pods the method selects. ValueError for an unknown method."""
    if method not in METHODS:
        raise ValueError(f"unknown pod fingerprint method {method!r}; use one of {', '.join(METHODS)}")
    chosen = (p for p in pods if method == METHOD_ALL or has_exclusive_resources(p))
    return fingerprint((p.namespace, p.name) for p in chosen)
