"""A model of the kernel's resctrl filesystem over a host tree: a rule checker and a simulated kernel.

The tree under `<root>/sys/fs/resctrl` is the state. `check_resctrl_tree` reports every way a tree breaks the
kernel's rules; `SimResctrl` performs mkdir/rmdir/write the way the kernel does (same validation order, same
errno, same `info/last_cmd_status` text, modelled on Linux 6.x fs/resctrl) so an agent's writes can be tested
without RDT hardware. Kernel operations are pure functions over `ResctrlState`; `SimResctrl` only loads the
state, applies one operation and writes back the files that changed.

Not modelled: CDP (L3CODE/L3DATA), L2 CAT, monitoring groups (mkdir inside mon_groups gives EPERM),
pseudo-locking (the simulated platform reports it unsupported) and a process table (`tasks` accepts any
pid and lists only pids written to it).
"""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rmd_api.cpuset import CpuListError, format_cpu_list, parse_cpu_list
from rmd_sim.spec import NodeSpec

RESCTRL = "sys/fs/resctrl"
NON_GROUP_DIRS = frozenset({"info", "mon_groups", "mon_data"})
MODES = ("shareable", "exclusive", "pseudo-locksetup", "pseudo-locked")
MBA_MAX_MBPS = 2**32 - 1  # the software controller's "unlimited" (U32_MAX)
MB_DATA_WIDTH = 3  # the kernel pads MB values to 3 columns
GROUP_FILES = ("cpus", "cpus_list", "mode", "schemata", "size", "tasks")

_DEC = re.compile(r"\+?[0-9]+")
_HEX = re.compile(r"\+?(?:0[xX])?[0-9a-fA-F]+")


