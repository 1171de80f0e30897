import dataclasses
import os
import re
from pathlib import Path

import pytest
import yaml

from rmd_api.cpuset import parse_cpu_list, parse_cpu_mask
from rmd_sim.cli import main
from rmd_sim.hosttree import MAX_ENERGY_RANGE_UJ, rapl_zones, write_host_tree, write_kubelet_config
from rmd_sim.resctrl import check_resctrl_tree, format_cpu_mask
from rmd_sim.spec import NodeSpec, read_tree_spec

CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"
R = "sys/fs/resctrl"


@pytest.fixture(scope="module")
def default_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("default")
    write_host_tree(NodeSpec.default(), root)
    return root


@pytest.fixture(scope="module")
def large_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("large")
    write_host_tree(NodeSpec.large(), root)
    return root


def read(root: Path, rel: str) -> str:
    return (root / rel).read_text()


# Variant trees only need a few CPUs; every file written costs time on a busy disk.
SMALL = NodeSpec(name="small", cores_per_socket=4)


def build(tmp_path: Path, **overrides: object) -> Path:
    root = tmp_path / "node"
    write_host_tree(dataclasses.replace(SMALL, **overrides), root)  # type: ignore[arg-type]
    return root


@pytest.mark.parametrize(
    ("cpus", "nbits", "text"),
    [
        (range(64), 64, "ffffffff,ffffffff"),
        ({0}, 40, "00,00000001"),
        ({39}, 40, "80,00000000"),
        (set(), 4, "0"),
        ({1, 2}, 3, "6"),
    ],
)
def test_cpu_mask_format_matches_the_kernel(cpus: set[int], nbits: int, text: str) -> None:
    assert format_cpu_mask(cpus, nbits) == text
    assert parse_cpu_mask(text) == frozenset(cpus)


def test_default_tree_cpus_and_topology(default_tree: Path) -> None:
    cpu_dirs = [p for p in (default_tree / CPU).iterdir() if re.fullmatch(r"cpu\d+", p.name)]
    assert len(cpu_dirs) == 64
    for name in ("online", "possible", "present"):
        assert read(default_tree, f"{CPU}/{name}") == "0-63\n"
    assert not (default_tree / CPU / "cpu0/online").exists()
    assert read(default_tree, f"{CPU}/cpu63/online") == "1\n"
    topo = default_tree / CPU / "cpu33/topology"
    assert (topo / "physical_package_id").read_text() == "0\n"
    assert (topo / "core_id").read_text() == "1\n"
    assert (topo / "die_id").read_text() == "0\n"
    assert (topo / "thread_siblings_list").read_text() == "1,33\n"
    assert (topo / "core_siblings_list").read_text() == "0-15,32-47\n"
    assert (topo / "package_cpus_list").read_text() == "0-15,32-47\n"


def test_default_tree_caches(default_tree: Path) -> None:
    base = default_tree / CPU / "cpu17/cache"
    kinds = [
        ((base / f"index{i}/level").read_text(), (base / f"index{i}/type").read_text()) for i in range(4)
    ]
    assert kinds == [("1\n", "Data\n"), ("1\n", "Instruction\n"), ("2\n", "Unified\n"), ("3\n", "Unified\n")]
    l3 = base / "index3"
    assert (l3 / "id").read_text() == "1\n"
    assert (l3 / "ways_of_associativity").read_text() == "11\n"
    assert (l3 / "size").read_text() == "22528K\n"
    assert parse_cpu_list((l3 / "shared_cpu_list").read_text()) == set(range(16, 32)) | set(range(48, 64))
    assert parse_cpu_mask((l3 / "shared_cpu_map").read_text()) == set(range(16, 32)) | set(range(48, 64))
    sets, ways = int((l3 / "number_of_sets").read_text()), 11
    assert sets * ways * int((l3 / "coherency_line_size").read_text()) == 22528 * 1024
    assert parse_cpu_list((base / "index0/shared_cpu_list").read_text()) == {17, 49}


def test_default_tree_cpufreq(default_tree: Path) -> None:
    freq = default_tree / CPU / "cpu5/cpufreq"
    assert freq.is_symlink() and freq.resolve() == (default_tree / CPU / "cpufreq/policy5").resolve()
    values = {name: (freq / name).read_text().strip() for name in os.listdir(freq)}
    assert values["cpuinfo_min_freq"] == values["scaling_min_freq"] == "800000"
    assert values["cpuinfo_max_freq"] == values["scaling_max_freq"] == "3500000"
    assert 800000 <= int(values["scaling_cur_freq"]) <= 3500000
    assert values["scaling_driver"] == "intel_pstate"
    assert values["scaling_governor"] in values["scaling_available_governors"].split()


