"""What planning needs to know about a node: its CPUs and L3 domains, what resctrl can do there, how the cache
is split into pools, and the policies of its platform. Plain data built from what `observe` read; no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rmd_agent.errors import ConfigError, Unsupported

if TYPE_CHECKING:
    from rmd_agent.observe.caches import L3Cache
    from rmd_agent.observe.resctrl import CacheInfo, MbaInfo, ResctrlState
    from rmd_agent.plan.policy import Policy

# Default pool shares of the ways left after the OS's minimum. On a 20-way cache they give RMD's defaults
# (OS 1, guaranteed 10, best effort 7, shared 2); on 11 ways OS 1, guaranteed 5, best effort 4, shared 1.
SHARED_SHARE = 0.10
BEST_EFFORT_SHARE = 0.37


@dataclass(frozen=True)
class PoolConfig:
    """Ways per pool on every L3 domain; None derives the size from the cache. The OS (root group) keeps every
    way not given to a pool, at least max(1, min_cbm_bits)."""

    guaranteed: int | None = None
    besteffort: int | None = None
    shared: int | None = None


@dataclass(frozen=True)
class PoolSizes:
    os: int
    guaranteed: int
    besteffort: int
    shared: int


def _share(ways: int, share: float, min_bits: int) -> int:
    n = int(ways * share + 0.5)
    return max(n, min_bits) if n else 0


def pool_sizes(config: PoolConfig, ways: int, min_cbm_bits: int) -> PoolSizes:
    """Pool sizes for a cache of `ways` ways. ConfigError when the configured pools cannot fit."""
    os_min = max(1, min_cbm_bits)
    rest = max(0, ways - os_min)
    shared = config.shared if config.shared is not None else _share(rest, SHARED_SHARE, min_cbm_bits)
    besteffort = (
        config.besteffort if config.besteffort is not None else _share(rest, BEST_EFFORT_SHARE, min_cbm_bits)
    )
    # Derived sizes give way on small caches (best effort first), so the defaults always fit.
    fixed = config.guaranteed or 0
    while os_min + fixed + besteffort + shared > ways:
        if config.besteffort is None and besteffort:
            besteffort = besteffort - 1 if besteffort - 1 >= min_cbm_bits else 0
        elif config.shared is None and shared:
            shared = shared - 1 if shared - 1 >= min_cbm_bits else 0
        else:
            break
    if config.guaranteed is not None:
        guaranteed = config.guaranteed
    else:
        guaranteed = max(0, ways - os_min - besteffort - shared)
        if guaranteed < min_cbm_bits:
            guaranteed = 0
    for name, size in (("guaranteed", guaranteed), ("besteffort", besteffort), ("shared", shared)):
        if size < 0 or 0 < size < min_cbm_bits:
            raise ConfigError(
                f"the {name} pool has {size} ways; a pool needs 0 or at least min_cbm_bits={min_cbm_bits} "
                "ways"
            )
    os_ways = ways - guaranteed - besteffort - shared
    if os_ways < os_min:
        raise ConfigError(
            f"pools of {guaranteed} guaranteed + {besteffort} best-effort + {shared} shared ways leave the "
            f"OS {os_ways} of the cache's {ways} ways; it needs at least {os_min}"
        )
    return PoolSizes(os_ways, guaranteed, besteffort, shared)


@dataclass(frozen=True)
class NodeInventory:
    """A node as the planner sees it. `l3`/`mba` are None where the node cannot allocate that resource."""

    cpus: frozenset[int]
    caches: Mapping[int, frozenset[int]]  # L3 cache id (the resctrl domain id) -> its CPUs
    l3: CacheInfo | None = None
    mba: MbaInfo | None = None
    pools: PoolConfig = field(default_factory=PoolConfig)
    platform: str = "default"
    policies: Mapping[str, Policy] = field(default_factory=dict)

    @property
    def num_closids(self) -> int:
        """The kernel's limit on control groups, root included: the smallest over the enabled resources."""
        limits = [r.num_closids for r in (self.l3, self.mba) if r is not None]
        return min(limits) if limits else 0

    def pool_sizes(self) -> PoolSizes:
        if self.l3 is None:
            raise ConfigError("this node has no L3 cache allocation, so it has no cache pools")
        return pool_sizes(self.pools, self.l3.cbm_mask.bit_count(), self.l3.min_cbm_bits)

    def domains_of(self, cpus: Iterable[int]) -> frozenset[int]:
        """The L3 domains holding any of `cpus`."""
        wanted = frozenset(cpus)
        return frozenset(d for d, members in self.caches.items() if members & wanted)

    @classmethod
    def from_observed(
        cls,
        cpus: frozenset[int],
        caches: Iterable[L3Cache],
        resctrl: ResctrlState | Unsupported,
        *,
        pools: PoolConfig | None = None,
        platform: str | None = None,
        policies: Mapping[str, Policy] | None = None,
    ) -> NodeInventory:
        """Assemble the inventory from the observe readers' results."""
        l3 = mba = None
        if not isinstance(resctrl, Unsupported):
            l3 = None if isinstance(resctrl.l3, Unsupported) else resctrl.l3
            mba = None if isinstance(resctrl.mba, Unsupported) else resctrl.mba
        return cls(
            cpus=frozenset(cpus),
            caches={c.id: c.cpus for c in caches},
            l3=l3,
            mba=mba,
            pools=pools or PoolConfig(),
            platform=platform or "default",
            policies=policies or {},
        )
