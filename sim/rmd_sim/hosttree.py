"""Write a simulated node's host tree: the real sysfs/procfs/kubelet layout under any directory.

The agent reads a host root (`/` in production, a temp dir in tests) through relative paths, so the files here
use the kernel's exact paths and formats: cpu topology and caches, cpufreq, NUMA nodes with meminfo and
hugepages, resctrl (info/ and the root group), powercap RAPL zones behind sys/class symlinks, cgroups, the
kubelet config, /proc/mounts and /proc/cpuinfo. The spec is saved in `.rmd-sim/spec.json` so tools can
recover it from a tree. The simulated kubelet writes cpu_manager_state and the PodResources socket, not this.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from rmd_api.cpuset import format_cpu_list, parse_cpu_list
from rmd_sim import resctrl
from rmd_sim.perf import write_perf_counters
from rmd_sim.spec import SPEC_FILE, NodeSpec

MAX_ENERGY_RANGE_UJ = 262_143_328_850
CPU_DIR = "sys/devices/system/cpu"
NODE_DIR = "sys/devices/system/node"
POWERCAP_DEVICES = "sys/devices/virtual/powercap"
POWERCAP_CLASS = "sys/class/powercap"
CACHE_LINE = 64


@dataclass(frozen=True)
class RaplZoneDir:
    """One powercap zone of a simulated tree, e.g. intel-rapl:0:0 named dram."""

    zone_id: str  # "intel-rapl:0", "intel-rapl:0:0", "intel-rapl-mmio:0"
    name: str  # "package-0", "dram", "core", "uncore", "psys"
    rel_dir: str  # the real directory, under sys/devices/virtual/powercap
    initial_energy_uj: int

    @property
    def class_link(self) -> str:
        """The sys/class/powercap entry readers use (a symlink to rel_dir)."""
        return f"{POWERCAP_CLASS}/{self.zone_id}"


def rapl_zones(spec: NodeSpec) -> list[RaplZoneDir]:
    """The powercap zones a spec produces: package-N per socket with its subzones, then psys, then MMIO."""
    if not spec.rapl_zones:
        return []
    zones: list[RaplZoneDir] = []
    subzones = [z for z in spec.rapl_zones if z in ("core", "uncore", "dram")]
    top = f"{POWERCAP_DEVICES}/intel-rapl"
    if "package" in spec.rapl_zones:
        for socket in range(spec.sockets):
            package = f"{top}/intel-rapl:{socket}"
            zones.append(
                RaplZoneDir(f"intel-rapl:{socket}", f"package-{socket}", package, _energy(socket, 0))
            )
            for i, kind in enumerate(subzones):
                zone_id = f"intel-rapl:{socket}:{i}"
                zones.append(RaplZoneDir(zone_id, kind, f"{package}/{zone_id}", _energy(socket, i + 1)))
    if "psys" in spec.rapl_zones:
        index = spec.sockets if "package" in spec.rapl_zones else 0
        zones.append(
            RaplZoneDir(f"intel-rapl:{index}", "psys", f"{top}/intel-rapl:{index}", _energy(index, 9))
        )
    if spec.rapl_mmio_duplicate:
        mmio = f"{POWERCAP_DEVICES}/intel-rapl-mmio/intel-rapl-mmio:0"
        zones.append(RaplZoneDir("intel-rapl-mmio:0", "package-0", mmio, _energy(0, 0)))
    return zones


def _energy(index: int, sub: int) -> int:
    """Distinct, deterministic starting counters well inside the wrap range."""
    return 40_000_000_000 + index * 7_000_000_000 + sub * 1_100_000_000


class _Tree:
    def __init__(self, root: Path) -> None:
        self.root = root

    def file(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def dir(self, rel: str) -> None:
        (self.root / rel).mkdir(parents=True, exist_ok=True)

    def link(self, rel: str, target_rel: str) -> None:
        """A relative symlink at `rel` pointing at `target_rel` (both relative to the root), as sysfs has."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(self.root / target_rel, path.parent), path)