def test_default_tree_numa_nodes(default_tree: Path) -> None:
    assert read(default_tree, f"{NODE}/online") == "0-1\n"
    node1 = default_tree / NODE / "node1"
    assert parse_cpu_list((node1 / "cpulist").read_text()) == set(range(16, 32)) | set(range(48, 64))
    assert parse_cpu_mask((node1 / "cpumap").read_text()) == set(range(16, 32)) | set(range(48, 64))
    assert (node1 / "distance").read_text() == "21 10\n"
    meminfo = (node1 / "meminfo").read_text()
    assert re.search(r"^Node 1 MemTotal:\s+67108864 kB$", meminfo, re.M)
    fields = dict(re.findall(r"^Node 1 (\w+):\s+(\d+)", meminfo, re.M))
    assert int(fields["MemFree"]) + int(fields["MemUsed"]) == 67108864
    assert fields["HugePages_Total"] == "1024"
    for size, count in (("2048", "1024"), ("1048576", "4")):
        pages = node1 / f"hugepages/hugepages-{size}kB"
        assert (pages / "nr_hugepages").read_text() == f"{count}\n"
        assert (pages / "free_hugepages").read_text() == f"{count}\n"
        assert (pages / "surplus_hugepages").read_text() == "0\n"
    assert (node1 / "cpu16").resolve() == (default_tree / CPU / "cpu16").resolve()


def test_default_tree_resctrl(default_tree: Path) -> None:
    assert read(default_tree, f"{R}/info/last_cmd_status") == "ok\n"
    info = {p.name: p.read_text() for p in (default_tree / R / "info/L3").iterdir()}
    assert info == {
        "cbm_mask": "7ff\n",
        "min_cbm_bits": "1\n",
        "num_closids": "16\n",
        "shareable_bits": "0\n",
        "bit_usage": "0=SSSSSSSSSSS;1=SSSSSSSSSSS\n",
    }
    mb = {p.name: p.read_text() for p in (default_tree / R / "info/MB").iterdir()}
    assert mb["min_bandwidth"] == "10\n" and mb["bandwidth_gran"] == "10\n" and mb["num_closids"] == "16\n"
    assert set(mb) == {
        "min_bandwidth",
        "bandwidth_gran",
        "delay_linear",
        "num_closids",
        "thread_throttle_mode",
    }
    assert read(default_tree, f"{R}/info/L3_MON/mon_features").split() == [
        "llc_occupancy",
        "mbm_total_bytes",
        "mbm_local_bytes",
    ]
    assert read(default_tree, f"{R}/schemata") == "    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n"
    assert read(default_tree, f"{R}/cpus_list") == "0-63\n"
    assert read(default_tree, f"{R}/cpus") == "ffffffff,ffffffff\n"
    assert read(default_tree, f"{R}/mode") == "shareable\n"
    assert read(default_tree, f"{R}/tasks") == ""
    assert (
        read(default_tree, f"{R}/size") == f"    L3:0={22528 * 1024};1={22528 * 1024}\n    MB:0=100;1=100\n"
    )
    mounts = read(default_tree, "proc/mounts").splitlines()
    assert "resctrl /sys/fs/resctrl resctrl rw,relatime 0 0" in mounts
    assert any(line.split()[2] == "cgroup2" for line in mounts)
    assert "rdt_a" in read(default_tree, "proc/cpuinfo")


def test_default_tree_powercap(default_tree: Path) -> None:
    cls = default_tree / "sys/class/powercap"
    assert sorted(p.name for p in cls.iterdir()) == [
        "intel-rapl",
        "intel-rapl:0",
        "intel-rapl:0:0",
        "intel-rapl:1",
        "intel-rapl:1:0",
    ]
    for zone, name in (("intel-rapl:0", "package-0"), ("intel-rapl:1:0", "dram")):
        link = cls / zone
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert "devices/virtual/powercap/intel-rapl" in str(link.resolve())
        assert (link / "name").read_text() == f"{name}\n"
        assert (link / "enabled").read_text() == "1\n"
        assert int((link / "max_energy_range_uj").read_text()) == MAX_ENERGY_RANGE_UJ
        assert 0 < int((link / "energy_uj").read_text()) < MAX_ENERGY_RANGE_UJ
    assert read(default_tree, "sys/devices/virtual/powercap/intel-rapl/enabled") == "1\n"


