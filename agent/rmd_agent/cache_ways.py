"""The guaranteed pool of L3 cache ways per cache: the one definition behind both the device plugin's
`intel.com/l3_cache_ways` devices (the kubelet's books) and the NodeResourceTopology's cache-ways resource
(the scheduler's zones), so the two agree (docs/topology.md, "L3 cache ways"). Pure: no I/O.

* Pool size of a cache: the ways the engine has free there for guaranteed workloads plus the ways guaranteed
  workloads hold there. Ways of other tools' resctrl groups are in neither, so they are not in the pool.
* Ways in use on a cache: what the kubelet gave containers as devices there, and what the engine's
  guaranteed workloads hold there. A container's devices and the workload enforcing them on its exclusive
  CPUs are the same ways, so they count once; devices whose workload is not applied (yet, or ever) and
  workloads made for no pod count on their own.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rmd_agent.engine_api import GUARANTEED_POOL, AppliedWorkload, CacheDomainSummary
from rmd_agent.kubelet.podresources import PodResources
from rmd_api.names import CACHE_WAYS_RESOURCE

_DEVICE_ID = re.compile(r"l3-(\d+)-way-(\d+)")


def device_id(cache_id: int, way: int) -> str:
    """The id of the plugin's device for way index `way` of L3 cache `cache_id`."""
    return f"l3-{cache_id}-way-{way}"


def parse_device_id(text: str) -> tuple[int, int] | None:
    """(cache id, way index) of a device id, None when it is not one of ours."""
    match = _DEVICE_ID.fullmatch(text)
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True)
class Holding:
    """Ways one holder has on one cache: a guaranteed workload (its CPUs) or a container (its exclusive CPUs,
    empty when it has none)."""

    cpus: frozenset[int]
    ways: int


@dataclass(frozen=True)
class GuaranteedPool:
    cache_id: int
    cpus: frozenset[int]  # of the cache
    cache_ways: int  # every way of the cache
    size: int  # ways of the guaranteed pool: what the device plugin advertises
    workloads: tuple[Holding, ...]  # what the engine's guaranteed workloads hold on this cache


def workload_holdings(workloads: Iterable[AppliedWorkload]) -> dict[int, list[Holding]]:
    """L3 cache id -> the ways each guaranteed workload holds there."""
    held: dict[int, list[Holding]] = defaultdict(list)
    for applied in workloads:
        if applied.pool == GUARANTEED_POOL:
            for cache_id, mask in sorted(applied.cache.items()):
                held[cache_id].append(Holding(applied.workload.core_ids, mask.bit_count()))
    return held


def guaranteed_pools(
    caches: Iterable[CacheDomainSummary], workloads: Iterable[AppliedWorkload]
) -> list[GuaranteedPool]:
    """The guaranteed pool of each cache that has one (L3 CAT, resctrl mounted), in the order given."""
    held = workload_holdings(workloads)
    pools = []
    for cache in caches:
        free = cache.free_ways.get(GUARANTEED_POOL)
        if free is not None:
            mine = tuple(held.get(cache.cache_id, ()))
            pools.append(
                GuaranteedPool(cache.cache_id, cache.cpus, cache.ways, free + sum(h.ways for h in mine), mine)
            )
    return pools


def device_holdings(pods: Iterable[PodResources]) -> dict[int, list[Holding]]:
    """L3 cache id -> the cache-way devices each container holds there (PodResources List). Devices of the
    resource that are not ours (no cache in their id) are left out: they name no cache."""
    held: dict[int, list[Holding]] = defaultdict(list)
    for pod in pods:
        for container in pod.containers:
            if not container.devices:
                continue  # most containers: nothing to look at (this runs over every pod at every change)
            ids = {i for d in container.devices if d.resource == CACHE_WAYS_RESOURCE for i in d.ids}
            per_cache: dict[int, int] = defaultdict(int)
            for parsed in filter(None, map(parse_device_id, ids)):
                per_cache[parsed[0]] += 1
            for cache_id, count in sorted(per_cache.items()):
                held[cache_id].append(Holding(container.cpu_ids, count))
    return held


def ways_in_use(workloads: Sequence[Holding], containers: Sequence[Holding]) -> int:
    """Ways of one cache in use by the engine's `workloads` and the kubelet's `containers`, each once.

    The operator puts a pod's workload on its container's exclusive CPUs, so a workload sharing CPUs with a
    container is that container's: the pair counts as the larger of the two (equal once applied; a workload
    on CPUs of two caches holds ways on each while the kubelet charged one)."""
    unmatched = list(workloads)
    total = 0
    # Containers' exclusive CPUs never overlap; should the input say otherwise, a fixed order keeps the
    # result independent of the order pods were listed in.
    for container in sorted(containers, key=lambda c: (sorted(c.cpus), c.ways)):
        mine = [w for w in unmatched if w.cpus & container.cpus]
        unmatched = [w for w in unmatched if not w.cpus & container.cpus]
        total += max(container.ways, sum(w.ways for w in mine))
    return total + sum(w.ways for w in unmatched)
