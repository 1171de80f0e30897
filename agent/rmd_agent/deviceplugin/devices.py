"""The cache-way devices the plugin advertises, and what it answers for them. Pure: no gRPC, no I/O.

One device per way of the guaranteed pool per L3 cache (its size: rmd_agent.cache_ways, which the
NodeResourceTopology uses too), `l3-<cache id>-way-<n>`, n = 0 .. pool size - 1.
n is an index, not a capacity-bitmask bit: the kubelet only counts devices, and the engine picks the bits
when the workload that asks for the ways is applied. A device's topology is every NUMA node holding CPUs of
its cache, so the topology manager can put a container's ways and CPUs on the same node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rmd_agent.cache_ways import device_id, parse_device_id

# What Allocate puts into the container's environment (docs/deviceplugin.md).
ENV_WAYS = "RMD_L3_CACHE_WAYS"  # how many ways the container was given
ENV_DEVICES = "RMD_L3_CACHE_WAY_DEVICES"  # the device ids, comma-separated, sorted
ENV_CACHE_IDS = "RMD_L3_CACHE_IDS"  # the L3 cache ids those ways belong to, comma-separated


@dataclass(frozen=True)
class WayPool:
    """The guaranteed ways the kubelet may hand out on one L3 cache."""

    cache_id: int
    numa_nodes: frozenset[int]  # NUMA nodes with CPUs of this cache; empty: no topology reported
    ways: int


@dataclass(frozen=True, order=True)
class WayDevice:
    cache_id: int
    way: int
    numa_nodes: frozenset[int] = field(default=frozenset(), compare=False)

    @property
    def id(self) -> str:
        return device_id(self.cache_id, self.way)


class UnknownDevices(ValueError):
    """Allocate named devices the plugin does not advertise (any more)."""


def plan_devices(pools: Iterable[WayPool]) -> tuple[WayDevice, ...]:
    """The devices for the pools, sorted by cache id then way. ValueError on a repeated cache id."""
    devices: list[WayDevice] = []
    seen: set[int] = set()
    for pool in pools:
        if pool.cache_id in seen:
            raise ValueError(f"L3 cache id {pool.cache_id} is listed twice")
        seen.add(pool.cache_id)
        devices.extend(WayDevice(pool.cache_id, way, pool.numa_nodes) for way in range(max(0, pool.ways)))
    return tuple(sorted(devices))


def numa_nodes_of(cpus: Iterable[int], numa_cpus: Mapping[int, Iterable[int]]) -> frozenset[int]:
    """The NUMA nodes holding any of `cpus`, given each node's CPUs."""
    wanted = frozenset(cpus)
    return frozenset(node for node, members in numa_cpus.items() if wanted & frozenset(members))


def allocation_envs(ids: Sequence[str], known: Iterable[str]) -> dict[str, str]:
    """The environment for a container given the devices `ids`. UnknownDevices for ids not in `known`."""
    missing = sorted(set(ids) - set(known))
    if missing:
        raise UnknownDevices(f"not advertised by this plugin: {', '.join(missing)}")
    parsed = sorted({p for p in map(parse_device_id, ids) if p is not None})
    return {
        ENV_WAYS: str(len(set(ids))),
        ENV_DEVICES: ",".join(device_id(c, w) for c, w in parsed),
        ENV_CACHE_IDS: ",".join(str(c) for c in sorted({c for c, _ in parsed})),
    }


def preferred_ways(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """Which `size` of the offered devices to allocate: the required ones, then ways of as few caches as
    possible (a container's ways are enforced per cache, so spreading them over caches wastes them):
    caches already required first, then the caches with the most offered ways, lowest way index first."""
    chosen = list(dict.fromkeys(must_include))
    required = set(chosen)
    rest = [i for i in dict.fromkeys(available) if i not in required]
    per_cache: dict[int, list[tuple[int, str]]] = {}
    foreign: list[str] = []
    for item in rest:
        parsed = parse_device_id(item)
        if parsed is None:
            foreign.append(item)
        else:
            per_cache.setdefault(parsed[0], []).append((parsed[1], item))
    required_caches = {p[0] for p in map(parse_device_id, chosen) if p is not None}
    order = sorted(per_cache, key=lambda c: (c not in required_caches, -len(per_cache[c]), c))
    for cache in order:
        chosen.extend(item for _, item in sorted(per_cache[cache]))
    chosen.extend(foreign)
    return chosen[: max(size, len(required))]