def test_default_tree_cgroups_and_kubelet(default_tree: Path) -> None:
    cg = default_tree / "sys/fs/cgroup"
    assert "cpuset" in (cg / "cgroup.controllers").read_text().split()
    assert (cg / "kubepods.slice/kubepods-burstable.slice").is_dir()
    assert (cg / "kubepods.slice/kubepods-besteffort.slice").is_dir()
    config = yaml.safe_load(read(default_tree, "var/lib/kubelet/config.yaml"))
    assert config["kind"] == "KubeletConfiguration"
    assert config["cpuManagerPolicy"] == "static"
    assert config["topologyManagerPolicy"] == "single-numa-node"
    assert config["topologyManagerScope"] == "container"
    assert config["reservedSystemCPUs"] == "0"
    assert config["cgroupDriver"] == "systemd"
    assert (default_tree / "var/lib/kubelet/pod-resources").is_dir()
    assert not (default_tree / "var/lib/kubelet/cpu_manager_state").exists()


def test_spec_is_recoverable_from_the_tree(default_tree: Path, tmp_path: Path) -> None:
    assert read_tree_spec(default_tree) == NodeSpec.default()
    odd = dataclasses.replace(SMALL, name="odd", rapl_zones=("package",), sparse_masks=1)
    write_host_tree(odd, tmp_path / "odd")
    assert read_tree_spec(tmp_path / "odd") == odd


def test_large_tree_counts(large_tree: Path) -> None:
    assert len([p for p in (large_tree / CPU).iterdir() if re.fullmatch(r"cpu\d+", p.name)]) == 256
    nodes = sorted(p.name for p in (large_tree / NODE).iterdir() if re.fullmatch(r"node\d+", p.name))
    assert len(nodes) == 8
    all_cpus: set[int] = set()
    for node in nodes:
        cpus = parse_cpu_list(read(large_tree, f"{NODE}/{node}/cpulist"))
        assert len(cpus) == 32
        all_cpus |= cpus
    assert all_cpus == set(range(256))
    assert read(large_tree, f"{NODE}/node0/distance") == "10 12 12 12 21 21 21 21\n"
    l3_ids = {read(large_tree, f"{CPU}/cpu{c}/cache/index3/id") for c in range(256)}
    assert l3_ids == {"0\n", "1\n"}
    assert read(large_tree, f"{CPU}/cpu255/cache/index3/ways_of_associativity") == "15\n"
    # the kernel pads every value to the widest resource's width: 4 hex digits for a 15-bit CBM
    assert read(large_tree, f"{R}/schemata") == "    L3:0=7fff;1=7fff\n    MB:0= 100;1= 100\n"
    assert read(large_tree, f"{R}/cpus") == ",".join(["ffffffff"] * 8) + "\n"
    assert read(large_tree, f"{R}/cpus_list") == "0-255\n"
    assert check_resctrl_tree(large_tree) == []


def test_unmounted_resctrl_has_no_info_and_no_mount_line(tmp_path: Path) -> None:
    root = build(tmp_path, resctrl_mounted=False)
    assert not (root / R / "info").exists()
    assert "resctrl" not in read(root, "proc/mounts")
    assert "rdt_a" in read(root, "proc/cpuinfo")  # the CPU can, nobody mounted it


def test_cpu_without_rdt_has_no_rdt_flags(tmp_path: Path) -> None:
    root = build(tmp_path, rdt=False, resctrl_mounted=False)
    flags = re.search(r"^flags\t+: (.*)$", read(root, "proc/cpuinfo"), re.M)
    assert flags is not None
    assert not {"rdt_a", "cat_l3", "mba"} & set(flags.group(1).split())


def test_optional_resctrl_files_follow_the_spec(tmp_path: Path) -> None:
    root = build(tmp_path, sparse_masks=0, mba=False, l3_mon=False, l3_cdp_capable=False)
    assert read(root, f"{R}/info/L3/sparse_masks") == "0\n"
    assert not (root / R / "info/MB").exists()
    assert not (root / R / "info/L3_MON").exists()
    assert read(root, f"{R}/schemata") == "L3:0=7ff;1=7ff\n"  # no CDP: the name column is just "L3"


def test_mba_mbps_mount(tmp_path: Path) -> None:
    root = build(tmp_path, mba_mbps=True)
    assert "resctrl /sys/fs/resctrl resctrl rw,relatime,mba_MBps 0 0" in read(root, "proc/mounts")
    assert "MB:0=4294967295;1=4294967295" in read(root, f"{R}/schemata")