def write_host_tree(spec: NodeSpec, out: Path, *, replace: bool = False) -> None:
    """Write the host tree of `spec` under `out`, which must be absent or empty.

    With replace=True an earlier simulated tree (one holding .rmd-sim/spec.json) is removed first; any other
    non-empty directory is refused so a wrong --out never deletes real files.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not (replace and (out / SPEC_FILE).is_file()):
            hint = (
                " (add replace=True / --force to overwrite a simulated tree)"
                if (out / SPEC_FILE).is_file()
                else ""
            )
            raise FileExistsError(f"{out} is not empty{hint}")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    tree = _Tree(out)
    _write_cpus(spec, tree)
    _write_nodes(spec, tree)
    _write_proc(spec, tree)
    if spec.resctrl_mounted:
        _write_resctrl(spec, tree)
    _write_powercap(spec, tree)
    _write_cgroups(spec, tree)
    _write_kubelet(spec, tree)
    write_perf_counters(out, range(spec.cpus))  # the simulated hardware counters P-state monitoring reads
    tree.file(SPEC_FILE, json.dumps(spec.to_dict(), indent=2, sort_keys=True) + "\n")


# -- cpus, caches, cpufreq ---------------------------------------------------------------------------------


def _mask(spec: NodeSpec, cpus: list[int]) -> str:
    return resctrl.format_cpu_mask(cpus, spec.cpus) + "\n"


def _write_cpus(spec: NodeSpec, tree: _Tree) -> None:
    all_cpus = format_cpu_list(range(spec.cpus)) + "\n"
    for name in ("online", "possible", "present"):
        tree.file(f"{CPU_DIR}/{name}", all_cpus)
    tree.file(f"{CPU_DIR}/offline", "\n")
    tree.file(f"{CPU_DIR}/kernel_max", "8191\n")
    for cpu in range(spec.cpus):
        base = f"{CPU_DIR}/cpu{cpu}"
        if cpu:
            tree.file(f"{base}/online", "1\n")  # cpu0 cannot be offlined, so it has no online file
        _write_topology(spec, tree, cpu)
        _write_caches(spec, tree, cpu)
        if spec.cpufreq:
            _write_cpufreq(spec, tree, cpu)
        tree.link(f"{base}/node{spec.numa_node_of(cpu)}", f"{NODE_DIR}/node{spec.numa_node_of(cpu)}")


def _write_topology(spec: NodeSpec, tree: _Tree, cpu: int) -> None:
    socket, core, _ = spec.cpu_location(cpu)
    siblings = spec.thread_siblings(cpu)
    package = spec.cpus_of_socket(socket)
    base = f"{CPU_DIR}/cpu{cpu}/topology"
    files = {
        "physical_package_id": f"{socket}\n",
        "core_id": f"{core}\n",
        "die_id": "0\n",
        "thread_siblings_list": format_cpu_list(siblings) + "\n",
        "thread_siblings": _mask(spec, siblings),
        "core_cpus_list": format_cpu_list(siblings) + "\n",
        "core_siblings_list": format_cpu_list(package) + "\n",
        "core_siblings": _mask(spec, package),
        "package_cpus_list": format_cpu_list(package) + "\n",
        "package_cpus": _mask(spec, package),
    }
    for name, text in files.items():
        tree.file(f"{base}/{name}", text)


def _write_caches(spec: NodeSpec, tree: _Tree, cpu: int) -> None:
    socket, core, _ = spec.cpu_location(cpu)
    siblings = spec.thread_siblings(cpu)
    core_uid = socket * spec.cores_per_socket + core
    caches = [
        (1, "Data", spec.l1d_kib * 1024, max(1, spec.l1d_kib // 4), core_uid, siblings),
        (1, "Instruction", spec.l1i_kib * 1024, 8, core_uid, siblings),
        (2, "Unified", spec.l2_kib * 1024, 16, core_uid, siblings),
        (3, "Unified", spec.l3_bytes, spec.l3_ways, socket, spec.cpus_of_socket(socket)),
    ]
    for index, (level, kind, size, ways, cache_id, shared) in enumerate(caches):
        base = f"{CPU_DIR}/cpu{cpu}/cache/index{index}"
        files = {
            "level": f"{level}\n",
            "type": f"{kind}\n",
            "id": f"{cache_id}\n",
            "shared_cpu_list": format_cpu_list(shared) + "\n",
            "shared_cpu_map": _mask(spec, shared),
            "size": f"{size // 1024}K\n",
            "ways_of_associativity": f"{ways}\n",
            "coherency_line_size": f"{CACHE_LINE}\n",
            "number_of_sets": f"{size // (ways * CACHE_LINE)}\n",
        }
        for name, text in files.items():
            tree.file(f"{base}/{name}", text)


def _governors(spec: NodeSpec) -> tuple[str, str]:
    if spec.cpufreq_driver == "intel_pstate":
        return "performance powersave", "powersave"
    return "conservative ondemand userspace powersave performance schedutil", "schedutil"


def _write_cpufreq(spec: NodeSpec, tree: _Tree, cpu: int) -> None:
    """One policy per CPU (as intel_pstate has) under cpu/cpufreq/policyN, linked from cpuN/cpufreq."""
    policy = f"{CPU_DIR}/cpufreq/policy{cpu}"
    available, governor = _governors(spec)
    cur = (spec.cpufreq_min_khz + spec.cpufreq_max_khz) // 2 // 100_000 * 100_000
    files = {
        "affected_cpus": f"{cpu}\n",
        "related_cpus": f"{cpu}\n",
        "cpuinfo_min_freq": f"{spec.cpufreq_min_khz}\n",
        "cpuinfo_max_freq": f"{spec.cpufreq_max_khz}\n",
        "scaling_min_freq": f"{spec.cpufreq_min_khz}\n",
        "scaling_max_freq": f"{spec.cpufreq_max_khz}\n",
        "scaling_cur_freq": f"{max(cur, spec.cpufreq_min_khz)}\n",
        "scaling_driver": f"{spec.cpufreq_driver}\n",
        "scaling_governor": f"{governor}\n",
        "scaling_available_governors": f"{available}\n",
    }
    for name, text in files.items():
        tree.file(f"{policy}/{name}", text)
    tree.link(f"{CPU_DIR}/cpu{cpu}/cpufreq", policy)


# -- NUMA nodes --------------------------------------------------------------------------------------------


def _distance(spec: NodeSpec, a: int, b: int) -> int:
    if a == b:
        return 10
    return 12 if spec.socket_of_node(a) == spec.socket_of_node(b) else 21


def _meminfo(spec: NodeSpec, node: int) -> str:
    """The kernel's per-node meminfo: `Node 0 MemTotal:       67108864 kB` (label to 16, value to 8)."""
    total = spec.memory_per_numa_bytes // 1024
    huge = spec.hugepages_2m_per_numa * 2048 + spec.hugepages_1g_per_numa * 1024 * 1024
    base_used = total // 20  # what the OS and page cache hold on an idle node
    free = total - huge - base_used
    kb_lines = [
        ("MemTotal", total),
        ("MemFree", free),
        ("MemUsed", total - free),
        ("SwapCached", 0),
        ("Active", base_used // 2),
        ("Inactive", base_used // 4),
        ("Active(anon)", base_used // 8),
        ("Inactive(anon)", 0),
        ("Active(file)", base_used // 2 - base_used // 8),
        ("Inactive(file)", base_used // 4),
        ("Unevictable", 0),
        ("Mlocked", 0),
        ("Dirty", 0),
        ("Writeback", 0),
        ("FilePages", base_used // 2),
        ("Mapped", base_used // 16),
        ("AnonPages", base_used // 8),
        ("Shmem", base_used // 64),
        ("KernelStack", 16384),
        ("PageTables", 8192),
        ("Slab", base_used // 16),
        ("SReclaimable", base_used // 32),
        ("SUnreclaim", base_used // 32),
        ("AnonHugePages", 0),
        ("ShmemHugePages", 0),
        ("FileHugePages", 0),
    ]
    lines = [f"Node {node} {label + ':':<16}{value:>8} kB" for label, value in kb_lines]
    pages = spec.hugepages_2m_per_numa  # HugePages_* count the default (2 MiB) size only
    lines += [
        f"Node {node} HugePages_Total: {pages:>5}",
        f"Node {node} HugePages_Free:  {pages:>5}",
        f"Node {node} HugePages_Surp:  {0:>5}",
    ]
    return "\n".join(lines) + "\n"


def _write_nodes(spec: NodeSpec, tree: _Tree) -> None:
    nodes = format_cpu_list(range(spec.numa_nodes)) + "\n"
    for name in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        tree.file(f"{NODE_DIR}/{name}", nodes)
    for node in range(spec.numa_nodes):
        base = f"{NODE_DIR}/node{node}"
        cpus = spec.cpus_of_node(node)
        tree.file(f"{base}/cpulist", format_cpu_list(cpus) + "\n")
        tree.file(f"{base}/cpumap", _mask(spec, cpus))
        tree.file(
            f"{base}/distance", " ".join(str(_distance(spec, node, o)) for o in range(spec.numa_nodes)) + "\n"
        )
        tree.file(f"{base}/meminfo", _meminfo(spec, node))
        for size_kb, count in ((2048, spec.hugepages_2m_per_numa), (1048576, spec.hugepages_1g_per_numa)):
            pages = f"{base}/hugepages/hugepages-{size_kb}kB"
            tree.file(f"{pages}/nr_hugepages", f"{count}\n")
            tree.file(f"{pages}/free_hugepages", f"{count}\n")
            tree.file(f"{pages}/surplus_hugepages", "0\n")
        for cpu in cpus:
            tree.link(f"{base}/cpu{cpu}", f"{CPU_DIR}/cpu{cpu}")


# -- procfs ------------------------------------------------------------------------------------------------


def _mounts(spec: NodeSpec) -> str:
    lines = [
        "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0",
        "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0",
        "/dev/sda1 / ext4 rw,relatime 0 0",
        "tmpfs /run tmpfs rw,nosuid,nodev,size=6553600k,mode=755 0 0",
    ]
    common = "rw,nosuid,nodev,noexec,relatime"
    if spec.cgroup_version == 2:
        lines.append(f"cgroup2 /sys/fs/cgroup cgroup2 {common},nsdelegate,memory_recursiveprot 0 0")
    else:
        lines.append("tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0")
        for hierarchy in _V1_HIERARCHIES:
            lines.append(f"cgroup /sys/fs/cgroup/{hierarchy} cgroup {common},{hierarchy} 0 0")
    if spec.resctrl_mounted:
        options = "rw,relatime,mba_MBps" if spec.mba and spec.mba_mbps else "rw,relatime"
        lines.append(f"resctrl /sys/fs/resctrl resctrl {options} 0 0")
    return "\n".join(lines) + "\n"


_BASE_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr "
    "sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc arch_perfmon rep_good nopl "
    "xtopology nonstop_tsc cpuid aperfmperf pni pclmulqdq dtes64 monitor ds_cpl vmx smx est tm2 ssse3 "
    "fma cx16 xtpr pdcm pcid dca sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand lahf_lm "
    "abm 3dnowprefetch epb invpcid_single ssbd ibrs ibpb stibp tpr_shadow ept vpid fsgsbase "
    "tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm avx512f avx512dq rdseed adx smap clflushopt "
    "clwb intel_pt avx512cd avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves dtherm ida arat pln pts "
    "hwp hwp_act_window hwp_epp hwp_pkg_req pku ospke avx512_vnni md_clear flush_l1d arch_capabilities"
)


def _cpu_flags(spec: NodeSpec) -> str:
    flags = [_BASE_FLAGS]
    if spec.rdt:
        flags.append("cat_l3")
        if spec.l3_cdp_capable:
            flags.append("cdp_l3")
        if spec.l3_mon:
            flags.append("cqm cqm_llc cqm_occup_llc cqm_mbm_total cqm_mbm_local")
        flags.append("rdt_a")
        if spec.mba:
            flags.append("mba")
    return " ".join(flags)


def _cpuinfo(spec: NodeSpec) -> str:
    flags = _cpu_flags(spec)
    mhz = spec.cpufreq_max_khz / 1000
    entries = []
    for cpu in range(spec.cpus):
        socket, core, _ = spec.cpu_location(cpu)
        entries.append(
            f"processor\t: {cpu}\n"
            "vendor_id\t: GenuineIntel\n"
            "cpu family\t: 6\n"
            "model\t\t: 85\n"
            f"model name\t: Intel(R) Xeon(R) CPU (rmd-sim {spec.name})\n"
            "stepping\t: 7\n"
            f"cpu MHz\t\t: {mhz:.3f}\n"
            f"cache size\t: {spec.l3_bytes // 1024} KB\n"
            f"physical id\t: {socket}\n"
            f"siblings\t: {spec.cores_per_socket * spec.threads_per_core}\n"
            f"core id\t\t: {core}\n"
            f"cpu cores\t: {spec.cores_per_socket}\n"
            f"apicid\t\t: {cpu}\n"
            "fpu\t\t: yes\n"
            f"flags\t\t: {flags}\n"
            "clflush size\t: 64\n"
            f"cache_alignment\t: {CACHE_LINE}\n"
        )
    return "\n".join(entries)


def _write_proc(spec: NodeSpec, tree: _Tree) -> None:
    tree.file("proc/mounts", _mounts(spec))
    tree.file("proc/cpuinfo", _cpuinfo(spec))


# -- resctrl -----------------------------------------------------------------------------------------------


def _write_resctrl(spec: NodeSpec, tree: _Tree) -> None:
    state = resctrl.state_for_spec(spec)
    base = resctrl.RESCTRL
    info = f"{base}/info"
    tree.file(f"{info}/last_cmd_status", "ok\n")
    l3 = {
        "cbm_mask": f"{spec.cbm_mask}\n",
        "min_cbm_bits": f"{spec.min_cbm_bits}\n",
        "num_closids": f"{spec.num_closids}\n",
        "shareable_bits": f"{int(spec.shareable_bits, 16):x}\n",
        "bit_usage": resctrl.render_bit_usage(state),
    }
    if spec.sparse_masks is not None:
        l3["sparse_masks"] = f"{spec.sparse_masks}\n"
    for name, text in l3.items():
        tree.file(f"{info}/L3/{name}", text)
    if spec.mba:
        mb = {
            "min_bandwidth": f"{spec.mba_min_bandwidth}\n",
            "bandwidth_gran": f"{spec.mba_bandwidth_gran}\n",
            "delay_linear": "1\n",
            "num_closids": f"{spec.num_closids}\n",
            "thread_throttle_mode": "max\n",
        }
        for name, text in mb.items():
            tree.file(f"{info}/MB/{name}", text)
    if spec.l3_mon:
        threshold = spec.l3_bytes // spec.num_rmids // CACHE_LINE * CACHE_LINE
        tree.file(f"{info}/L3_MON/num_rmids", f"{spec.num_rmids}\n")
        tree.file(f"{info}/L3_MON/mon_features", "llc_occupancy\nmbm_total_bytes\nmbm_local_bytes\n")
        tree.file(f"{info}/L3_MON/max_threshold_occupancy", f"{threshold}\n")
        for socket in range(spec.sockets):
            for event in ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes"):
                tree.file(f"{base}/mon_data/mon_L3_{socket:02d}/{event}", "0\n")
    tree.dir(f"{base}/mon_groups")
    for name, text in resctrl.render_group_files(state, state.root).items():
        tree.file(f"{base}/{name}", text)


# -- powercap ----------------------------------------------------------------------------------------------


def _write_powercap(spec: NodeSpec, tree: _Tree) -> None:
    zones = rapl_zones(spec)
    if not zones:
        return
    for control in sorted({z.zone_id.split(":")[0] for z in zones}):  # intel-rapl, intel-rapl-mmio
        tree.file(f"{POWERCAP_DEVICES}/{control}/enabled", "1\n")
        tree.link(f"{POWERCAP_CLASS}/{control}", f"{POWERCAP_DEVICES}/{control}")
    for zone in zones:
        tree.file(f"{zone.rel_dir}/name", f"{zone.name}\n")
        tree.file(f"{zone.rel_dir}/energy_uj", f"{zone.initial_energy_uj}\n")
        tree.file(f"{zone.rel_dir}/max_energy_range_uj", f"{MAX_ENERGY_RANGE_UJ}\n")
        tree.file(f"{zone.rel_dir}/enabled", "1\n")
        tree.link(zone.class_link, zone.rel_dir)


# -- cgroups -----------------------------------------------------------------------------------------------

_V1_HIERARCHIES = ("cpu,cpuacct", "cpuset", "memory")
_V2_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc"
_V2_SUBTREE = "cpuset cpu io memory hugetlb pids"


def kubepods_dirs(spec: NodeSpec) -> list[str]:
    """The kubepods cgroup and its QoS children, relative to a hierarchy root (driver-dependent names)."""
    if spec.cgroup_driver == "systemd":
        top = "kubepods.slice"
        return [top, f"{top}/kubepods-burstable.slice", f"{top}/kubepods-besteffort.slice"]
    return ["kubepods", "kubepods/burstable", "kubepods/besteffort"]


def _write_cgroups(spec: NodeSpec, tree: _Tree) -> None:
    base = "sys/fs/cgroup"
    all_cpus = format_cpu_list(range(spec.cpus)) + "\n"
    mems = format_cpu_list(range(spec.numa_nodes)) + "\n"
    if spec.cgroup_version == 2:
        tree.file(f"{base}/cgroup.controllers", _V2_CONTROLLERS + "\n")
        tree.file(f"{base}/cgroup.subtree_control", _V2_SUBTREE + "\n")
        tree.file(f"{base}/cgroup.procs", "")
        tree.file(f"{base}/cpuset.cpus.effective", all_cpus)
        tree.file(f"{base}/cpuset.mems.effective", mems)
        for rel in kubepods_dirs(spec):
            tree.file(f"{base}/{rel}/cgroup.controllers", _V2_SUBTREE + "\n")
            tree.file(f"{base}/{rel}/cgroup.subtree_control", _V2_SUBTREE + "\n")
            tree.file(f"{base}/{rel}/cgroup.procs", "")
            tree.file(f"{base}/{rel}/cpu.stat", "usage_usec 0\nuser_usec 0\nsystem_usec 0\n")
            tree.file(f"{base}/{rel}/cpuset.cpus.effective", all_cpus)
            tree.file(f"{base}/{rel}/cpuset.mems.effective", mems)
        return
    per_hierarchy = {
        "cpu,cpuacct": {"cpuacct.usage": "0\n", "cpu.shares": "1024\n"},
        "cpuset": {"cpuset.cpus": all_cpus, "cpuset.mems": mems},
        "memory": {"memory.usage_in_bytes": "0\n"},
    }
    for hierarchy, files in per_hierarchy.items():
        for rel in ["", *kubepods_dirs(spec)]:
            path = f"{base}/{hierarchy}/{rel}".rstrip("/")
            for name, text in {**files, "cgroup.procs": "", "tasks": ""}.items():
                tree.file(f"{path}/{name}", text)
    for alias in ("cpu", "cpuacct"):
        tree.link(f"{base}/{alias}", f"{base}/cpu,cpuacct")


# -- kubelet -----------------------------------------------------------------------------------------------


def write_kubelet_config(spec: NodeSpec, out: Path) -> None:
    """(Re)write only the kubelet config file of the tree at `out`, as an administrator edits it (tests change
    a node's kubelet settings this way; the simulated kubelet keeps running as it was)."""
    _write_kubelet(spec, _Tree(Path(out)))


def _write_kubelet(spec: NodeSpec, tree: _Tree) -> None:
    config: dict[str, object] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": spec.cgroup_driver,
        "cpuManagerPolicy": spec.cpu_manager_policy,
        "cpuManagerReconcilePeriod": "10s",
        "memoryManagerPolicy": spec.memory_manager_policy,
        "topologyManagerPolicy": spec.topology_manager_policy,
        "topologyManagerScope": spec.topology_manager_scope,
    }
    if parse_cpu_list(spec.reserved_cpus):
        config["reservedSystemCPUs"] = spec.reserved_cpus
    tree.file("var/lib/kubelet/config.yaml", yaml.safe_dump(config, sort_keys=False))
    tree.dir("var/lib/kubelet/pod-resources")


def summary(spec: NodeSpec) -> str:
    """One line describing the node, for CLIs and logs."""
    rdt = "resctrl not mounted"
    if spec.resctrl_mounted:
        mba = (" + MBA" + (" (MBps)" if spec.mba_mbps else "")) if spec.mba else ""
        l3 = f"L3 {spec.l3_ways} ways (cbm {spec.cbm_mask}) x {spec.sockets} domains"
        rdt = f"{l3}, {spec.num_closids} CLOS{mba}"
    rapl = f"RAPL {len(rapl_zones(spec))} zones" if spec.rapl_zones else "no RAPL"
    return (
        f"{spec.name}: {spec.sockets} sockets x {spec.cores_per_socket} cores x {spec.threads_per_core} "
        f"threads = {spec.cpus} CPUs, {spec.numa_nodes} NUMA nodes, {rdt}, {rapl}, "
        f"cgroup v{spec.cgroup_version} ({spec.cgroup_driver})"
    )
