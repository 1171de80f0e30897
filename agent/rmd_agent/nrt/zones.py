"""NUMA zones of a NodeResourceTopology, computed from observed state (pure: no I/O).

Per NUMA node, one zone `node-<id>` of type `Node`, with costs from the sysfs distance row and these
resources (reference notes numa-topology-podresources.md §3; docs/topology.md):

* `cpu`: capacity = the node's CPUs (sysfs), allocatable = those the kubelet may hand out
  (GetAllocatableResources: all CPUs minus the reserved ones), available = allocatable minus CPUs held
  *exclusively* by pods (PodResources List reports only exclusive CPUs, so shared-pool and fractional-CPU
  pods never lower it). Always present, even on a CPU-less node, because the scheduler needs it.
* `memory`, `hugepages-<size>`: capacity from sysfs (MemTotal; pages x page size). Allocatable from the
  memory manager's blocks in GetAllocatableResources. A kubelet without the Static memory manager reports
  none: then allocatable = capacity (regular memory minus the node's hugepages), because no pod can pin
  memory and the scheduler rejects pods asking for a native resource missing from every zone.
  A multi-NUMA memory block is split the way the memory manager books it (`updateMachineState`): the
  lowest-numbered node of the block's group first, up to what is left of its allocatable memory, then the
  next; what no node can hold stays on the last. RTE adds the whole block to every node of the group,
  which counts it several times.
* devices: one count per device id per NUMA node the kubelet associates with it (healthy devices only);
  devices without topology are node-level and left out. A device a container holds is taken from every zone
  that lists it.
* `intel.com/l3_cache_ways` (ours): capacity = ways of the zone's L3; allocatable = its guaranteed pool
  (rmd_agent.cache_ways, the devices the device plugin advertises for that cache); available = the pool
  minus the ways in use there, by the kubelet's books (devices containers hold) and the engine's (guaranteed
  workloads), a container's devices and its workload counted once. A zone spanning several L3 domains gets
  the smallest values of them, so the scheduler never over-promises.

Available is floored at 0 and capped at allocatable; capacity is raised to allocatable when the kubelet
reports more than sysfs. Zones are in NUMA id order, costs likewise, resources by name, so equal inputs
give identical objects (and no writes).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from rmd_agent.cache_ways import Holding, device_holdings, ways_in_use
from rmd_agent.kubelet.podresources import AllocatableResources, MemoryBlock, PodResources
from rmd_agent.nrt.quantity import decimal_si
from rmd_agent.observe.numa import NumaNode
from rmd_api.names import CACHE_WAYS_RESOURCE

ZONE_TYPE_NODE = "Node"
CPU = "cpu"
MEMORY = "memory"
ATTRIBUTE_TM_POLICY = "topologyManagerPolicy"
ATTRIBUTE_TM_SCOPE = "topologyManagerScope"


def zone_name(numa_id: int) -> str:
    return f"node-{numa_id}"


@dataclass(frozen=True, order=True)
class ResourceInfo:
    name: str
    capacity: int
    allocatable: int
    available: int

    def as_dict(self) -> dict[str, str]:
        return {
            "name": self.name,
            "capacity": decimal_si(self.capacity),
            "allocatable": decimal_si(self.allocatable),
            "available": decimal_si(self.available),
        }


@dataclass(frozen=True)
class Zone:
    numa_id: int
    costs: tuple[tuple[int, int], ...]  # (NUMA id, distance), by id
    resources: tuple[ResourceInfo, ...]  # by name

    @property
    def name(self) -> str:
        return zone_name(self.numa_id)

    def resource(self, name: str) -> ResourceInfo | None:
        return next((r for r in self.resources if r.name == name), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": ZONE_TYPE_NODE,
            "costs": [{"name": zone_name(i), "value": d} for i, d in self.costs],
            "resources": [r.as_dict() for r in self.resources],
        }


@dataclass(frozen=True)
class CacheWays:
    """One L3 cache domain as the cache-ways resource shows it; the engine knows the allocations, the pods
    (PodResources) the devices the kubelet handed out."""

    cache_id: int
    cpus: frozenset[int]
    capacity: int  # ways of the cache
    allocatable: int  # ways guaranteed workloads may be given (the guaranteed pool)
    workloads: tuple[Holding, ...] = ()  # what the engine's guaranteed workloads hold on this cache


def is_excluded(name: str, patterns: Iterable[str]) -> bool:
    """Whether a resource name matches an exclusion: an exact name or a glob such as `hugepages-*`."""
    return any(fnmatchcase(name, p) for p in patterns)


def _resource(name: str, capacity: int, allocatable: int, available: int) -> ResourceInfo:
    allocatable = max(0, allocatable)
    return ResourceInfo(name, max(capacity, allocatable), allocatable, min(allocatable, max(0, available)))


def _pod_memory(pod: PodResources) -> tuple[MemoryBlock, ...]:
    # With pod-level resource managers the pod's blocks already hold its containers' (reference §1.4).
    return pod.memory or tuple(b for c in pod.containers for b in c.memory)


def _split_evenly(size: int, nodes: Sequence[int]) -> dict[int, int]:
    share, extra = divmod(size, len(nodes))
    return {n: share + (1 if i < extra else 0) for i, n in enumerate(nodes)}


def _memory_allocatable(
    numa: Sequence[NumaNode], capacity: Mapping[int, Mapping[str, int]], blocks: Sequence[MemoryBlock]
) -> dict[int, dict[str, int]]:
    allocatable: dict[int, dict[str, int]] = {n.id: {} for n in numa}
    for block in blocks:
        if not block.numa_nodes:
            continue
        # The kubelet sends one block per (NUMA node, type); split anything else evenly rather than guess.
        for node, size in _split_evenly(block.size, sorted(block.numa_nodes)).items():
            if node in allocatable:
                allocatable[node][block.memory_type] = allocatable[node].get(block.memory_type, 0) + size
    if blocks:
        return allocatable  # the Static memory manager; a type it leaves out has nothing allocatable
    # No Static memory manager: nothing can be pinned, so all of it is usable (regular memory less hugepages).
    for numa_node in numa:
        sizes = capacity[numa_node.id]
        hugepage_bytes = sum(v for k, v in sizes.items() if k != MEMORY)
        for kind, total in sizes.items():
            allocatable[numa_node.id][kind] = max(0, total - hugepage_bytes) if kind == MEMORY else total
    return allocatable


def _memory_used(
    allocatable: Mapping[int, Mapping[str, int]], pods: Sequence[PodResources]
) -> dict[int, dict[str, int]]:
    used: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    groups: dict[tuple[str, tuple[int, ...]], int] = defaultdict(int)
    for pod in pods:
        for block in _pod_memory(pod):
            nodes = tuple(sorted(n for n in block.numa_nodes if n in allocatable))
            if len(nodes) == 1:
                used[nodes[0]][block.memory_type] += block.size
            elif nodes:
                groups[(block.memory_type, nodes)] += block.size
    # The memory manager keeps multi-NUMA groups disjoint from single-node use, and fills a group's nodes
    # in ascending order, so summing a group's blocks and filling once gives its bookkeeping in any order.
    for (kind, nodes), total in sorted(groups.items()):
        for node in nodes:
            free = max(0, allocatable[node].get(kind, 0) - used[node][kind])
            take = total if node == nodes[-1] else min(total, free)
            used[node][kind] += take
            total -= take
    return {n: dict(v) for n, v in used.items()}


def _device_counts(
    numa_ids: Iterable[int], allocatable: AllocatableResources, pods: Sequence[PodResources]
) -> dict[int, list[ResourceInfo]]:
    per_node: dict[int, dict[str, set[str]]] = {n: defaultdict(set) for n in numa_ids}
    for device in allocatable.devices:
        for node in device.numa_nodes:
            if node in per_node:
                per_node[node][device.resource].update(device.ids)
    held: dict[str, set[str]] = defaultdict(set)
    for pod in pods:
        for container in pod.containers:
            for device in container.devices:
                held[device.resource].update(device.ids)
    return {
        node: [_resource(name, len(ids), len(ids), len(ids - held[name])) for name, ids in resources.items()]
        for node, resources in per_node.items()
    }


def _cache_ways(
    node: NumaNode, caches: Sequence[CacheWays], devices: Mapping[int, Sequence[Holding]]
) -> ResourceInfo | None:
    domains = [c for c in caches if c.cpus & node.cpus]
    if not domains:
        return None
    capacity = min(c.capacity for c in domains)
    allocatable = min(capacity, *(c.allocatable for c in domains))
    available = min(c.allocatable - ways_in_use(c.workloads, devices.get(c.cache_id, ())) for c in domains)
    return _resource(CACHE_WAYS_RESOURCE, capacity, allocatable, available)


def compute_zones(
    numa: Sequence[NumaNode],
    allocatable: AllocatableResources,
    pods: Sequence[PodResources],
    caches: Sequence[CacheWays] = (),
    exclude: Iterable[str] = (),
) -> tuple[Zone, ...]:
    """The zones of a node. `exclude` holds resource names or globs to leave out (e.g. "memory")."""
    exclude = tuple(exclude)
    numa = sorted(numa, key=lambda n: n.id)
    exclusive_cpus = frozenset().union(
        *(p.cpu_ids for p in pods), *(c.cpu_ids for p in pods for c in p.containers)
    )
    mem_capacity = {
        n.id: {
            MEMORY: n.memory_total_bytes,
            **{h.resource_name: h.total * h.size_kb * 1024 for h in n.hugepages},
        }
        for n in numa
    }
    mem_allocatable = _memory_allocatable(numa, mem_capacity, allocatable.memory)
    mem_used = _memory_used(mem_allocatable, pods)
    reported_kinds = {b.memory_type for b in allocatable.memory}
    devices = _device_counts((n.id for n in numa), allocatable, pods)
    ways_held = device_holdings(pods)

    zones = []
    for node in numa:
        cpus = allocatable.cpu_ids & node.cpus
        resources: dict[str, ResourceInfo] = {
            CPU: _resource(CPU, len(node.cpus), len(cpus), len(cpus - exclusive_cpus))
        }
        kinds = set(mem_allocatable[node.id]) | set(mem_capacity[node.id])
        for kind in kinds:
            capacity = mem_capacity[node.id].get(kind, 0)
            if capacity or kind in reported_kinds:
                alloc = mem_allocatable[node.id].get(kind, 0)
                used = mem_used.get(node.id, {}).get(kind, 0)
                resources[kind] = _resource(kind, capacity, alloc, alloc - used)
        resources.update((d.name, d) for d in devices[node.id])
        cache = _cache_ways(node, caches, ways_held)
        if cache is not None:  # replaces the kubelet's count of the plugin's devices: a zone is not a cache
            resources[cache.name] = cache
        zones.append(
            Zone(
                node.id,
                tuple(sorted(node.distances.items())),
                tuple(sorted(r for r in resources.values() if not is_excluded(r.name, exclude))),
            )
        )
    return tuple(zones)


@dataclass(frozen=True)
class NodeTopology:
    """The content of a NodeResourceTopology: zones and node-wide attributes (metadata is the publisher's)."""

    zones: tuple[Zone, ...]
    attributes: tuple[tuple[str, str], ...]  # (name, value), by name

    @classmethod
    def of(cls, zones: Sequence[Zone], attributes: Mapping[str, str]) -> NodeTopology:
        return cls(tuple(zones), tuple(sorted(attributes.items())))

    def attribute(self, name: str) -> str | None:
        return dict(self.attributes).get(name)

    def content(self) -> dict[str, Any]:
        """The object's fields other than apiVersion/kind/metadata. `topologyPolicies` (deprecated) is never
        set: RTE does not set it and its e2e checks refuse objects that do."""
        return {
            "zones": [z.as_dict() for z in self.zones],
            "attributes": [{"name": k, "value": v} for k, v in self.attributes],
        }