def format_cpu_mask(cpus: Iterable[int], nbits: int) -> str:
    """The kernel's `%*pb` cpumask: comma-separated 32-bit hex words, the first only as wide as needed."""
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    words = max(1, (nbits + 31) // 32)
    first_bits = nbits - 32 * (words - 1) if nbits else 32
    chunks = []
    for i in range(words - 1, -1, -1):
        width = (first_bits + 3) // 4 if i == words - 1 else 8
        chunks.append(f"{(value >> (32 * i)) & 0xFFFFFFFF:0{width}x}")
    return ",".join(chunks)


def group_label(name: str) -> str:
    return "root group" if name == "" else f"group {name!r}"


# -- the model ---------------------------------------------------------------------------------------------


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


# -- rendering (what the kernel shows on read) -------------------------------------------------------------


def _data_width(state: ResctrlState) -> int:
    widths = [MB_DATA_WIDTH] if state.info.mb else []
    if state.info.l3:
        widths.append((state.info.l3.cbm_len + 3) // 4)
    return max(widths, default=MB_DATA_WIDTH)


def render_schemata(state: ResctrlState, group: Group) -> str:
    """`    L3:0=7ff;1=7ff` / `    MB:0=100;1= 50`: names right-aligned, masks 0-padded, MB space-padded."""
    width = _data_width(state)
    lines = []
    for res, ids in state.domains.items():
        values = group.schemata[res]
        if res == "MB":
            items = [f"{d}={values[d]:>{width}}" for d in ids]
        else:
            items = [f"{d}={values[d]:0{width}x}" for d in ids]
        lines.append(f"{res:>{state.name_width}}:" + ";".join(items) + "\n")
    return "".join(lines)


def render_size(state: ResctrlState, group: Group) -> str:
    """Bytes per domain: cache size / cbm length x bits set; MB values as they are."""
    lines = []
    for res, ids in state.domains.items():
        values = group.schemata[res]
        if res == "L3" and state.info.l3:
            per_bit = {d: state.info.l3_cache_bytes.get(d, 0) // state.info.l3.cbm_len for d in ids}
            items = [f"{d}={per_bit[d] * values[d].bit_count()}" for d in ids]
        else:
            items = [f"{d}={values[d]}" for d in ids]
        lines.append(f"{res:>{state.name_width}}:" + ";".join(items) + "\n")
    return "".join(lines)


def render_group_files(state: ResctrlState, group: Group) -> dict[str, str]:
    return {
        "cpus": format_cpu_mask(group.cpus, state.info.nr_cpu_ids) + "\n",
        "cpus_list": format_cpu_list(group.cpus) + "\n",
        "mode": group.mode + "\n",
        "schemata": render_schemata(state, group),
        "size": render_size(state, group),
        "tasks": "".join(f"{pid}\n" for pid in group.tasks),
    }


def render_bit_usage(state: ResctrlState) -> str:
    """info/L3/bit_usage, highest bit first: X/H hardware-shared, S shareable, E exclusive, 0 unused."""
    l3 = state.info.l3
    if l3 is None or "L3" not in state.domains:
        return "\n"
    parts = []
    for d in state.domains["L3"]:
        sw = exclusive = 0
        for g in state.groups.values():
            if g.mode == "shareable":
                sw |= g.schemata["L3"][d]
            elif g.mode == "exclusive":
                exclusive |= g.schemata["L3"][d]
        legend = []
        for bit in range(l3.cbm_len - 1, -1, -1):
            hw, s, e = l3.shareable_bits >> bit & 1, sw >> bit & 1, exclusive >> bit & 1
            legend.append("X" if hw and s else "H" if hw else "S" if s else "E" if e else "0")
        parts.append(f"{d}=" + "".join(legend))
    return ";".join(parts) + "\n"


# -- reading a tree ----------------------------------------------------------------------------------------


class TreeProblem(Exception):
    """A file of the resctrl tree is missing or does not parse."""


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise TreeProblem(f"{path.name}: cannot read ({exc.strerror})") from None


def _read_int(path: Path, base: int = 10) -> int:
    text = _read(path).strip()
    try:
        return int(text, base)
    except ValueError:
        raise TreeProblem(
            f"{path}: expected a {'hex ' if base == 16 else ''}number, found {text!r}"
        ) from None


def parse_schemata_text(text: str) -> dict[str, dict[int, str]]:
    """Schemata text (`    L3:0=7ff;1=7ff`) as resource -> domain id -> raw value; ValueError if bad."""
    out: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        res, sep, rest = line.partition(":")
        res = res.strip()
        if not sep or not res:
            raise ValueError(f"line {line.strip()!r} is not RESOURCE:ID=VALUE;...")
        if res in out:
            raise ValueError(f"resource {res} appears twice")
        values: dict[int, str] = {}
        for item in rest.split(";"):
            if not item.strip():
                continue
            dom, eq, value = item.partition("=")
            if not eq or not _DEC.fullmatch(dom.strip()) or not value.strip():
                raise ValueError(f"{res}: {item.strip()!r} is not ID=VALUE")
            if int(dom) in values:
                raise ValueError(f"{res}: domain {int(dom)} appears twice")
            values[int(dom)] = value.strip()
        out[res] = values
    return out


def _mount_options(root: Path) -> frozenset[str]:
    try:
        mounts = (root / "proc/mounts").read_text()
    except OSError:
        return frozenset()
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "resctrl":
            return frozenset(parts[3].split(","))
    return frozenset()


def _cpu_set(root: Path, name: str) -> frozenset[int] | None:
    path = root / "sys/devices/system/cpu" / name
    if not path.is_file():
        return None
    try:
        return parse_cpu_list(path.read_text())
    except CpuListError as exc:
        raise TreeProblem(f"sys/devices/system/cpu/{name}: {exc}") from None


def read_info(root: Path) -> ResctrlInfo:
    """info/ of the mount, the online CPUs and the mount options. TreeProblem if they are unusable."""
    info = root / RESCTRL / "info"
    if not info.is_dir():
        raise TreeProblem(f"/{RESCTRL}/info is absent: resctrl is not mounted in this tree")
    l3 = mb = None
    if (info / "L3").is_dir():
        sparse = info / "L3/sparse_masks"
        l3 = CacheInfo(
            cbm_mask=_read_int(info / "L3/cbm_mask", 16),
            min_cbm_bits=_read_int(info / "L3/min_cbm_bits"),
            shareable_bits=_read_int(info / "L3/shareable_bits", 16),
            sparse_masks=sparse.is_file() and _read_int(sparse) == 1,
            num_closids=_read_int(info / "L3/num_closids"),
        )
    if (info / "MB").is_dir():
        mb = MbInfo(
            min_bandwidth=_read_int(info / "MB/min_bandwidth"),
            bandwidth_gran=_read_int(info / "MB/bandwidth_gran"),
            num_closids=_read_int(info / "MB/num_closids"),
            mbps="mba_MBps" in _mount_options(root),
        )
    if l3 is None and mb is None:
        raise TreeProblem("info/ has neither L3 nor MB: nothing can be allocated")
    rmids = info / "L3_MON/num_rmids"
    online = _cpu_set(root, "online")
    possible = _cpu_set(root, "possible") or online
    return ResctrlInfo(
        l3=l3,
        mb=mb,
        num_rmids=_read_int(rmids) if rmids.is_file() else None,
        online=online if online is not None else frozenset(),
        nr_cpu_ids=max(possible) + 1 if possible else 0,
    )


def _read_l3_sizes(root: Path, ids: Iterable[int]) -> dict[int, int]:
    """L3 size per cache id from sys/devices/system/cpu/cpu*/cache/index3, for the `size` files."""
    wanted, sizes = set(ids), {}
    cpu_dir = root / "sys/devices/system/cpu"
    cpus = sorted(int(p.name[3:]) for p in cpu_dir.glob("cpu[0-9]*")) if cpu_dir.is_dir() else []
    for cpu in cpus:
        index3 = cpu_dir / f"cpu{cpu}/cache/index3"
        try:
            cache_id = int((index3 / "id").read_text())
            size_text = (index3 / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if cache_id in wanted and cache_id not in sizes:
            sizes[cache_id] = int(size_text.rstrip("K")) * 1024 if size_text.endswith("K") else int(size_text)
        if len(sizes) == len(wanted):
            break
    return sizes


def list_groups(root: Path) -> list[str]:
    """Control group names: the directories of the mount other than info, mon_groups and mon_data."""
    base = root / RESCTRL
    return sorted(p.name for p in base.iterdir() if p.is_dir() and p.name not in NON_GROUP_DIRS)


@dataclass
class _RawGroup:
    """A group as read, each part None when it could not be read (the reason is in the problems list)."""

    name: str
    schemata: dict[str, dict[int, str]] | None
    cpus: frozenset[int] | None
    mode: str | None
    tasks: tuple[int, ...] | None


def _read_raw_group(root: Path, name: str, problems: list[str]) -> _RawGroup:
    base = root / RESCTRL / name if name else root / RESCTRL
    label = group_label(name)
    raw = _RawGroup(name, None, None, None, None)
    try:
        raw.schemata = parse_schemata_text(_read(base / "schemata"))
    except (TreeProblem, ValueError) as exc:
        problems.append(f"{label}: schemata: {exc}")
    try:
        raw.cpus = parse_cpu_list(_read(base / "cpus_list"))
    except (TreeProblem, CpuListError) as exc:
        problems.append(f"{label}: cpus_list: {exc}")
    if raw.cpus is not None and (base / "cpus").is_file():
        text = _read(base / "cpus").strip()
        try:
            mask = int(text.replace(",", "") or "0", 16)
        except ValueError:
            problems.append(f"{label}: cpus {text!r} is not a hex cpumask")
        else:
            if mask != sum(1 << c for c in raw.cpus):
                problems.append(f"{label}: cpus {text} and cpus_list {format_cpu_list(raw.cpus)!r} disagree")
    try:
        raw.mode = _read(base / "mode").strip() if (base / "mode").exists() else "shareable"
    except TreeProblem as exc:
        problems.append(f"{label}: mode: {exc}")
    try:
        tasks_text = _read(base / "tasks") if (base / "tasks").exists() else ""
        raw.tasks = tuple(int(t) for t in tasks_text.split())
    except (TreeProblem, ValueError) as exc:
        problems.append(f"{label}: tasks: {exc}")
    return raw


def _name_width(root: Path) -> int:
    """The schemata name column width, as the root schemata shows it."""
    first = next((ln for ln in _read(root / RESCTRL / "schemata").splitlines() if ln.strip()), "")
    return len(first.partition(":")[0]) or 2


# -- the checker ------------------------------------------------------------------------------------------


def check_resctrl_tree(root: Path) -> list[str]:
    """Every violation of the kernel's resctrl rules in the tree at `root`; empty means valid.

    A tree without a resctrl mount (no sys/fs/resctrl/info) has nothing to violate.
    """
    return _inspect(Path(root))[2]


def _inspect(root: Path) -> tuple[ResctrlInfo | None, list[_RawGroup], list[str]]:
    """Read the mount once: its info, its groups as read, and every rule they break."""
    if not (root / RESCTRL / "info").is_dir():
        return None, [], []
    try:
        info = read_info(root)
    except TreeProblem as exc:
        return None, [], [str(exc)]
    problems: list[str] = []
    raws = [_read_raw_group(root, n, problems) for n in ["", *list_groups(root)]]
    root_raw = raws[0]
    if root_raw.schemata is None:
        return info, raws, problems
    domains = {res: tuple(vals) for res, vals in root_raw.schemata.items()}
    for res, cache in (("L3", info.l3), ("MB", info.mb)):
        if cache is not None and res not in domains:
            problems.append(f"root group: schemata has no {res} line although info/{res} exists")
    groups = _decode_groups(info, domains, raws, problems)
    problems += _count_violations(info, len(raws))
    problems += _mode_violations(raws)
    problems += _exclusive_violations(info, groups)
    problems += _cpu_violations(info, raws)
    problems += _task_violations(raws)
    return info, raws, problems


def _decode_groups(
    info: ResctrlInfo,
    domains: Mapping[str, tuple[int, ...]],
    raws: list[_RawGroup],
    problems: list[str],
) -> list[Group]:
    """Check each group's schemata values and return the groups whose L3 masks are all readable."""
    groups = []
    for raw in raws:
        if raw.schemata is None:
            continue
        label = group_label(raw.name)
        values: dict[str, dict[int, int]] = {}
        for res in raw.schemata.keys() - domains.keys():
            problems.append(f"{label}: schemata has resource {res} which the root schemata lacks")
        for res, ids in domains.items():
            line = raw.schemata.get(res)
            if line is None:
                problems.append(f"{label}: schemata has no {res} line (root lists domains {_ids(ids)})")
                continue
            for d in sorted(set(ids) - line.keys()):
                problems.append(f"{label}: {res} lacks domain {d} (root schemata lists {_ids(ids)})")
            for d in sorted(line.keys() - set(ids)):
                problems.append(
                    f"{label}: {res} domain {d} is not a domain of the root schemata ({_ids(ids)})"
                )
            values[res] = {}
            for d, text in line.items():
                problem, value = _check_value(info, res, text)
                if problem:
                    problems.append(f"{label}: {res} domain {d} {problem}")
                if value is not None:
                    values[res][d] = value
        groups.append(Group(raw.name, values, raw.cpus or frozenset(), raw.mode or "shareable"))
    return groups


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids)


def _check_value(info: ResctrlInfo, res: str, text: str) -> tuple[str | None, int | None]:
    if res == "L3" and info.l3 is not None:
        try:
            mask = int(text, 16)
        except ValueError:
            return f"mask {text!r} is not hex", None
        return _mask_problem(info.l3, mask), mask
    if res == "MB" and info.mb is not None:
        try:
            value = int(text)
        except ValueError:
            return f"value {text!r} is not a number", None
        mb = info.mb
        if mb.mbps:
            return (None if 0 <= value <= MBA_MAX_MBPS else f"value {value} is not a u32 MiB/s"), value
        if not mb.min_bandwidth <= value <= 100:
            return f"value {value} is outside [{mb.min_bandwidth},100]", value
        if value % mb.bandwidth_gran:
            return f"value {value} is not a multiple of bandwidth_gran={mb.bandwidth_gran}", value
        return None, value
    return None, None


def _first_run(mask: int) -> tuple[int, int]:
    """(first set bit, first clear bit above it); (0, 0) for an empty mask."""
    if not mask:
        return 0, 0
    first = (mask & -mask).bit_length() - 1
    zero = first
    while mask >> zero & 1:
        zero += 1
    return first, zero


def _mask_problem(l3: CacheInfo, mask: int) -> str | None:
    if mask & ~l3.cbm_mask:
        return f"mask {mask:x} has bits outside cbm_mask {l3.cbm_mask:x}"
    if mask == 0:
        return f"mask 0 is empty but min_cbm_bits is {l3.min_cbm_bits}" if l3.min_cbm_bits else None
    first, zero = _first_run(mask)
    if not l3.sparse_masks and mask >> zero:
        return f"mask {mask:x} has non-consecutive 1-bits (sparse_masks is absent or 0)"
    if zero - first < l3.min_cbm_bits:
        return f"mask {mask:x} has fewer than min_cbm_bits={l3.min_cbm_bits} consecutive bits"
    return None


def _count_violations(info: ResctrlInfo, count: int) -> list[str]:
    if count > info.num_closids:
        return [f"{count} control groups (root included) exceed num_closids={info.num_closids}"]
    return []


def _mode_violations(raws: list[_RawGroup]) -> list[str]:
    return [
        f"{group_label(r.name)}: mode {r.mode!r} is not one of {', '.join(MODES)}"
        for r in raws
        if r.mode is not None and r.mode not in MODES
    ]


def _exclusive_violations(info: ResctrlInfo, groups: list[Group]) -> list[str]:
    if info.l3 is None:
        return []
    problems = []
    for i, g in enumerate(groups):
        if g.mode != "exclusive":
            continue
        for d, mask in g.schemata.get("L3", {}).items():
            if mask & info.l3.shareable_bits:
                problems.append(
                    f"{group_label(g.name)} is exclusive but its L3 domain {d} mask {mask:x} "
                    f"overlaps shareable_bits {info.l3.shareable_bits:x}"
                )
            for j, h in enumerate(groups):
                other = h.schemata.get("L3", {}).get(d)
                if h is g or other is None or not mask & other or (h.mode == "exclusive" and j < i):
                    continue
                problems.append(
                    f"{group_label(g.name)} is exclusive but its L3 domain {d} mask {mask:x} "
                    f"overlaps {group_label(h.name)} mask {other:x}"
                )
    return problems


def _cpu_violations(info: ResctrlInfo, raws: list[_RawGroup]) -> list[str]:
    owners: dict[int, list[str]] = {}
    problems = []
    for raw in raws:
        for cpu in sorted(raw.cpus or ()):
            owners.setdefault(cpu, []).append(raw.name)
            if info.online and cpu not in info.online:
                problems.append(f"{group_label(raw.name)}: cpus_list names cpu {cpu} which is not online")
    for cpu in sorted(info.online):
        names = owners.get(cpu, [])
        if not names and all(r.cpus is not None for r in raws):
            problems.append(f"cpu {cpu} is in no group's cpus_list")
    for cpu, names in sorted(owners.items()):
        if len(names) > 1:
            problems.append(
                f"cpu {cpu} is in more than one group: {', '.join(group_label(n) for n in names)}"
            )
    return problems


def _task_violations(raws: list[_RawGroup]) -> list[str]:
    owners: dict[int, list[str]] = {}
    for raw in raws:
        for pid in raw.tasks or ():
            owners.setdefault(pid, []).append(raw.name)
    return [
        f"task {pid} is in more than one group: {', '.join(group_label(n) for n in names)}"
        for pid, names in sorted(owners.items())
        if len(names) > 1
    ]


def read_resctrl_state(root: Path, info: ResctrlInfo | None = None) -> ResctrlState:
    """The tree as a `ResctrlState`; TreeProblem if it cannot be read or breaks the kernel's rules.

    `info` replaces what info/ says (SimResctrl passes the cache sizes it read once).
    """
    root = Path(root)
    found, raws, problems = _inspect(root)
    if found is None and not problems:
        problems = [f"/{RESCTRL}/info is absent: resctrl is not mounted in this tree"]
    if problems or found is None:
        raise TreeProblem("; ".join(problems))
    assert raws[0].schemata is not None  # a valid tree has a readable root schemata
    domains = {res: tuple(vals) for res, vals in raws[0].schemata.items()}
    groups = {}
    for raw in raws:
        assert raw.schemata is not None and raw.cpus is not None
        values = {
            res: {d: int(v, 16) if res == "L3" else int(v) for d, v in raw.schemata[res].items()}
            for res in domains
        }
        groups[raw.name] = Group(raw.name, values, raw.cpus, raw.mode or "shareable", raw.tasks or ())
    return ResctrlState(info or found, domains, groups, name_width=_name_width(root))


# -- kernel operations (pure) ------------------------------------------------------------------------------


class KernelReject(Exception):
    """A write the kernel refuses: its errno and last_cmd_status text (None: the kernel leaves it as is)."""

    def __init__(self, err: int, status: str | None) -> None:
        super().__init__(err, status)
        self.errno = err
        self.status = status


def _replace_groups(state: ResctrlState, *changed: Group) -> ResctrlState:
    groups = dict(state.groups)
    for g in changed:
        groups[g.name] = g
    return state.with_groups(groups)


def op_mkdir(state: ResctrlState, name: str) -> ResctrlState:
    """A new control group: a free CLOSID, the CBM of everything not held exclusively (lowest contiguous run),
    MB at its maximum, no CPUs, mode shareable (rdtgroup_init_alloc)."""
    info = state.info
    if len(state.groups) >= info.num_closids:
        raise KernelReject(errno.ENOSPC, "Out of CLOSIDs")
    if info.num_rmids is not None and len(state.groups) >= info.num_rmids:
        raise KernelReject(errno.ENOSPC, "Out of RMIDs")
    schemata: dict[str, Mapping[int, int]] = {}
    for res, ids in state.domains.items():
        if res == "L3" and info.l3 is not None:
            schemata[res] = {d: _initial_cbm(state, info.l3, d) for d in ids}
        elif res == "MB" and info.mb is not None:
            schemata[res] = dict.fromkeys(ids, info.mb.max)
        else:
            schemata[res] = dict(state.root.schemata[res])
    return _replace_groups(state, Group(name, schemata, frozenset()))


def _initial_cbm(state: ResctrlState, l3: CacheInfo, domain: int) -> int:
    used = shared = l3.shareable_bits
    for g in state.groups.values():
        mask = g.schemata["L3"][domain]
        used |= mask
        if g.mode == "shareable":
            shared |= mask
    candidate = shared | (l3.cbm_mask & ~used)
    _, zero = _first_run(candidate)
    cbm = candidate & ((1 << zero) - 1) if candidate else 0  # cbm_ensure_valid keeps the lowest run
    if cbm.bit_count() < l3.min_cbm_bits:
        raise KernelReject(errno.ENOSPC, f"No space on L3:{domain}")
    return cbm


def op_rmdir(state: ResctrlState, name: str) -> ResctrlState:
    """Remove a group; its CPUs and tasks go back to the root group."""
    gone = state.groups[name]
    root = state.root
    groups = dict(state.groups)
    del groups[name]
    groups[""] = dataclasses.replace(
        root, cpus=root.cpus | gone.cpus, tasks=tuple(sorted(set(root.tasks) | set(gone.tasks)))
    )
    return state.with_groups(groups)


def _parse_cbm(l3: CacheInfo, text: str) -> int:
    if not _HEX.fullmatch(text):
        raise KernelReject(errno.EINVAL, f"Non-hex character in the mask {text}")
    value = int(text.lstrip("+"), 16)
    if (l3.min_cbm_bits > 0 and value == 0) or value > l3.cbm_mask:
        raise KernelReject(errno.EINVAL, "Mask out of range")
    first, zero = _first_run(value)
    if not l3.sparse_masks and value >> zero:
        raise KernelReject(errno.EINVAL, f"The mask {value:x} has non-consecutive 1-bits")
    if zero - first < l3.min_cbm_bits:
        raise KernelReject(errno.EINVAL, f"Need at least {l3.min_cbm_bits} bits in the mask")
    return value


def _parse_bw(mb: MbInfo, text: str) -> int:
    if not _DEC.fullmatch(text) or int(text) > MBA_MAX_MBPS:
        raise KernelReject(errno.EINVAL, f"Invalid MB value {text}")
    value = int(text)
    if mb.mbps:
        return value
    if not mb.min_bandwidth <= value <= 100:
        raise KernelReject(errno.EINVAL, f"MB value {value} out of range [{mb.min_bandwidth},100]")
    return -(-value // mb.bandwidth_gran) * mb.bandwidth_gran  # the kernel rounds up to a step


def op_write_schemata(state: ResctrlState, name: str, data: str) -> ResctrlState:
    """Parse and validate every line first; apply only if all domains pass (partial writes merge)."""
    if not data.endswith("\n"):
        raise KernelReject(errno.EINVAL, None)  # rejected before last_cmd_status is cleared
    group = state.groups[name]
    staged: dict[str, dict[int, int]] = {}
    for line in data[:-1].split("\n"):
        resname, sep, tok = line.partition(":")
        resname = resname.strip()
        if not sep:
            raise KernelReject(errno.EINVAL, "Missing ':'")
        if not tok:
            raise KernelReject(errno.EINVAL, f"Missing '{resname}' value")
        if resname not in state.domains:
            raise KernelReject(errno.EINVAL, f"Unknown or unsupported resource name '{resname}'")
        _parse_line(state, group, resname, tok, staged.setdefault(resname, {}))
    schemata = {res: {**vals, **staged.get(res, {})} for res, vals in group.schemata.items()}
    return _replace_groups(state, dataclasses.replace(group, schemata=schemata))


def _parse_line(state: ResctrlState, group: Group, res: str, line: str, staged: dict[int, int]) -> None:
    rest: str | None = line
    while rest:
        dom, sep, tail = rest.partition(";")
        rest = tail if sep else None
        id_text, eq, value_text = dom.partition("=")
        if not eq or not _DEC.fullmatch(id_text):
            raise KernelReject(errno.EINVAL, "Missing '=' or non-numeric domain")
        dom_id = int(id_text)
        if dom_id not in state.domains[res]:
            raise KernelReject(errno.EINVAL, "")  # the kernel fails without a message here
        if dom_id in staged:
            raise KernelReject(errno.EINVAL, f"Duplicate domain {dom_id}")
        value_text = value_text.strip()
        if res == "L3" and state.info.l3 is not None:
            value = _parse_cbm(state.info.l3, value_text)
            _check_overlap(state, group, dom_id, value)
        elif res == "MB" and state.info.mb is not None:
            value = _parse_bw(state.info.mb, value_text)
        else:  # pragma: no cover - only L3 and MB resources are modelled
            raise KernelReject(errno.EINVAL, f"Unknown or unsupported resource name '{res}'")
        staged[dom_id] = value


def _check_overlap(state: ResctrlState, group: Group, domain: int, cbm: int) -> None:
    others = [g.schemata["L3"][domain] for g in state.others(group.name)]
    exclusive = [g.schemata["L3"][domain] for g in state.others(group.name) if g.mode == "exclusive"]
    if any(cbm & m for m in exclusive):
        raise KernelReject(errno.EINVAL, "Overlaps with exclusive group")
    assert state.info.l3 is not None
    if group.mode == "exclusive" and (cbm & state.info.l3.shareable_bits or any(cbm & m for m in others)):
        raise KernelReject(errno.EINVAL, "Overlaps with other group")


def _parse_cpus(state: ResctrlState, data: str, as_list: bool) -> frozenset[int]:
    text = data.strip()
    nbits = state.info.nr_cpu_ids
    if as_list:
        try:
            cpus = parse_cpu_list(text)
        except CpuListError:
            raise KernelReject(errno.EINVAL, "Bad CPU list/mask") from None
        if any(c >= nbits for c in cpus):
            raise KernelReject(errno.ERANGE, "Bad CPU list/mask")
        return cpus
    words = text.split(",") if text else []
    if any(not re.fullmatch(r"[0-9a-fA-F]{1,8}", w) for w in words):
        raise KernelReject(errno.EINVAL, "Bad CPU list/mask")
    value = int("".join(f"{int(w, 16):08x}" for w in words) or "0", 16)
    if value >> nbits:
        raise KernelReject(errno.EOVERFLOW, "Bad CPU list/mask")
    return frozenset(i for i in range(nbits) if value >> i & 1)


def op_write_cpus(state: ResctrlState, name: str, data: str, as_list: bool) -> ResctrlState:
    """Move CPUs into a group: added CPUs leave their old group, dropped CPUs return to the root group."""
    group = state.groups[name]
    new = _parse_cpus(state, data, as_list)
    if new - state.info.online:
        raise KernelReject(errno.EINVAL, "Can only assign online CPUs")
    dropped = group.cpus - new
    if dropped and name == "":
        raise KernelReject(errno.EINVAL, "Can't drop CPUs from default group")
    added = new - group.cpus
    groups = {}
    for n, g in state.groups.items():
        if n == name:
            groups[n] = dataclasses.replace(g, cpus=new)
        else:
            groups[n] = dataclasses.replace(g, cpus=(g.cpus - added) | (dropped if n == "" else frozenset()))
    return state.with_groups(groups)


def op_write_tasks(state: ResctrlState, name: str, data: str) -> ResctrlState:
    """Move one task (pid) into the group. Without a process table every positive pid exists; 0 is a no-op."""
    text = data.strip()
    try:
        pid = int(text, 0)
    except ValueError:
        raise KernelReject(errno.EINVAL, None) from None
    if pid < 0:
        raise KernelReject(errno.EINVAL, None)
    if pid == 0:
        return state
    groups = {
        n: dataclasses.replace(g, tasks=tuple(t for t in g.tasks if t != pid))
        for n, g in state.groups.items()
    }
    groups[name] = dataclasses.replace(groups[name], tasks=tuple(sorted((*groups[name].tasks, pid))))
    return state.with_groups(groups)


def op_write_mode(state: ResctrlState, name: str, data: str) -> ResctrlState:
    if not data.endswith("\n"):
        raise KernelReject(errno.EINVAL, None)
    wanted = data[:-1]
    group = state.groups[name]
    if wanted == group.mode:
        return state
    if group.mode == "pseudo-locked":
        raise KernelReject(errno.EINVAL, "Cannot change pseudo-locked group")
    if wanted == "exclusive":
        l3 = state.info.l3
        if l3 is None or "L3" not in state.domains:
            raise KernelReject(errno.EINVAL, "Cannot be exclusive without CAT/CDP")
        for d in state.domains["L3"]:
            mask = group.schemata["L3"][d]
            if mask & l3.shareable_bits or any(mask & g.schemata["L3"][d] for g in state.others(name)):
                raise KernelReject(errno.EINVAL, "Schemata overlaps")
    elif wanted == "pseudo-locksetup":
        raise KernelReject(
            errno.EINVAL, "Cannot pseudo-lock default group" if name == "" else "Pseudo-locking not supported"
        )
    elif wanted != "shareable":
        raise KernelReject(errno.EINVAL, "Unknown or unsupported mode")
    return _replace_groups(state, dataclasses.replace(group, mode=wanted))


# -- the simulated kernel (I/O) ----------------------------------------------------------------------------


@dataclass(eq=False)
class Fault:
    """Make the next `count` matching operations fail like the kernel: OSError(errno) + last_cmd_status.

    `path_glob` is matched (fnmatch, `*` crosses `/`) against the path relative to the mount, e.g.
    "*/schemata", "schemata" (the root group's), "grp1". `op` is "write", "mkdir", "rmdir" or "*".
    `count=None` fails every matching operation until the fault is cleared.
    """

    path_glob: str
    errno: int
    message: str = ""
    count: int | None = 1
    op: str = "write"

    def matches(self, op: str, rel: str) -> bool:
        return self.op in ("*", op) and fnmatch.fnmatchcase(rel, self.path_glob)


def _put(path: Path, text: str) -> None:
    """Replace a file atomically, so a concurrent reader (or a FUSE front end) never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _norm(rel: str) -> str:
    return rel.strip("/")


class SimResctrl:
    """The kernel side of /sys/fs/resctrl over a host tree at `root` (the directory that holds `sys/`).

    Paths are relative to the mount ("schemata", "grp/cpus_list", "info/last_cmd_status"); a leading "/" is
    ignored, so a FUSE front end can pass its paths through. Every refused operation raises OSError with the
    kernel's errno; operations are serialised by a lock. Reads are plain reads of the tree.
    """

    def __init__(self, root: Path, faults: Iterable[Fault] = ()) -> None:
        self.root = Path(root)
        self.dir = self.root / RESCTRL
        try:
            info = read_info(self.root)
            domains = parse_schemata_text(_read(self.dir / "schemata")).get("L3", {})
        except (TreeProblem, ValueError) as exc:
            raise OSError(errno.ENODEV, str(exc), str(self.dir)) from None
        self.info = dataclasses.replace(info, l3_cache_bytes=_read_l3_sizes(self.root, domains))
        self._faults = list(faults)
        self._lock = threading.RLock()

    # faults

    def inject_fault(
        self, path_glob: str, err: int, message: str = "", count: int | None = 1, op: str = "write"
    ) -> Fault:
        fault = Fault(path_glob, err, message, count, op)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def pending_faults(self) -> tuple[Fault, ...]:
        return tuple(self._faults)

    def _trip_fault(self, op: str, rel: str) -> None:
        for fault in self._faults:
            if fault.matches(op, rel):
                if fault.count is not None:
                    fault.count -= 1
                    if fault.count <= 0:
                        self._faults.remove(fault)
                self._set_status(fault.message)
                raise OSError(fault.errno, os.strerror(fault.errno), rel)

    # reads

    def path(self, rel: str) -> Path:
        """The backing file of a mount path (for stat/readdir in a front end)."""
        return self.dir / _norm(rel)

    def read(self, rel: str) -> str:
        return self.path(rel).read_text()

    def listdir(self, rel: str = "") -> list[str]:
        return sorted(p.name for p in self.path(rel).iterdir() if not p.name.startswith("."))

    def groups(self) -> list[str]:
        return list_groups(self.root)

    def state(self) -> ResctrlState:
        with self._lock:
            return self._load()

    @property
    def last_cmd_status(self) -> str:
        return self.read("info/last_cmd_status").strip()

    # operations

    def mkdir(self, name: str) -> None:
        rel = _norm(name)
        with self._lock:
            self._trip_fault("mkdir", rel)
            target = self.dir / rel
            if target.exists():
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), rel)
            if "/" in rel or not rel:
                parent_exists = target.parent.is_dir()
                err = errno.EPERM if parent_exists else errno.ENOENT
                raise OSError(err, os.strerror(err), rel)  # only top-level control groups are modelled
            if "\n" in rel:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), rel)
            state = self._load()
            self._set_status("")
            new = self._apply(lambda: op_mkdir(state, rel), rel)
            target.mkdir()
            self._make_group_dirs(target)
            self._sync(new)

    def rmdir(self, name: str) -> None:
        rel = _norm(name)
        with self._lock:
            self._trip_fault("rmdir", rel)
            target = self.dir / rel
            if not rel:
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), rel)
            if not target.is_dir():
                err = errno.ENOTDIR if target.exists() else errno.ENOENT
                raise OSError(err, os.strerror(err), rel)
            if "/" in rel or rel in NON_GROUP_DIRS:
                raise OSError(errno.EPERM, os.strerror(errno.EPERM), rel)
            state = self._load()
            new = op_rmdir(state, rel)
            shutil.rmtree(target)
            self._sync(new)

    def write(self, rel_path: str, data: str | bytes) -> int:
        """Write `data` to a mount file the way `write(2)` does; returns the byte count written."""
        rel = _norm(rel_path)
        raw = data.encode() if isinstance(data, str) else data
        with self._lock:
            self._trip_fault("write", rel)
            target = self.dir / rel
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), rel)
            if not target.is_file():
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), rel)
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), rel) from None
            parts = rel.split("/")
            if parts[0] == "info":
                self._write_info(rel, text)
                return len(raw)
            group, filename = ("", parts[0]) if len(parts) == 1 else (parts[0], parts[1])
            if len(parts) > 2 or filename not in ("schemata", "cpus", "cpus_list", "tasks", "mode"):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), rel)  # read-only kernfs files
            state = self._load()
            new = self._apply(lambda: self._dispatch(state, group, filename, text), rel)
            self._sync(new)
            return len(raw)

    # internals

    @staticmethod
    def _dispatch(state: ResctrlState, group: str, filename: str, text: str) -> ResctrlState:
        if filename == "schemata":
            return op_write_schemata(state, group, text)
        if filename == "mode":
            return op_write_mode(state, group, text)
        if filename == "tasks":
            return op_write_tasks(state, group, text)
        return op_write_cpus(state, group, text, as_list=filename == "cpus_list")

    def _apply(self, op: Callable[[], ResctrlState], rel: str) -> ResctrlState:
        """Run a kernel operation; on refusal set last_cmd_status like the kernel and raise its errno."""
        try:
            new = op()
        except KernelReject as reject:
            if reject.status is not None:
                self._set_status(reject.status)
            raise OSError(reject.errno, os.strerror(reject.errno), rel) from None
        self._set_status("")
        return new

    def _write_info(self, rel: str, text: str) -> None:
        if rel != "info/L3_MON/max_threshold_occupancy":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), rel)
        try:
            value = int(text.strip(), 0)
        except ValueError:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), rel) from None
        if not 0 <= value <= max(self.info.l3_cache_bytes.values(), default=0):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), rel)
        _put(self.dir / rel, f"{value}\n")

    def _load(self) -> ResctrlState:
        try:
            return read_resctrl_state(self.root, self.info)
        except TreeProblem as exc:
            raise OSError(errno.EIO, f"resctrl tree is inconsistent: {exc}", str(self.dir)) from None

    def _set_status(self, message: str) -> None:
        text = message if message.endswith("\n") else message + "\n"
        _put(self.dir / "info/last_cmd_status", text if message.strip() else "ok\n")

    def _make_group_dirs(self, target: Path) -> None:
        """mon_groups/ and mon_data/ of a new group, mirroring the root's monitoring domains and events."""
        (target / "mon_groups").mkdir()
        root_mon = self.dir / "mon_data"
        if root_mon.is_dir():
            for domain_dir in root_mon.iterdir():
                (target / "mon_data" / domain_dir.name).mkdir(parents=True)
                for event in domain_dir.iterdir():
                    (target / "mon_data" / domain_dir.name / event.name).write_text("0\n")

    def _sync(self, state: ResctrlState) -> None:
        """Write the files whose rendering changed, and the derived info/L3/bit_usage."""
        for name, group in state.groups.items():
            base = self.dir / name if name else self.dir
            for filename, text in render_group_files(state, group).items():
                path = base / filename
                if not path.is_file() or path.read_text() != text:
                    _put(path, text)
        bit_usage = self.dir / "info/L3/bit_usage"
        if bit_usage.parent.is_dir():
            text = render_bit_usage(state)
            if not bit_usage.is_file() or bit_usage.read_text() != text:
                _put(bit_usage, text)
