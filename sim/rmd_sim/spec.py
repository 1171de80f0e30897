"""The description of a simulated node: CPU topology, caches, RDT, RAPL, cpufreq, memory and kubelet settings.

A `NodeSpec` is small and frozen; `rmd_sim.hosttree` turns it into a sysfs/procfs tree. `load_spec` accepts
the built-in names ("default", "large") or a YAML/JSON file whose keys override a base spec, so a test can
describe an odd machine in three lines.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rmd_api.cpuset import CpuListError, parse_cpu_list

GIB = 1024**3
RAPL_ZONE_KINDS = ("package", "dram", "core", "uncore", "psys")
RAPL_SUBZONE_KINDS = ("dram", "core", "uncore")
CPUFREQ_DRIVERS = ("intel_pstate", "intel_cpufreq", "acpi-cpufreq", "amd-pstate")
SPEC_FILE = ".rmd-sim/spec.json"  # where rmd_sim.hosttree saves the spec of a tree it writes


class SpecError(ValueError):
    """A node spec that cannot describe a real machine, or a spec file with unknown or mistyped keys."""


@dataclass(frozen=True)
class NodeSpec:
    """One simulated node. CPUs are numbered the Linux way (see `cpu_id`)."""

    name: str = "default"
    # topology
    sockets: int = 2
    cores_per_socket: int = 16
    threads_per_core: int = 2
    # a multiple of sockets: each socket splits into numa_nodes/sockets equal nodes (sub-NUMA clustering)
    numa_nodes: int = 2
    # caches; L3 is one domain per socket (with SNC the kernel still reports one L3 per socket)
    l1d_kib: int = 32
    l1i_kib: int = 32
    l2_kib: int = 1024
    l3_bytes: int = 22528 * 1024  # Cascade Lake Gold 6242: 16 cores, 22 MiB, 11 ways
    l3_ways: int = 11
    # RDT / resctrl
    rdt: bool = True  # the CPU has RDT allocation (cpuinfo flags rdt_a cat_l3)
    resctrl_mounted: bool = True
    cbm_mask: str = "7ff"
    min_cbm_bits: int = 1
    num_closids: int = 16
    sparse_masks: int | None = None  # None: info/L3/sparse_masks absent (older kernels); 0 or 1 otherwise
    shareable_bits: str = "0"
    l3_cdp_capable: bool = True  # widens the schemata name column to "L3CODE" even with CDP off
    mba: bool = True
    mba_min_bandwidth: int = 10
    mba_bandwidth_gran: int = 10
    mba_mbps: bool = False  # mounted with -o mba_MBps: MB values are MiB/s, not percent
    l3_mon: bool = True
    num_rmids: int = 176
    # RAPL (powercap)
    rapl_zones: tuple[str, ...] = ("package", "dram")  # per socket; "psys" adds one platform zone; () = none
    rapl_mmio_duplicate: bool = False
    # cpufreq
    cpufreq: bool = True
    cpufreq_driver: str = "intel_pstate"
    cpufreq_min_khz: int = 800_000
    cpufreq_max_khz: int = 3_500_000
    # memory per NUMA node
    memory_per_numa_bytes: int = 64 * GIB
    hugepages_2m_per_numa: int = 1024
    hugepages_1g_per_numa: int = 4
    # cgroups and kubelet
    cgroup_version: int = 2
    cgroup_driver: str = "systemd"
    cpu_manager_policy: str = "static"
    topology_manager_policy: str = "single-numa-node"
    topology_manager_scope: str = "container"
    memory_manager_policy: str = "None"
    reserved_cpus: str = "0"  # kubelet reservedSystemCPUs, a cpu list; "" = none

    def __post_init__(self) -> None:
        _validate(self)

    # -- derived values -------------------------------------------------------------------------------

    @classmethod
    def default(cls) -> NodeSpec:
        """2 sockets x 16 cores x 2 threads (64 CPUs), 2 NUMA nodes, 11-way L3, 16 CLOS, MBA, RAPL."""
        return cls()

    @classmethod
    def large(cls) -> NodeSpec:
        """256 CPUs over 8 NUMA nodes: 2 sockets x 64 cores x 2 threads with sub-NUMA clustering (SNC4).

        Modelled on a 64-core Sapphire/Emerald Rapids class Xeon: 15-way L3 (cbm 7fff) of 120 MiB per socket.
        With SNC the kernel still reports one L3 cache (one resctrl domain) per socket, so there are 2 cache
        ids but 8 NUMA nodes; the node distance is 12 inside a socket and 21 across.
        """
        return cls(
            name="large",
            cores_per_socket=64,
            numa_nodes=8,
            l1d_kib=48,
            l2_kib=2048,
            l3_bytes=120 * 1024 * 1024,
            l3_ways=15,
            cbm_mask="7fff",
            num_rmids=256,
            cpufreq_max_khz=3_800_000,
            memory_per_numa_bytes=64 * GIB,
        )

    @property
    def cores(self) -> int:
        return self.sockets * self.cores_per_socket

    @property
    def cpus(self) -> int:
        return self.cores * self.threads_per_core

    @property
    def numa_per_socket(self) -> int:
        return self.numa_nodes // self.sockets

    @property
    def cbm_len(self) -> int:
        return int(self.cbm_mask, 16).bit_length()

    def cpu_id(self, socket: int, core: int, thread: int) -> int:
        """Linux numbering: the first thread of every core (all sockets), then the siblings."""
        return thread * self.cores + socket * self.cores_per_socket + core

    def cpu_location(self, cpu: int) -> tuple[int, int, int]:
        """(socket, core within socket, thread) of a CPU number."""
        thread, rest = divmod(cpu, self.cores)
        socket, core = divmod(rest, self.cores_per_socket)
        return socket, core, thread

    def numa_node_of(self, cpu: int) -> int:
        socket, core, _ = self.cpu_location(cpu)
        cores_per_node = self.cores_per_socket // self.numa_per_socket
        return socket * self.numa_per_socket + core // cores_per_node

    def socket_of_node(self, node: int) -> int:
        return node // self.numa_per_socket

    def cpus_of_socket(self, socket: int) -> list[int]:
        return sorted(
            self.cpu_id(socket, c, t)
            for c in range(self.cores_per_socket)
            for t in range(self.threads_per_core)
        )

    def cpus_of_node(self, node: int) -> list[int]:
        return [cpu for cpu in range(self.cpus) if self.numa_node_of(cpu) == node]

    def thread_siblings(self, cpu: int) -> list[int]:
        socket, core, _ = self.cpu_location(cpu)
        return [self.cpu_id(socket, core, t) for t in range(self.threads_per_core)]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["rapl_zones"] = list(self.rapl_zones)
        return data


def _validate(spec: NodeSpec) -> None:
    positive = ("sockets", "cores_per_socket", "threads_per_core", "numa_nodes", "l3_ways", "num_closids")
    for field in positive:
        if getattr(spec, field) < 1:
            raise SpecError(f"{field} must be at least 1, got {getattr(spec, field)}")
    if spec.numa_nodes % spec.sockets:
        raise SpecError(f"numa_nodes ({spec.numa_nodes}) must be a multiple of sockets ({spec.sockets})")
    if spec.cores_per_socket % spec.numa_per_socket:
        raise SpecError(
            f"cores_per_socket ({spec.cores_per_socket}) must split evenly over "
            f"{spec.numa_per_socket} NUMA nodes per socket"
        )
    try:
        cbm = int(spec.cbm_mask, 16)
        shareable = int(spec.shareable_bits, 16)
    except ValueError:
        raise SpecError(f"cbm_mask {spec.cbm_mask!r} and shareable_bits must be hex") from None
    if cbm != (1 << spec.l3_ways) - 1:
        raise SpecError(
            f"cbm_mask {spec.cbm_mask} does not match l3_ways={spec.l3_ways} "
            f"(expected {(1 << spec.l3_ways) - 1:x}); set both or only l3_ways"
        )
    if shareable & ~cbm:
        raise SpecError(f"shareable_bits {spec.shareable_bits} lies outside cbm_mask {spec.cbm_mask}")
    if not 0 <= spec.min_cbm_bits <= spec.l3_ways:
        raise SpecError(f"min_cbm_bits must be within 0..l3_ways, got {spec.min_cbm_bits}")
    if spec.sparse_masks not in (None, 0, 1):
        raise SpecError(f"sparse_masks must be null, 0 or 1, got {spec.sparse_masks!r}")
    if spec.num_closids > 32:
        raise SpecError("num_closids above 32 is not something any CPU reports")
    if spec.resctrl_mounted and not spec.rdt:
        raise SpecError("resctrl_mounted needs rdt: the kernel refuses to mount resctrl without RDT")
    if not 1 <= spec.mba_min_bandwidth <= 100 or not 1 <= spec.mba_bandwidth_gran <= 100:
        raise SpecError("mba_min_bandwidth and mba_bandwidth_gran must be within 1..100")
    for zone in spec.rapl_zones:
        if zone not in RAPL_ZONE_KINDS:
            raise SpecError(f"unknown RAPL zone {zone!r}; known: {', '.join(RAPL_ZONE_KINDS)}")
    if len(set(spec.rapl_zones)) != len(spec.rapl_zones):
        raise SpecError(f"rapl_zones repeats a zone: {spec.rapl_zones}")
    if any(z in RAPL_SUBZONE_KINDS for z in spec.rapl_zones) and "package" not in spec.rapl_zones:
        raise SpecError("RAPL dram/core/uncore zones are subzones of package: add 'package'")
    if spec.rapl_mmio_duplicate and "package" not in spec.rapl_zones:
        raise SpecError("rapl_mmio_duplicate duplicates package-0: add 'package' to rapl_zones")
    if spec.cpufreq_driver not in CPUFREQ_DRIVERS:
        raise SpecError(
            f"unknown cpufreq_driver {spec.cpufreq_driver!r}; known: {', '.join(CPUFREQ_DRIVERS)}"
        )
    if not 0 < spec.cpufreq_min_khz <= spec.cpufreq_max_khz:
        raise SpecError("cpufreq_min_khz must be positive and not above cpufreq_max_khz")
    if spec.cgroup_version not in (1, 2):
        raise SpecError(f"cgroup_version must be 1 or 2, got {spec.cgroup_version}")
    if spec.cgroup_driver not in ("systemd", "cgroupfs"):
        raise SpecError(f"cgroup_driver must be systemd or cgroupfs, got {spec.cgroup_driver!r}")
    hugepage_bytes = spec.hugepages_2m_per_numa * 2 * 1024**2 + spec.hugepages_1g_per_numa * GIB
    if spec.hugepages_2m_per_numa < 0 or spec.hugepages_1g_per_numa < 0:
        raise SpecError("hugepage counts cannot be negative")
    if hugepage_bytes > spec.memory_per_numa_bytes // 2:
        raise SpecError("hugepages take more than half of a NUMA node's memory; lower the counts")
    _validate_reserved(spec)


def _validate_reserved(spec: NodeSpec) -> None:
    try:
        reserved = parse_cpu_list(spec.reserved_cpus)
    except CpuListError as exc:
        raise SpecError(f"reserved_cpus: {exc}") from None
    if reserved and max(reserved) >= spec.cpus:
        raise SpecError(
            f"reserved_cpus {spec.reserved_cpus!r} names CPUs beyond the {spec.cpus} the node has"
        )


BUILTIN_SPECS = {"default": NodeSpec.default, "large": NodeSpec.large}


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(NodeSpec)


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Check a spec file value against the field's type; lists become tuples. Bools are not ints here."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        hint = next(o for o in options if o is not type(None))
        origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise SpecError(f"{key} must be a list of strings, got {value!r}")
        return tuple(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise SpecError(f"{key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{key} must be an integer, got {value!r}")
        return value
    if hint is str:
        if isinstance(value, int) and not isinstance(value, bool) and key in ("cbm_mask", "shareable_bits"):
            raise SpecError(f'{key} must be a quoted hex string ("{value}"), not a number')
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # reserved_cpus: 0 is a valid cpu list
        if not isinstance(value, str):
            raise SpecError(f"{key} must be a string, got {value!r}")
        return value
    raise SpecError(f"{key}: unsupported field type {hint!r}")  # pragma: no cover - all fields covered above


def spec_from_mapping(data: Mapping[str, Any], base: NodeSpec | None = None) -> NodeSpec:
    """Override `base` (default spec unless data names `base: large`) with the keys of `data`.

    Setting l3_ways without cbm_mask derives the mask, since real CPUs report one bit per way.
    """
    overrides = dict(data)
    base_name = overrides.pop("base", None)
    if base_name is not None:
        if base_name not in BUILTIN_SPECS:
            raise SpecError(f"base must be one of {', '.join(BUILTIN_SPECS)}, got {base_name!r}")
        base = BUILTIN_SPECS[base_name]()
    base = base or NodeSpec.default()
    hints = _field_types()
    unknown = sorted(set(overrides) - set(hints))
    if unknown:
        raise SpecError(f"unknown spec key(s): {', '.join(unknown)}; valid keys: base, {', '.join(hints)}")
    values = {key: _coerce(key, value, hints[key]) for key, value in overrides.items()}
    if "l3_ways" in values and "cbm_mask" not in values:
        values["cbm_mask"] = f"{(1 << values['l3_ways']) - 1:x}"
    return dataclasses.replace(base, **values)


def load_spec(name_or_path: str | Path) -> NodeSpec:
    """A built-in spec by name ("default", "large") or a YAML/JSON file of overrides."""
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_SPECS:
        return BUILTIN_SPECS[name_or_path]()
    path = Path(name_or_path)
    if not path.is_file():
        raise SpecError(f"no built-in spec or file named {str(name_or_path)!r} (built-in: default, large)")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of spec keys, got {type(data).__name__}")
    if "name" not in data:
        data["name"] = path.stem
    try:
        return spec_from_mapping(data)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None


def read_tree_spec(root: Path) -> NodeSpec:
    """The spec a tree was written from (its .rmd-sim/spec.json)."""
    path = Path(root) / SPEC_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{root} is not a simulated host tree (no {SPEC_FILE})") from None
    return spec_from_mapping(data)
