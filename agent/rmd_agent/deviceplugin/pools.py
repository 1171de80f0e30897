"""Where the plugin's WayPools come from: the engine's guaranteed pool per L3 cache (rmd_agent.cache_ways,
the same size the NodeResourceTopology publishes as a zone's allocatable), placed on NUMA nodes with sysfs.

The kubelet does the per-pod accounting of the devices, so what is advertised is the size of the pool, not
its free part: a pod that got 2 devices holds them in the kubelet's books, and when its workload is
applied the engine's free count drops by the same 2; advertising the free count would count them twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from rmd_agent import cache_ways
from rmd_agent.deviceplugin.devices import WayPool, numa_nodes_of
from rmd_agent.deviceplugin.plugin import PoolProvider
from rmd_agent.engine_api import AppliedWorkload, CacheDomainSummary, Engine
from rmd_agent.errors import Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.observe.numa import read_numa_nodes


def guaranteed_pools(
    caches: Sequence[CacheDomainSummary],
    workloads: Sequence[AppliedWorkload],
    numa_cpus: Mapping[int, frozenset[int]],
) -> list[WayPool]:
    """One WayPool per L3 cache with a guaranteed pool (no L3 CAT or resctrl not mounted: none, so no
    devices)."""
    return [
        WayPool(p.cache_id, numa_nodes_of(p.cpus, numa_cpus), p.size)
        for p in cache_ways.guaranteed_pools(caches, workloads)
    ]


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
        # The caches alone where the engine gives them so (NodeEngine.cache_domains): the node summary's
        # capability probe is most of its cost and says nothing about the ways.
        domains = getattr(engine, "cache_domains", None)
        caches = await domains() if domains is not None else (await engine.node()).caches
        return guaranteed_pools(caches, await engine.list(), numa_cpus)

    return provide
