"""Workloads + node inventory + the resctrl tree as it is -> the resctrl tree as it should be. Pure: no I/O.

Layout of every L3 domain (the same on each; only cbm_mask bits; bit 0 on the right):

    [ shared | best effort | guaranteed | OS ]

* OS: the root (default) group's own ways. The root group also takes every way above them that no other
  group uses, as far as the mask stays valid (contiguous unless the CPU allows sparse masks): with no
  workloads it keeps the whole cache, and it shrinks only as far as the allocations need. It never overlaps
  a guaranteed group.
* guaranteed (max == min): one group per workload with `max` ways of its own, placed from the top of the
  pool down (RMD's GetConnectiveBits, high first), avoiding the ways of other tools' groups and the ways
  shared with I/O devices (shareable_bits). A placement is kept while it stays valid; when the free ways are
  too fragmented for a newcomer, the pool is compacted towards the top, keeping the groups' order.
* best effort (max > min > 0): one group per workload. Each gets at least `min` ways no other group has;
  the rest of the pool is dealt out one way at a time, in turn, until every group has `max` or the pool is
  used up. This is RMD's "shrink best-effort groups to make room", done the same way every time, so the
  result depends on the set of workloads and their existing order, not on their arrival history.
* shared (max == 0): one group, "rmd-shared", for all shared workloads (RMD v0.3's shared CLOS): they would
  all get the same mask, and CLOSIDs are scarce (often 16, 8 with MBA).

On a domain where a workload has no CPUs its group gets the OS ways (RMD used the full mask): the group
never runs there, since workloads are CPU-based, and so no plan ever overlaps a guaranteed allocation.

Memory bandwidth (MB lines) is set for every group we own when the node has MBA: the requested value on the
workload's domains (percentages rounded up to bandwidth_gran, as the kernel does: `plan.mba.kernel_value`, so
the schemata reads back as planned and the status reports what it holds), the maximum elsewhere. The root
group's MB line is left alone.

Our groups are named `rmd-<namespace>.<name>` (a namespace cannot contain ".", so the split is unambiguous),
sanitised and cut to 64 characters with a hash suffix when needed. Which existing groups are ours is the
caller's `owned` predicate (the engine passes the groups its registry records; `is_owned`, the prefix, is the
default for callers without one). Every other group belongs to someone else: its CLOSID counts against
num_closids, its CPUs cannot be taken, and its ways (unless its mask is the full cbm_mask, i.e. unrestricted)
are never given to our groups. `diff` never touches it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rmd_agent.errors import ConfigError, Unsupported
from rmd_agent.plan.inventory import NodeInventory, PoolSizes
from rmd_agent.plan.mba import MBA_UNLIMITED_MBPS, MBA_UNLIMITED_PERCENT, kernel_value
from rmd_agent.plan.workload import (
    Pool,
    RejectReason,
    Workload,
    WorkloadRejected,
    cpu_conflict,
    describe_cpus,
    resolve_workload,
)
from rmd_api.cpuset import format_cpu_list

if TYPE_CHECKING:
    from rmd_agent.observe.resctrl import CacheInfo, MbaInfo, ResctrlGroup, ResctrlState

PREFIX = "rmd-"
SHARED_GROUP = "rmd-shared"
MAX_GROUP_NAME = 64

# resource -> domain id -> value as written ("7f0" for caches, "50" for MB)
Schemata = Mapping[str, Mapping[int, str]]


def group_name(namespace: str, name: str) -> str:
    """The resctrl group of a workload: readable, unique per namespace/name, safe as a directory name."""
    raw = f"{PREFIX}{namespace}.{name}"
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", raw)
    if clean == raw and len(raw) <= MAX_GROUP_NAME:
        return raw
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:8]
    return f"{clean[: MAX_GROUP_NAME - len(digest) - 1]}-{digest}"


def group_of(workload: Workload) -> str:
    return group_name(workload.namespace, workload.name)


def is_owned(name: str) -> bool:
    """Whether a group is ours by its name alone: the default for callers without a registry of the groups
    they created (tests, benchmarks)."""
    return name.startswith(PREFIX)


# -- the plan ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolRegions:
    """The ways (as cbm bit masks) of each region; the same on every L3 domain."""

    os: int
    guaranteed: int
    besteffort: int
    shared: int


@dataclass(frozen=True)
class GroupPlan:
    name: str
    pool: Pool
    workloads: tuple[str, ...]  # keys of the workloads whose CPUs it holds
    cpus: frozenset[int]
    schemata: Schemata


@dataclass(frozen=True)
class Layout:
    root_schemata: Schemata  # only the resources we set (cache lines); the root's MB line is not ours
    root_cpus: frozenset[int]  # what the kernel will show; never written (the kernel derives it)
    groups: tuple[GroupPlan, ...]  # our groups, by name
    accepted: tuple[Workload, ...]  # resolved, in the order given
    rejected: Mapping[str, WorkloadRejected] = field(default_factory=dict)
    regions: PoolRegions | None = None  # None without L3 CAT
    free_guaranteed: Mapping[int, int] = field(
        default_factory=dict
    )  # L3 domain -> guaranteed ways still free
    mba: MbaInfo | None = None  # the node's MBA the MB lines were planned for (its step explains rounding)

    def group(self, name: str) -> GroupPlan | None:
        return next((g for g in self.groups if g.name == name), None)

    def group_for(self, key: str) -> GroupPlan | None:
        """The group holding the CPUs of workload `key` (namespace/name), if it is accepted and has one."""
        return next((g for g in self.groups if key in g.workloads), None)


# -- bit helpers ---------------------------------------------------------------------------------------------


def _window(low: int, length: int) -> int:
    return ((1 << length) - 1) << low if length > 0 else 0


def _runs(mask: int) -> list[tuple[int, int]]:
    """Maximal runs of set bits as (lowest bit, length), lowest first."""
    runs = []
    bit = 0
    while mask >> bit:
        if mask >> bit & 1:
            start = bit
            while mask >> bit & 1:
                bit += 1
            runs.append((start, bit - start))
        else:
            bit += 1
    return runs


def _largest_run(mask: int) -> int:
    """The longest run of set bits (the highest of equally long ones), as a mask."""
    best = (0, -1, 0)
    for low, length in _runs(mask):
        best = max(best, (length, low, _window(low, length)))
    return best[2]


def mask_is_valid(mask: int, l3: CacheInfo) -> bool:
    """A mask we are willing to write: non-empty, inside cbm_mask, contiguous unless the CPU allows sparse
    masks, and every run at least min_cbm_bits long (the kernel checks only the lowest run: we are
    stricter)."""
    if mask == 0 or mask & ~l3.cbm_mask:
        return False
    runs = _runs(mask)
    if len(runs) > 1 and not l3.sparse_masks:
        return False
    return all(length >= l3.min_cbm_bits for _, length in runs)


def _pick(free: int, count: int, l3: CacheInfo, prefer: int = 0) -> int | None:
    """`count` ways out of `free`: the contiguous window overlapping `prefer` the most, else the highest one;
    with sparse masks allowed, whole free runs from the top when no window fits."""
    best: tuple[int, int] | None = None
    for low in range(l3.cbm_mask.bit_length() - count + 1):
        window = _window(low, count)
        if window & free == window:
            score = ((window & prefer).bit_count(), low)
            best = max(best, score) if best else score
    if best is not None:
        return _window(best[1], count)
    if not l3.sparse_masks:
        return None
    chosen, remaining = 0, count
    for low, length in reversed(_runs(free)):
        take = min(length, remaining)
        if 0 < remaining - take < l3.min_cbm_bits:
            take = remaining - l3.min_cbm_bits
        if take < l3.min_cbm_bits:
            continue
        chosen |= _window(low + length - take, take)
        remaining -= take
        if remaining == 0:
            return chosen
    return None


def _regions(sizes: PoolSizes, cbm_mask: int) -> PoolRegions:
    if len(_runs(cbm_mask)) != 1:
        raise ConfigError(f"cbm_mask {cbm_mask:x} is not contiguous; this layout needs contiguous ways")
    base = (cbm_mask & -cbm_mask).bit_length() - 1
    g_low = base + sizes.os
    be_low = g_low + sizes.guaranteed
    shared_low = be_low + sizes.besteffort
    return PoolRegions(
        os=_window(base, sizes.os),
        guaranteed=_window(g_low, sizes.guaranteed),
        besteffort=_window(be_low, sizes.besteffort),
        shared=_window(shared_low, sizes.shared),
    )


def cache_resources(l3: CacheInfo) -> tuple[str, ...]:
    """Schemata lines of the L3 cache: with CDP, code and data masks are set alike."""
    return ("L3CODE", "L3DATA") if l3.cdp else ("L3",)


# -- planning state ------------------------------------------------------------------------------------------


@dataclass
class _BestEffort:
    group: str
    least: int
    most: int
    order: tuple[int, int, str]


@dataclass
class _Domain:
    id: int
    blocked: int = 0  # ways of other tools' groups
    blocked_by: dict[str, int] = field(default_factory=dict)
    exclusive: int = 0
    guaranteed: dict[str, int] = field(default_factory=dict)
    besteffort: list[_BestEffort] = field(default_factory=list)
    besteffort_masks: dict[str, int] = field(default_factory=dict)
    shared: int = 0


def _hex_value(text: str) -> int | None:
    try:
        return int(text, 16)
    except ValueError:
        return None


def _group_mask(group: ResctrlGroup, resource: str, domain: int) -> int | None:
    text = group.schemata.get(resource, {}).get(domain)
    return None if text is None else _hex_value(text)


class _Planner:
    """One planning pass: admit the workloads in order (CPUs, CLOSIDs, guaranteed ways), then lay out the
    best-effort and shared ways, then emit the groups (`layout`).

    One class of about 340 lines on purpose: every step reads and updates the same per-domain accounting of
    ways (`_Domain`: other tools' ways, guaranteed and best-effort holders), so split into several objects
    they would hand that state around without any step becoming independent.
    """

    def __init__(
        self, node: NodeInventory, current: ResctrlState | None, owned: Callable[[str], bool]
    ) -> None:
        self.node = node
        self.l3 = node.l3
        self.current_groups = {g.name: g for g in current.groups} if current else {}
        self.ours = {n: g for n, g in self.current_groups.items() if owned(n)}
        self.foreign = {n: g for n, g in self.current_groups.items() if not owned(n)}
        self.foreign_cpus = {cpu: g.name for g in self.foreign.values() for cpu in g.cpus}
        self.rejected: dict[str, WorkloadRejected] = {}
        self.accepted: list[Workload] = []
        self.cpu_owner: dict[int, Workload] = {}
        self.groups_used = 0
        self.shared_members: list[Workload] = []
        self.cache_res: tuple[str, ...] = cache_resources(self.l3) if self.l3 is not None else ()
        root = current.root.schemata if current is not None else {}
        # The domains resctrl lists are the ones that can be written (sysfs may know more, e.g. offline).
        cache_ids = root.get(self.cache_res[-1], node.caches) if self.cache_res else node.caches
        self.domains = {d: _Domain(d) for d in sorted(cache_ids)}
        self.mb_domains = tuple(sorted(root.get("MB", node.caches)))
        self.regions: PoolRegions | None = None
        if self.l3 is not None:
            self.regions = _regions(node.pool_sizes(), self.l3.cbm_mask)
            self._note_foreign_ways()

    # what other tools hold

    def _note_foreign_ways(self) -> None:
        assert self.l3 is not None
        for name, group in sorted(self.foreign.items()):
            for dom in self.domains.values():
                mask = 0
                for res in self.cache_res:
                    mask |= _group_mask(group, res, dom.id) or 0
                if mask in (0, self.l3.cbm_mask):  # the full mask restricts nothing and claims nothing
                    continue
                dom.blocked |= mask
                dom.blocked_by[name] = mask
                if group.mode == "exclusive":
                    dom.exclusive |= mask

    def _current_mask(self, name: str, domain: int) -> int:
        group = self.ours.get(name)
        if group is None or self.l3 is None:
            return 0
        return _group_mask(group, self.cache_res[-1], domain) or 0

    def _domains_of(self, w: Workload) -> frozenset[int]:
        """The L3 domains the workload runs on, among those resctrl lists."""
        return self.node.domains_of(w.core_ids) & self.domains.keys()

    # admission

    def _has_group(self, w: Workload) -> bool:
        """Whether the workload's own group exists. Membership of the shared group cannot be read back from
        resctrl, so shared workloads keep the caller's order (which should list accepted workloads first)."""
        return self.l3 is not None and w.pool is not Pool.SHARED and group_of(w) in self.ours

    def admit_all(self, workloads: Sequence[Workload]) -> None:
        resolved = []
        for w in workloads:
            try:
                resolved.append(resolve_workload(w, self.node))
            except WorkloadRejected as exc:
                self.rejected[w.key] = exc.for_workload(w.key)
        # Workloads that already have their group go first, so a newcomer never displaces them.
        placed = [w for w in resolved if self._has_group(w)]
        for w in placed + [w for w in resolved if not self._has_group(w)]:
            try:
                self._admit(w)
            except WorkloadRejected as exc:
                self.rejected[w.key] = exc.for_workload(w.key)

    def _admit(self, w: Workload) -> None:
        self._check_cpus(w)
        if self.l3 is not None:
            pool = w.pool
            new_group = pool is not Pool.SHARED or not self.shared_members
            if new_group:
                self._check_closids(w)
            used = self._domains_of(w)
            if pool is Pool.GUARANTEED:
                self._place_guaranteed(w, used)
            elif pool is Pool.BEST_EFFORT:
                self._admit_besteffort(w, used)
            elif not self.shared_members:
                self._place_shared()
            if new_group:
                self.groups_used += 1
            if pool is Pool.SHARED:
                self.shared_members.append(w)
        self.accepted.append(w)
        for cpu in w.core_ids:
            self.cpu_owner[cpu] = w

    def _check_cpus(self, w: Workload) -> None:
        for cpu in sorted(w.core_ids):
            owner = self.cpu_owner.get(cpu)
            if owner is not None:
                raise cpu_conflict(w, (c for c in w.core_ids if self.cpu_owner.get(c) is owner), owner)
            group = self.foreign_cpus.get(cpu)
            if group is not None:
                taken = sorted(c for c in w.core_ids if self.foreign_cpus.get(c) == group)
                raise WorkloadRejected(
                    RejectReason.CONFLICT,
                    f"{describe_cpus(taken)} in resctrl group {group!r}, which another tool manages",
                )

    def _check_closids(self, w: Workload) -> None:
        limit = self.node.num_closids
        available = limit - 1 - len(self.foreign)
        if self.groups_used < available:
            return
        foreign = f", {len(self.foreign)} by other tools' groups ({', '.join(sorted(self.foreign))})"
        raise WorkloadRejected(
            RejectReason.CAPACITY,
            f"no free CLOS for workload {w.key}: this node has {limit} CLOSIDs (num_closids), used by the "
            f"root group{foreign if self.foreign else ''} and {self.groups_used} rmd groups",
        )

    # guaranteed

    def _guaranteed_avail(self, dom: _Domain) -> int:
        assert self.regions is not None and self.l3 is not None
        return self.regions.guaranteed & ~dom.blocked & ~self.l3.shareable_bits

    def _place_guaranteed(self, w: Workload, used: frozenset[int]) -> None:
        assert self.l3 is not None
        name, count = group_of(w), w.cache_max or 0
        saved = {d: dict(self.domains[d].guaranteed) for d in used}
        try:
            for d in sorted(used):
                dom = self.domains[d]
                avail = self._guaranteed_avail(dom)
                taken = 0
                for held in dom.guaranteed.values():
                    taken |= held
                free = avail & ~taken
                previous = self._current_mask(name, d)
                if (
                    previous.bit_count() == count
                    and not previous & ~free
                    and mask_is_valid(previous, self.l3)
                ):
                    dom.guaranteed[name] = previous
                    continue
                picked = _pick(free, count, self.l3, previous)
                if picked is None and free.bit_count() >= count:
                    picked = self._compact(dom, avail, count, previous)
                if picked is None:
                    raise WorkloadRejected(RejectReason.CAPACITY, self._short_message(d, count, free, avail))
                dom.guaranteed[name] = picked
        except WorkloadRejected:
            for d, masks in saved.items():
                self.domains[d].guaranteed = masks
            raise

    def _short_message(self, domain: int, count: int, free: int, avail: int) -> str:
        have = free.bit_count()
        message = f"not enough guaranteed cache on cache id {domain}: {count} ways requested, {have} free"
        if free.bit_count() >= count:
            message += f" but not {count} contiguous"
        assert self.regions is not None
        lost = self.regions.guaranteed.bit_count() - avail.bit_count()
        if lost:
            message += (
                f" ({lost} of the pool's {self.regions.guaranteed.bit_count()} ways are held by other tools' "
            )
            message += "groups or shared with I/O devices)"
        return message

    def _compact(self, dom: _Domain, avail: int, count: int, prefer: int) -> int | None:
        """Re-place the domain's guaranteed groups from the top down, in their present order, then `count`
        more ways. None (and nothing changed) if that does not fit either."""
        assert self.l3 is not None
        remaining, placed = avail, {}
        for name, mask in sorted(dom.guaranteed.items(), key=lambda kv: (-kv[1].bit_length(), kv[0])):
            new = _pick(remaining, mask.bit_count(), self.l3)
            if new is None:
                return None
            placed[name] = new
            remaining &= ~new
        picked = _pick(remaining, count, self.l3, prefer)
        if picked is not None:
            dom.guaranteed = placed
        return picked

    # best effort

    def _besteffort_region(self, dom: _Domain) -> int:
        assert self.regions is not None
        return _largest_run(self.regions.besteffort & ~dom.blocked)

    def _admit_besteffort(self, w: Workload, used: frozenset[int]) -> None:
        name, least, most = group_of(w), w.cache_min or 0, w.cache_max or 0
        for d in sorted(used):
            dom = self.domains[d]
            size = self._besteffort_region(dom).bit_count()
            held = sum(m.least for m in dom.besteffort)
            if held + least > size:
                others = (
                    f", {held} held as the minimum of {len(dom.besteffort)} other workloads" if held else ""
                )
                raise WorkloadRejected(
                    RejectReason.CAPACITY,
                    f"not enough best-effort cache on cache id {d}: {least} ways requested as minimum, "
                    f"{size - held} free (pool of {size} ways{others})",
                )
        for d in sorted(used):
            previous = self._current_mask(name, d)
            order = (0, -previous.bit_length(), name) if previous else (1, len(self.accepted), name)
            self.domains[d].besteffort.append(_BestEffort(name, least, most, order))

    def _layout_besteffort(self) -> None:
        for dom in self.domains.values():
            if not dom.besteffort:
                continue
            region = self._besteffort_region(dom)
            members = sorted(dom.besteffort, key=lambda m: m.order)
            sizes = [m.least for m in members]
            spare = region.bit_count() - sum(sizes)
            while spare > 0:
                grew = False
                for i, member in enumerate(members):
                    if spare and sizes[i] < member.most:
                        sizes[i] += 1
                        spare -= 1
                        grew = True
                if not grew:
                    break
            top = region.bit_length()
            for member, size in zip(members, sizes, strict=True):
                dom.besteffort_masks[member.group] = _window(top - size, size)
                top -= size

    # shared

    def _place_shared(self) -> None:
        assert self.regions is not None and self.l3 is not None
        masks = {}
        for d, dom in self.domains.items():
            mask = _largest_run(self.regions.shared & ~dom.blocked)
            if not mask_is_valid(mask, self.l3):
                holders = ", ".join(n for n, m in sorted(dom.blocked_by.items()) if m & self.regions.shared)
                raise WorkloadRejected(
                    RejectReason.CAPACITY,
                    f"the shared pool on cache id {d} (ways {self.regions.shared:x}) is held by resctrl "
                    f"groups of another tool ({holders})",
                )
            masks[d] = mask
        for d, mask in masks.items():
            self.domains[d].shared = mask

    # the result

    def _root_mask(self, dom: _Domain) -> int:
        assert self.regions is not None and self.l3 is not None
        if self.regions.os & dom.exclusive:
            raise ConfigError(
                f"the OS ways {self.regions.os:x} of cache id {dom.id} overlap an exclusive resctrl group of "
                "another tool; shrink that group or give the OS other ways"
            )
        used = dom.blocked | dom.shared
        for mask in [*dom.guaranteed.values(), *dom.besteffort_masks.values()]:
            used |= mask
        free = self.l3.cbm_mask & ~used
        if self.l3.sparse_masks:
            return self.regions.os | free
        root = self.regions.os
        bit = root.bit_length()
        while free >> bit & 1:
            root |= 1 << bit
            bit += 1
        return root

    def _mb_values(self, w: Workload | None, used: frozenset[int]) -> dict[int, str]:
        mba = self.node.mba
        assert mba is not None
        unlimited = MBA_UNLIMITED_MBPS if mba.mbps else MBA_UNLIMITED_PERCENT
        value = unlimited if w is None or w.mba is None else kernel_value(w.mba, mba)
        return {d: str(value if d in used else unlimited) for d in self.mb_domains}

    def _schemata(self, masks: Mapping[int, int], w: Workload | None, used: frozenset[int]) -> Schemata:
        values = {d: f"{masks[d]:x}" for d in sorted(masks)}
        schemata: dict[str, Mapping[int, str]] = dict.fromkeys(self.cache_res, values)
        if self.node.mba is not None:
            schemata["MB"] = self._mb_values(w, used)
        return schemata

    def layout(self) -> Layout:
        if self.l3 is None or self.regions is None:
            cpus = self.node.cpus - frozenset(self.foreign_cpus)
            return Layout({}, cpus, (), tuple(self.accepted), self.rejected)
        self._layout_besteffort()
        groups = []
        for w in self.accepted:
            pool = w.pool
            if pool is Pool.SHARED:
                continue
            name, used = group_of(w), self._domains_of(w)
            allocated = {
                d: dom.guaranteed.get(name) or dom.besteffort_masks.get(name) or 0
                for d, dom in self.domains.items()
            }
            masks = {d: allocated[d] if d in used else self.regions.os for d in self.domains}
            groups.append(GroupPlan(name, pool, (w.key,), w.core_ids, self._schemata(masks, w, used)))
        if self.shared_members:
            cpus = frozenset().union(*(w.core_ids for w in self.shared_members))
            masks = {d: dom.shared for d, dom in self.domains.items()}
            keys = tuple(sorted(w.key for w in self.shared_members))
            groups.append(
                GroupPlan(SHARED_GROUP, Pool.SHARED, keys, cpus, self._schemata(masks, None, frozenset()))
            )
        roots = {d: f"{self._root_mask(dom):x}" for d, dom in self.domains.items()}
        in_groups = frozenset(self.foreign_cpus).union(*(g.cpus for g in groups))
        free = {}
        for d, dom in self.domains.items():
            taken = 0
            for mask in dom.guaranteed.values():
                taken |= mask
            free[d] = (self._guaranteed_avail(dom) & ~taken).bit_count()
        return Layout(
            root_schemata=dict.fromkeys(self.cache_res, roots),
            root_cpus=self.node.cpus - in_groups,
            groups=tuple(sorted(groups, key=lambda g: g.name)),
            accepted=tuple(self.accepted),
            rejected=self.rejected,
            regions=self.regions,
            free_guaranteed=free,
            mba=self.node.mba,
        )


def plan_layout(
    node: NodeInventory,
    workloads: Sequence[Workload],
    current: ResctrlState | None = None,
    owned: Callable[[str], bool] = is_owned,
) -> Layout:
    """The resctrl tree these workloads need on this node, given the tree as it is (`current`; None for a
    fresh mount). Groups of `current` for which `owned(name)` holds are ours (their placements are kept);
    every other one is another tool's (its CLOSID, CPUs and ways are left alone). Workloads that cannot be
    enforced are left out and listed in `Layout.rejected` with the reason; they are placed in order, those
    that already have their group first, so a newcomer never evicts a running workload. Deterministic, and
    planning again over the applied result gives the same layout and the same rejected workloads (a reason
    may change once: refused for capacity, then for the CPUs of a workload that has its group by then).
    ConfigError if the node's pool settings cannot work."""
    keys = [w.key for w in workloads]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(f"workloads must be unique per namespace/name; repeated: {', '.join(duplicates)}")
    planner = _Planner(node, current, owned)
    planner.admit_all(workloads)
    layout = planner.layout()
    position = {key: i for i, key in enumerate(keys)}
    return dataclasses.replace(layout, accepted=tuple(sorted(layout.accepted, key=lambda w: position[w.key])))


# -- diff ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mkdir:
    group: str

    def __str__(self) -> str:
        return f"mkdir {self.group}"


@dataclass(frozen=True)
class Rmdir:
    group: str

    def __str__(self) -> str:
        return f"rmdir {self.group}"


@dataclass(frozen=True)
class WriteSchemata:
    """A (partial) schemata write: only the domains that change. group "" is the root group."""

    group: str
    schemata: Schemata

    @property
    def text(self) -> str:
        """What to write to the schemata file: one line per resource, newline-terminated."""
        return "".join(
            f"{res}:" + ";".join(f"{d}={values[d]}" for d in sorted(values)) + "\n"
            for res, values in self.schemata.items()
        )

    def __str__(self) -> str:
        return f"write {self.group or '.'}/schemata {self.text.strip()!r}"


@dataclass(frozen=True)
class WriteCpus:
    group: str
    cpus: frozenset[int]

    @property
    def text(self) -> str:
        return format_cpu_list(self.cpus) + "\n"

    def __str__(self) -> str:
        return f"write {self.group}/cpus_list {format_cpu_list(self.cpus)!r}"


Operation = Mkdir | Rmdir | WriteSchemata | WriteCpus


def _same(resource: str, a: str, b: str) -> bool:
    try:
        if resource == "MB":
            return int(a) == int(b)
        return int(a, 16) == int(b, 16)
    except ValueError:
        return a == b


def _split_change(
    current: Mapping[str, Mapping[int, str]],
    desired: Schemata,
    l3: CacheInfo | None,
    *,
    unknown_is_full: bool = False,
    park: int = 0,
) -> tuple[dict[str, dict[int, str]], dict[str, dict[int, str]]]:
    """(release, final): `release` gives up ways without taking any (written before anyone grows), `final`
    completes the change. A mask that moves releases first to the intersection of its old and new ways, or,
    when that is not a valid mask, to the `park` ways (the OS ways, outside every pool), so that two groups
    trading places never share a way. With `unknown_is_full`, a value missing from `current` is taken to be
    the full mask (the root group of a fresh mount), so writing it only releases ways."""
    release: dict[str, dict[int, str]] = {}
    final: dict[str, dict[int, str]] = {}
    for res, values in desired.items():
        for d, value in values.items():
            have = current.get(res, {}).get(d)
            if have is not None and _same(res, have, value):
                continue
            if have is None and unknown_is_full and res != "MB":
                release.setdefault(res, {})[d] = value
                continue
            old = None if have is None or res == "MB" else _hex_value(have)
            new = _hex_value(value) if res != "MB" else None
            if old is not None and new is not None:
                if not new & ~old:
                    release.setdefault(res, {})[d] = value
                    continue
                both = old & new
                if both != old and l3 is not None and mask_is_valid(both, l3):
                    release.setdefault(res, {})[d] = f"{both:x}"
                elif both != old and park and old != park:
                    release.setdefault(res, {})[d] = f"{park:x}"
            final.setdefault(res, {})[d] = value
    return release, final


def _top_bit(schemata: Schemata) -> int:
    return max(
        (
            (_hex_value(v) or 0).bit_length()
            for res, vals in schemata.items()
            if res != "MB"
            for v in vals.values()
        ),
        default=0,
    )


def diff(
    current: ResctrlState | None, desired: Layout, owned: Callable[[str], bool] = is_owned
) -> list[Operation]:
    """The fewest operations that turn `current` into `desired`, ordered so that no two groups share a
    guaranteed way at any step: remove stale groups, release ways (root first; a group, the root included,
    whose kept ways make no valid mask is parked on the OS ways meanwhile), create groups, take ways, then
    move CPUs (gaining groups first: a CPU written into one group leaves its old group by itself).
    Only groups for which `owned(name)` holds are created, changed or removed, plus the root group's cache
    lines."""
    for g in desired.groups:
        if not owned(g.name):
            raise ValueError(f"the layout names group {g.name!r}, which is not ours to manage")
    l3: CacheInfo | None = None
    groups: dict[str, ResctrlGroup] = {}
    root_schemata: Mapping[str, Mapping[int, str]] = {}
    if current is not None:
        groups = {g.name: g for g in current.groups}
        root_schemata = current.root.schemata
        l3 = None if isinstance(current.l3, Unsupported) else current.l3
    wanted = {g.name: g for g in desired.groups}
    park = desired.regions.os if desired.regions is not None else 0

    removals: list[Operation] = [Rmdir(n) for n in sorted(groups) if owned(n) and n not in wanted]
    releases: list[Operation] = []
    creates: list[Operation] = []
    finals: list[tuple[int, str, WriteSchemata]] = []

    # The root parks on the OS ways too when the ways it keeps make no valid mask: it must let go of ways a
    # guaranteed group takes before that group grows into them.
    root_release, root_final = _split_change(
        root_schemata, desired.root_schemata, l3, unknown_is_full=True, park=park
    )
    if root_release:
        releases.append(WriteSchemata("", root_release))
    for name, plan in sorted(wanted.items()):
        if name in groups:
            release, final = _split_change(groups[name].schemata, plan.schemata, l3, park=park)
            if release:
                releases.append(WriteSchemata(name, release))
        else:
            creates.append(Mkdir(name))
            final = {res: dict(values) for res, values in plan.schemata.items()}
        if final:
            finals.append((-_top_bit(final), name, WriteSchemata(name, final)))
    # Groups moving up the cache go first, so each one moves into ways its neighbour has already left.
    grows: list[Operation] = [op for _, _, op in sorted(finals, key=lambda t: (t[0], t[1]))]
    if root_final:
        grows.append(WriteSchemata("", root_final))
    return removals + releases + creates + grows + _cpu_moves(groups, wanted, owned)


def _cpu_moves(
    groups: Mapping[str, ResctrlGroup], wanted: Mapping[str, GroupPlan], owned: Callable[[str], bool]
) -> list[Operation]:
    owner: dict[int, str] = {}
    for name, group in groups.items():
        if name in wanted or not owned(name):  # removed groups' CPUs went back to the root group
            for cpu in group.cpus:
                owner[cpu] = name
    ops: list[Operation] = []

    def write(plan: GroupPlan) -> None:
        for cpu, name in list(owner.items()):
            if name == plan.name and cpu not in plan.cpus:
                del owner[cpu]
        for cpu in plan.cpus:
            owner[cpu] = plan.name
        ops.append(WriteCpus(plan.name, plan.cpus))

    def has(name: str) -> frozenset[int]:
        return frozenset(c for c, n in owner.items() if n == name)

    for name, plan in sorted(wanted.items()):
        if plan.cpus - has(name):
            write(plan)
    for name, plan in sorted(wanted.items()):
        if has(name) != plan.cpus:
            write(plan)
    return ops
