"""The resctrl model: what info/ says the hardware and mount allow, and the control groups with their
schemata, CPUs, modes and tasks. Pure data; reading it from a tree is `tree`, changing it the kernel's way is
`ops`."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from rmd_sim.spec import NodeSpec

RESCTRL = "sys/fs/resctrl"
NON_GROUP_DIRS = frozenset({"info", "mon_groups", "mon_data"})
MODES = ("shareable", "exclusive", "pseudo-locksetup", "pseudo-locked")
MBA_MAX_MBPS = 2**32 - 1  # the software controller's "unlimited" (U32_MAX)
GROUP_FILES = ("cpus", "cpus_list", "mode", "schemata", "size", "tasks")

DECIMAL = re.compile(r"\+?[0-9]+")  # a domain id or MB value as the kernel parses it


def group_label(name: str) -> str:
    return "root group" if name == "" else f"group {name!r}"


def first_run(mask: int) -> tuple[int, int]:
    """(first set bit, first clear bit above it); (0, 0) for an empty mask."""
    if not mask:
        return 0, 0
    first = (mask & -mask).bit_length() - 1
    zero = first
    while mask >> zero & 1:
        zero += 1
    return first, zero


@dataclass(frozen=True)
class CacheInfo:
    """info/L3."""

    cbm_mask: int
    min_cbm_bits: int
    shareable_bits: int
    sparse_masks: bool
    num_closids: int

    @property
    def cbm_len(self) -> int:
        return self.cbm_mask.bit_length()


@dataclass(frozen=True)
class MbInfo:
    """info/MB, plus whether the mount uses the MBps software controller."""

    min_bandwidth: int
    bandwidth_gran: int
    num_closids: int
    mbps: bool

    @property
    def max(self) -> int:
        return MBA_MAX_MBPS if self.mbps else 100


@dataclass(frozen=True)
class ResctrlInfo:
    """What the hardware and mount allow; fixed for the life of a mount."""

    l3: CacheInfo | None
    mb: MbInfo | None
    num_rmids: int | None  # None without L3 monitoring
    online: frozenset[int]
    nr_cpu_ids: int
    l3_cache_bytes: Mapping[int, int] = field(default_factory=dict)  # L3 domain id -> size, for `size`

    @property
    def num_closids(self) -> int:
        """The kernel limits groups by the smallest num_closids of the enabled resources."""
        limits = [r.num_closids for r in (self.l3, self.mb) if r is not None]
        return min(limits) if limits else 1


@dataclass(frozen=True)
class Group:
    """A control group; the root (default) group has the name ""."""

    name: str
    schemata: Mapping[str, Mapping[int, int]]  # resource -> domain id -> mask (L3) or value (MB)
    cpus: frozenset[int]
    mode: str = "shareable"
    tasks: tuple[int, ...] = ()


@dataclass(frozen=True)
class ResctrlState:
    info: ResctrlInfo
    domains: Mapping[str, tuple[int, ...]]  # resource -> domain ids, in the root schemata's order
    groups: Mapping[str, Group]  # root ("") first
    name_width: int = 6  # schemata column width: "L3CODE" when L3 supports CDP, even with CDP off

    @property
    def root(self) -> Group:
        return self.groups[""]

    def others(self, name: str) -> list[Group]:
        return [g for n, g in self.groups.items() if n != name]

    def with_groups(self, groups: Mapping[str, Group]) -> ResctrlState:
        ordered = {"": groups[""]} | {n: groups[n] for n in sorted(groups) if n}
        return dataclasses.replace(self, groups=ordered)


def state_for_spec(spec: NodeSpec) -> ResctrlState:
    """The state right after `mount -t resctrl` on a machine described by `spec`: only the root group."""
    l3 = CacheInfo(
        cbm_mask=int(spec.cbm_mask, 16),
        min_cbm_bits=spec.min_cbm_bits,
        shareable_bits=int(spec.shareable_bits, 16),
        sparse_masks=spec.sparse_masks == 1,
        num_closids=spec.num_closids,
    )
    mb = (
        MbInfo(spec.mba_min_bandwidth, spec.mba_bandwidth_gran, spec.num_closids, spec.mba_mbps)
        if spec.mba
        else None
    )
    ids = tuple(range(spec.sockets))
    info = ResctrlInfo(
        l3=l3,
        mb=mb,
        num_rmids=spec.num_rmids if spec.l3_mon else None,
        online=frozenset(range(spec.cpus)),
        nr_cpu_ids=spec.cpus,
        l3_cache_bytes=dict.fromkeys(ids, spec.l3_bytes),
    )
    domains: dict[str, tuple[int, ...]] = {"L3": ids}
    schemata: dict[str, Mapping[int, int]] = {"L3": dict.fromkeys(ids, l3.cbm_mask)}
    if mb is not None:
        domains["MB"] = ids
        schemata["MB"] = dict.fromkeys(ids, mb.max)
    root = Group("", schemata, frozenset(range(spec.cpus)))
    return ResctrlState(info, domains, {"": root}, name_width=6 if spec.l3_cdp_capable else 2)