def test_rapl_variants(tmp_path: Path) -> None:
    spec = dataclasses.replace(
        SMALL, rapl_zones=("package", "core", "uncore", "psys"), rapl_mmio_duplicate=True
    )
    names = {z.zone_id: z.name for z in rapl_zones(spec)}
    assert names["intel-rapl:0:0"] == "core" and names["intel-rapl:1:1"] == "uncore"
    assert names["intel-rapl:2"] == "psys"
    assert names["intel-rapl-mmio:0"] == "package-0"
    root = tmp_path / "node"
    write_host_tree(spec, root)
    cls = root / "sys/class/powercap"
    assert (cls / "intel-rapl-mmio:0/name").read_text() == "package-0\n"
    assert (cls / "intel-rapl-mmio:0/energy_uj").read_text() == (cls / "intel-rapl:0/energy_uj").read_text()
    assert (cls / "intel-rapl:2/name").read_text() == "psys\n"
    no_rapl = build(tmp_path / "none", rapl_zones=())
    assert not (no_rapl / "sys/class/powercap").exists()


@pytest.mark.parametrize(("driver", "top"), [("systemd", "kubepods.slice"), ("cgroupfs", "kubepods")])
def test_cgroup_v1_hierarchies(tmp_path: Path, driver: str, top: str) -> None:
    root = build(tmp_path, cgroup_version=1, cgroup_driver=driver)
    cg = root / "sys/fs/cgroup"
    assert not (cg / "cgroup.controllers").exists()
    for hierarchy in ("cpu,cpuacct", "cpuset", "memory"):
        assert (cg / hierarchy / top).is_dir()
    assert (cg / "cpu").resolve() == (cg / "cpu,cpuacct").resolve()
    assert "cgroup /sys/fs/cgroup/cpuset cgroup" in read(root, "proc/mounts")
    assert yaml.safe_load(read(root, "var/lib/kubelet/config.yaml"))["cgroupDriver"] == driver


def test_cgroupfs_v2_names(tmp_path: Path) -> None:
    root = build(tmp_path, cgroup_driver="cgroupfs", reserved_cpus="")
    assert (root / "sys/fs/cgroup/kubepods/burstable").is_dir()
    assert "reservedSystemCPUs" not in yaml.safe_load(read(root, "var/lib/kubelet/config.yaml"))


def test_the_kubelet_config_is_rewritten_alone(tmp_path: Path) -> None:
    """As an administrator edits a node's kubelet config (tests change a node's policies this way)."""
    root = build(tmp_path)
    cpuinfo = read(root, "proc/cpuinfo")
    changed = dataclasses.replace(SMALL, cpu_manager_policy="none", topology_manager_policy="best-effort")
    write_kubelet_config(changed, root)
    config = yaml.safe_load(read(root, "var/lib/kubelet/config.yaml"))
    assert (config["cpuManagerPolicy"], config["topologyManagerPolicy"]) == ("none", "best-effort")
    assert read(root, "proc/cpuinfo") == cpuinfo
    assert read_tree_spec(root) == SMALL  # the tree's spec is what it was built from


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        write_host_tree(SMALL, other, replace=True)
    assert (other / "keep.txt").read_text() == "mine"
    sim = build(tmp_path)
    with pytest.raises(FileExistsError, match="replace"):
        write_host_tree(SMALL, sim)
    write_host_tree(dataclasses.replace(SMALL, name="again"), sim, replace=True)
    assert read_tree_spec(sim).name == "again"


def test_cli_node_writes_a_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text("cores_per_socket: 2\nnuma_nodes: 4\n")
    assert main(["node", "--out", str(out), "--spec", str(spec_file)]) == 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "8 CPUs" in line and "4 NUMA nodes" in line
    assert read_tree_spec(out) == NodeSpec(name="tiny", cores_per_socket=2, numa_nodes=4)
    assert main(["node", "--out", str(out), "--spec", str(spec_file)]) == 2  # not empty, no --force
    spec_file.write_text("cores_per_socket: 1\n")
    assert main(["node", "--out", str(out), "--spec", str(spec_file), "--force"]) == 0
    assert read_tree_spec(out).cores_per_socket == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("cores: 3\n")
    assert main(["node", "--out", str(tmp_path / "x"), "--spec", str(bad)]) == 2
    assert "unknown spec key(s): cores" in capsys.readouterr().err
