"""What a layout hands out, as the engine reports it: a workload's cache masks and MBA values per domain, and
the ways each pool still has free on a cache domain (the node summary)."""

from __future__ import annotations

from rmd_agent.plan.inventory import NodeInventory
from rmd_agent.plan.resctrl_layout import GroupPlan, Layout
from rmd_agent.plan.workload import Pool, Workload


def free_ways(layout: Layout, inventory: NodeInventory, cache_id: int) -> dict[str, int]:
    """Pool name -> ways still free on L3 domain `cache_id`; empty without cache pools. The best-effort
    pool's ways are shared, so only the minimums its workloads hold there count as taken."""
    if layout.regions is None:
        return {}
    held_min = sum(
        w.cache_min or 0
        for w in layout.accepted
        if w.pool is Pool.BEST_EFFORT and cache_id in inventory.domains_of(w.core_ids)
    )
    return {
        str(Pool.GUARANTEED): layout.free_guaranteed.get(cache_id, 0),
        str(Pool.BEST_EFFORT): max(0, layout.regions.besteffort.bit_count() - held_min),
        str(Pool.SHARED): layout.regions.shared.bit_count(),
    }


def workload_allocation(
    group: GroupPlan, inventory: NodeInventory, w: Workload
) -> tuple[dict[int, int], dict[int, int]]:
    """(L3 cache id -> capacity bitmask, MB domain -> value) that `group` gives `w` on the domains of its
    CPUs. The mask is the group's last cache line: L3, or L3DATA with CDP."""
    domains = inventory.domains_of(w.core_ids)
    cache: dict[int, int] = {}
    mba: dict[int, int] = {}
    resources = [r for r in group.schemata if r != "MB"]
    if resources:
        values = group.schemata[resources[-1]]
        cache = {d: int(values[d], 16) for d in sorted(domains) if d in values}
    if w.mba is not None and "MB" in group.schemata:
        mba = {d: int(v) for d, v in group.schemata["MB"].items() if d in domains}
    return cache, mba
