"""Where the plugin's WayPools come from: the engine's view of the guaranteed pool, placed on NUMA nodes
with sysfs.

The kubelet does the per-pod accounting of the devices, so what is advertised is the size of the pool, not
its free part: a pod that got 2 devices holds them in the kubelet's books, and when its workload is
applied the engine's free count drops by the same 2; advertising the free count would count them twice.
The pool size is what the engine reports free plus what guaranteed workloads hold on that cache; ways held
by resctrl groups of other tools are in neither, so they are not advertised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from rmd_agent.deviceplugin.devices import WayPool, numa_nodes_of
from rmd_agent.deviceplugin.plugin import PoolProvider
from rmd_agent.engine_api import GUARANTEED_POOL, AppliedWorkload, CacheDomainSummary, Engine, guaranteed_held
from rmd_agent.errors import Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.observe.numa import read_numa_nodes


def guaranteed_pools(
    caches: Sequence[CacheDomainSummary],
    workloads: Sequence[AppliedWorkload],
    numa_cpus: Mapping[int, frozenset[int]],
) -> list[WayPool]:
    """One WayPool per L3 cache: free guaranteed ways plus the ways guaranteed workloads hold there.

    A cache without a guaranteed pool (no L3 CAT, resctrl not mounted) gets 0 ways."""
    held = guaranteed_held(workloads)
    pools = []
    for cache in caches:
        free = cache.free_ways.get(GUARANTEED_POOL)
        ways = 0 if free is None else free + held.get(cache.cache_id, 0)
        pools.append(WayPool(cache.cache_id, numa_nodes_of(cache.cpus, numa_cpus), ways))
    return pools


def read_numa_cpus(fs: HostFS) -> dict[int, frozenset[int]]:
    """NUMA node -> CPUs from sysfs; empty (no topology reported) where sysfs has no NUMA information."""
    nodes = read_numa_nodes(fs)
    if isinstance(nodes, Unsupported):
        return {}
    return {n.id: n.cpus for n in nodes}


def engine_pools(engine: Engine, fs: HostFS) -> PoolProvider:
    """A PoolProvider over the engine; NUMA placement read from `fs` once (it does not change)."""
    numa_cpus: dict[int, frozenset[int]] | None = None

    async def provide() -> Sequence[WayPool]:
        nonlocal numa_cpus
        if numa_cpus is None:
            numa_cpus = await asyncio.to_thread(read_numa_cpus, fs)
        summary = await engine.node()
        return guaranteed_pools(summary.caches, await engine.list(), numa_cpus)

    return provide
