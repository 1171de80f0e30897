"""Reading a resctrl tree as files: info/ (what the hardware and mount allow), the list of control groups, and
each group's files as found, with every part that cannot be read reported rather than raised."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rmd_api.cpuset import CpuListError, format_cpu_list, parse_cpu_list, parse_cpu_mask
from rmd_sim.resctrl.model import (
    DECIMAL,
    NON_GROUP_DIRS,
    RESCTRL,
    CacheInfo,
    MbInfo,
    ResctrlInfo,
    group_label,
)


class TreeProblem(Exception):
    """A file of the resctrl tree is missing or does not parse."""


def read_file(path: Path) -> str:
    """The file's text; TreeProblem naming it if it cannot be read."""
    try:
        return path.read_text()
    except OSError as exc:
        raise TreeProblem(f"{path.name}: cannot read ({exc.strerror})") from None


def _read_int(path: Path, base: int = 10) -> int:
    text = read_file(path).strip()
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
            if not eq or not DECIMAL.fullmatch(dom.strip()) or not value.strip():
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


def read_l3_sizes(root: Path, ids: Iterable[int]) -> dict[int, int]:
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
class RawGroup:
    """A group as read, each part None when it could not be read (the reason is in the problems list)."""

    name: str
    schemata: dict[str, dict[int, str]] | None
    cpus: frozenset[int] | None
    mode: str | None
    tasks: tuple[int, ...] | None


def read_raw_group(root: Path, name: str, problems: list[str]) -> RawGroup:
    base = root / RESCTRL / name if name else root / RESCTRL
    label = group_label(name)
    raw = RawGroup(name, None, None, None, None)
    try:
        raw.schemata = parse_schemata_text(read_file(base / "schemata"))
    except (TreeProblem, ValueError) as exc:
        problems.append(f"{label}: schemata: {exc}")
    try:
        raw.cpus = parse_cpu_list(read_file(base / "cpus_list"))
    except (TreeProblem, CpuListError) as exc:
        problems.append(f"{label}: cpus_list: {exc}")
    if raw.cpus is not None and (base / "cpus").is_file():
        text = read_file(base / "cpus").strip()
        try:
            in_mask = parse_cpu_mask(text)
        except ValueError:
            problems.append(f"{label}: cpus {text!r} is not a hex cpumask")
        else:
            if in_mask != raw.cpus:
                problems.append(f"{label}: cpus {text} and cpus_list {format_cpu_list(raw.cpus)!r} disagree")
    try:
        raw.mode = read_file(base / "mode").strip() if (base / "mode").exists() else "shareable"
    except TreeProblem as exc:
        problems.append(f"{label}: mode: {exc}")
    try:
        tasks_text = read_file(base / "tasks") if (base / "tasks").exists() else ""
        raw.tasks = tuple(int(t) for t in tasks_text.split())
    except (TreeProblem, ValueError) as exc:
        problems.append(f"{label}: tasks: {exc}")
    return raw


def read_name_width(root: Path) -> int:
    """The schemata name column width, as the root schemata shows it."""
    first = next((ln for ln in read_file(root / RESCTRL / "schemata").splitlines() if ln.strip()), "")
    return len(first.partition(":")[0]) or 2
