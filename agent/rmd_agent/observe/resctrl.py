"""The resctrl filesystem as it is: whether it is mounted, what info/ says the hardware can do, and the
groups that exist (ours and anyone else's). Read-only; the applier is the only writer."""

from __future__ import annotations

from dataclasses import dataclass, field

from rmd_agent.errors import HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_api.cpuset import CpuListError, parse_cpu_list

RESCTRL = "sys/fs/resctrl"

# resource name -> {domain id -> value as written ("7ff" for caches, "100" for MB)}
Schemata = dict[str, dict[int, str]]


def parse_schemata(text: str) -> Schemata:
    """Parse a group's schemata file ("L3:0=7ff;1=7ff" per line, leading spaces allowed)."""
    result: Schemata = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        resource, sep, domains = line.partition(":")
        if not sep:
            raise ValueError(f"schemata line {line!r} has no 'RESOURCE:' prefix")
        values: dict[int, str] = {}
        for item in filter(None, (d.strip() for d in domains.split(";"))):
            domain, eq, value = item.partition("=")
            if not eq:
                raise ValueError(f"schemata item {item!r} is not ID=VALUE")
            values[int(domain)] = value.strip()
        result[resource.strip()] = values
    return result


def format_schemata_line(resource: str, values: dict[int, str]) -> str:
    return f"{resource}:" + ";".join(f"{domain}={values[domain]}" for domain in sorted(values))


@dataclass(frozen=True)
class CacheInfo:
    """info/L3 (or L3CODE/L3DATA with CDP)."""

    cbm_mask: int
    min_cbm_bits: int
    num_closids: int
    shareable_bits: int
    sparse_masks: bool  # False when the file is absent: the CPU needs contiguous masks
    cdp: bool

    @property
    def ways(self) -> int:
        return self.cbm_mask.bit_count()


@dataclass(frozen=True)
class MbaInfo:
    """info/MB: memory bandwidth allocation."""

    min_bandwidth: int
    bandwidth_gran: int
    delay_linear: bool
    num_closids: int
    mbps: bool  # mounted with mba_MBps: values are MiB/s, not percentages


@dataclass(frozen=True)
class ResctrlGroup:
    name: str  # "" for the root (default) group
    schemata: Schemata
    cpus: frozenset[int]
    mode: str


@dataclass(frozen=True)
class ResctrlState:
    mount_options: frozenset[str]
    l3: CacheInfo | Unsupported
    mba: MbaInfo | Unsupported
    root: ResctrlGroup
    groups: tuple[ResctrlGroup, ...] = field(default=())  # every non-root control group, sorted by name
    last_cmd_status: str = ""

    @property
    def num_closids(self) -> int:
        """The kernel's limit is the minimum over the enabled resources; the root group uses CLOS 0."""
        limits = [r.num_closids for r in (self.l3, self.mba) if not isinstance(r, Unsupported)]
        return min(limits) if limits else 0


def _mount_options(fs: HostFS) -> frozenset[str] | None:
    """Options of the resctrl mount from proc/mounts, or None when proc/mounts names no resctrl mount."""
    try:
        mounts = fs.read_text("proc/mounts")
    except HostReadError:
        return None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "resctrl":
            return frozenset(parts[3].split(","))
    return None


def _not_mounted_reason(fs: HostFS) -> str:
    """Tell "the CPU cannot" apart from "nobody mounted it", since only the second is fixable."""
    try:
        cpuinfo = fs.read_text("proc/cpuinfo")
    except HostReadError:
        return f"resctrl is not mounted at /{RESCTRL}"
    flags = next((ln.partition(":")[2].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), [])
    if "rdt_a" not in flags and "cat_l3" not in flags:
        return "the CPU has no RDT allocation (no rdt_a or cat_l3 flag in /proc/cpuinfo)"
    return f"the CPU supports RDT but resctrl is not mounted: mount -t resctrl resctrl /{RESCTRL}"


def _read_cache_info(fs: HostFS) -> CacheInfo | Unsupported:
    names = [n for n in ("L3", "L3DATA") if fs.is_dir(f"{RESCTRL}/info/{n}")]
    if not names:
        return Unsupported("no L3 cache allocation (resctrl info/L3 is absent)")
    base = f"{RESCTRL}/info/{names[0]}"
    try:
        sparse = fs.exists(f"{base}/sparse_masks") and fs.read_int(f"{base}/sparse_masks") == 1
        return CacheInfo(
            cbm_mask=fs.read_int(f"{base}/cbm_mask", 16),
            min_cbm_bits=fs.read_int(f"{base}/min_cbm_bits"),
            num_closids=fs.read_int(f"{base}/num_closids"),
            shareable_bits=fs.read_int(f"{base}/shareable_bits", 16),
            sparse_masks=sparse,
            cdp=names[0] == "L3DATA",
        )
    except HostReadError as exc:
        return Unsupported(f"unreadable L3 allocation info: {exc}")


def _read_mba_info(fs: HostFS, options: frozenset[str]) -> MbaInfo | Unsupported:
    base = f"{RESCTRL}/info/MB"
    if not fs.is_dir(base):
        return Unsupported("no memory bandwidth allocation (resctrl info/MB is absent)")
    try:
        return MbaInfo(
            min_bandwidth=fs.read_int(f"{base}/min_bandwidth"),
            bandwidth_gran=fs.read_int(f"{base}/bandwidth_gran"),
            delay_linear=fs.exists(f"{base}/delay_linear") and fs.read_int(f"{base}/delay_linear") == 1,
            num_closids=fs.read_int(f"{base}/num_closids"),
            mbps="mba_MBps" in options,
        )
    except HostReadError as exc:
        return Unsupported(f"unreadable memory bandwidth info: {exc}")


def read_group(fs: HostFS, name: str) -> ResctrlGroup:
    """One control group ("" is the root). Raises HostReadError if it vanished or is malformed."""
    base = f"{RESCTRL}/{name}" if name else RESCTRL
    try:
        schemata = parse_schemata(fs.read_text(f"{base}/schemata"))
        cpus = parse_cpu_list(fs.read_text(f"{base}/cpus_list"))
    except (ValueError, CpuListError) as exc:
        raise HostReadError(f"{base}/schemata", str(exc)) from exc
    mode = fs.read_str(f"{base}/mode") if fs.exists(f"{base}/mode") else "shareable"
    return ResctrlGroup(name=name, schemata=schemata, cpus=cpus, mode=mode)


def list_group_names(fs: HostFS) -> list[str]:
    """Control groups are the directories of the mount other than info/ and mon_groups/ (monitoring only)."""
    return [
        e
        for e in fs.listdir(RESCTRL)
        if e not in ("info", "mon_groups", "mon_data") and fs.is_dir(f"{RESCTRL}/{e}")
    ]


def read_resctrl(fs: HostFS) -> ResctrlState | Unsupported:
    if not fs.is_dir(f"{RESCTRL}/info"):
        return Unsupported(_not_mounted_reason(fs))
    options = _mount_options(fs) or frozenset()
    try:
        root = read_group(fs, "")
        groups = tuple(read_group(fs, name) for name in list_group_names(fs))
        status = (
            fs.read_str(f"{RESCTRL}/info/last_cmd_status")
            if fs.exists(f"{RESCTRL}/info/last_cmd_status")
            else ""
        )
    except HostReadError as exc:
        return Unsupported(f"resctrl is mounted but unreadable: {exc}")
    return ResctrlState(
        mount_options=options,
        l3=_read_cache_info(fs),
        mba=_read_mba_info(fs, options),
        root=root,
        groups=groups,
        last_cmd_status=status,
    )
