"""The read-only host readers on small hand-made trees: what they find, and the reasons when they can't."""

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from rmd_agent.errors import Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.observe.caches import read_l3_caches
from rmd_agent.observe.cgroups import read_cgroups
from rmd_agent.observe.cpufreq import read_cpufreq
from rmd_agent.observe.cpus import read_cpus
from rmd_agent.observe.numa import read_numa_nodes
from rmd_agent.observe.rapl import read_rapl_zones

MakeTree = Callable[[Mapping[str, str]], Path]
CPU = "sys/devices/system/cpu"


def two_cpu_files() -> dict[str, str]:
    files = {f"{CPU}/online": "0-1\n"}
    for cpu in (0, 1):
        topo = f"{CPU}/cpu{cpu}/topology"
        files |= {
            f"{topo}/physical_package_id": "0\n",
            f"{topo}/core_id": "0\n",
            f"{topo}/thread_siblings_list": "0-1\n",
        }
        l3 = f"{CPU}/cpu{cpu}/cache/index3"
        files |= {
            f"{l3}/level": "3\n",
            f"{l3}/id": "0\n",
            f"{l3}/shared_cpu_list": "0-1\n",
            f"{l3}/ways_of_associativity": "11\n",
            f"{l3}/size": "36608K\n",
        }
        files[f"{CPU}/cpu{cpu}/cache/index0/level"] = "1\n"
    return files


def test_cpus_read_topology(make_tree: MakeTree) -> None:
    cpus = read_cpus(HostFS(make_tree(two_cpu_files())))
    assert not isinstance(cpus, Unsupported)
    assert [c.id for c in cpus] == [0, 1]
    assert cpus[1].thread_siblings == {0, 1}


def test_cpus_without_topology_are_unsupported_with_the_file(make_tree: MakeTree) -> None:
    files = two_cpu_files()
    del files[f"{CPU}/cpu1/topology/core_id"]
    result = read_cpus(HostFS(make_tree(files)))
    assert isinstance(result, Unsupported)
    assert "cpu1/topology/core_id: does not exist" in result.reason


def test_l3_caches_are_deduplicated_by_id(make_tree: MakeTree) -> None:
    caches = read_l3_caches(HostFS(make_tree(two_cpu_files())))
    assert not isinstance(caches, Unsupported)
    assert len(caches) == 1
    assert (caches[0].id, caches[0].cpus, caches[0].ways, caches[0].size_bytes) == (
        0,
        {0, 1},
        11,
        36608 * 1024,
    )


def test_l3_caches_read_one_cpu_per_cache_not_every_cpu(make_tree: MakeTree) -> None:
    """The CPUs a cache lists as sharing it are not read again: with cpu1's cache files gone, cpu0's
    shared_cpu_list (0-1) still answers for both."""
    files = {k: v for k, v in two_cpu_files().items() if "cpu1/cache" not in k}
    files[f"{CPU}/cpu1/cache/index3/level"] = "not a number\n"  # would fail the read if it were made
    caches = read_l3_caches(HostFS(make_tree(files)))
    assert not isinstance(caches, Unsupported), caches
    assert [(c.id, c.cpus) for c in caches] == [(0, {0, 1})]


def test_no_l3_is_unsupported(make_tree: MakeTree) -> None:
    files = {k: v for k, v in two_cpu_files().items() if "index3" not in k}
    result = read_l3_caches(HostFS(make_tree(files)))
    assert isinstance(result, Unsupported)
    assert "no L3 cache" in result.reason


def test_numa_nodes_memory_hugepages_and_distances(make_tree: MakeTree) -> None:
    node = "sys/devices/system/node"
    files = {
        f"{node}/node0/cpulist": "0-1\n",
        f"{node}/node1/cpulist": "2-3\n",
        f"{node}/node0/distance": "10 21\n",
        f"{node}/node1/distance": "21 10\n",
        f"{node}/node0/meminfo": "Node 0 MemTotal:       1024 kB\nNode 0 MemFree:         512 kB\n"
        "Node 0 HugePages_Total:     4\n",
        f"{node}/node1/meminfo": "Node 1 MemTotal:       2048 kB\n",
        f"{node}/node0/hugepages/hugepages-2048kB/nr_hugepages": "4\n",
        f"{node}/node0/hugepages/hugepages-2048kB/free_hugepages": "3\n",
        f"{node}/node0/hugepages/hugepages-1048576kB/nr_hugepages": "1\n",
        f"{node}/node0/hugepages/hugepages-1048576kB/free_hugepages": "1\n",
        f"{node}/online": "0-1\n",
    }
    nodes = read_numa_nodes(HostFS(make_tree(files)))
    assert not isinstance(nodes, Unsupported)
    assert [n.id for n in nodes] == [0, 1]
    assert nodes[0].memory_total_bytes == 1024 * 1024 and nodes[0].memory_free_bytes == 512 * 1024
    assert [(h.resource_name, h.total, h.free) for h in nodes[0].hugepages] == [
        ("hugepages-2Mi", 4, 3),
        ("hugepages-1Gi", 1, 1),
    ]
    assert nodes[1].hugepages == ()
    assert nodes[1].distances == {0: 21, 1: 10}


def test_numa_without_memtotal_is_unsupported(make_tree: MakeTree) -> None:
    node = "sys/devices/system/node/node0"
    root = make_tree({f"{node}/cpulist": "0\n", f"{node}/distance": "10\n", f"{node}/meminfo": "garbage\n"})
    result = read_numa_nodes(HostFS(root))
    assert isinstance(result, Unsupported)
    assert "no MemTotal" in result.reason


def rapl_files() -> dict[str, str]:
    files = {}
    for zone, name in [
        ("intel-rapl:0", "package-0"),
        ("intel-rapl:0:0", "core"),
        ("intel-rapl:0:1", "dram"),
        ("intel-rapl:1", "package-1"),
        ("intel-rapl-mmio:0", "package-0"),
    ]:
        base = f"sys/class/powercap/{zone}"
        files |= {
            f"{base}/name": f"{name}\n",
            f"{base}/energy_uj": "1000\n",
            f"{base}/max_energy_range_uj": "262143328850\n",
        }
    files["sys/class/powercap/intel-rapl/enabled"] = "1\n"
    return files


def test_rapl_zones_skip_mmio_duplicates_and_know_their_parents(make_tree: MakeTree) -> None:
    zones = read_rapl_zones(HostFS(make_tree(rapl_files())))
    assert not isinstance(zones, Unsupported)
    assert [(z.zone_id, z.kind, z.socket, z.parent) for z in zones] == [
        ("intel-rapl:0", "package", 0, None),
        ("intel-rapl:0:0", "core", 0, "intel-rapl:0"),
        ("intel-rapl:0:1", "dram", 0, "intel-rapl:0"),
        ("intel-rapl:1", "package", 1, None),
    ]
    assert zones[0].max_energy_range_uj == 262143328850


def test_unreadable_rapl_counter_says_which_file(make_tree: MakeTree) -> None:
    root = make_tree({k: v for k, v in rapl_files().items() if not k.endswith("intel-rapl:1/energy_uj")})
    (root / "sys/class/powercap/intel-rapl:1/energy_uj").mkdir()  # unreadable as a file, even for root
    result = read_rapl_zones(HostFS(root))
    assert isinstance(result, Unsupported)
    assert "intel-rapl:1/energy_uj" in result.reason


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({}, "no powercap in sysfs"),
        ({"sys/class/powercap/intel-rapl/enabled": "1"}, "no intel-rapl powercap zones"),
    ],
)
def test_missing_rapl_reasons(make_tree: MakeTree, files: dict[str, str], reason: str) -> None:
    result = read_rapl_zones(HostFS(make_tree(files)))
    assert isinstance(result, Unsupported)
    assert reason in result.reason


def cpufreq_files(cpu: int, low: str, high: str, driver: str) -> dict[str, str]:
    base = f"{CPU}/cpu{cpu}/cpufreq"
    return {
        f"{base}/cpuinfo_min_freq": low,
        f"{base}/cpuinfo_max_freq": high,
        f"{base}/scaling_driver": driver,
    }


def test_cpufreq_reads_each_cpus_hardware_range_and_the_one_driver(make_tree: MakeTree) -> None:
    files = two_cpu_files() | cpufreq_files(0, "800000\n", "3500000\n", "intel_pstate\n")
    files |= cpufreq_files(1, "1000000\n", "3800000\n", "intel_pstate\n")
    result = read_cpufreq(HostFS(make_tree(files)))
    assert not isinstance(result, Unsupported), result
    assert [(f.cpu, f.cpuinfo_min_khz, f.cpuinfo_max_khz, f.driver) for f in result] == [
        (0, 800_000, 3_500_000, "intel_pstate"),
        (1, 1_000_000, 3_800_000, "intel_pstate"),
    ]


def test_cpufreq_with_an_unreadable_range_is_unsupported_with_the_file(make_tree: MakeTree) -> None:
    files = two_cpu_files() | cpufreq_files(0, "800000\n", "3500000\n", "intel_pstate\n")
    files |= cpufreq_files(1, "1000000\n", "fast\n", "intel_pstate\n")
    result = read_cpufreq(HostFS(make_tree(files)))
    assert isinstance(result, Unsupported)
    assert "cpu1/cpufreq/cpuinfo_max_freq" in result.reason


def test_cpufreq_absent_for_one_cpu_is_unsupported(make_tree: MakeTree) -> None:
    files = two_cpu_files()
    base = f"{CPU}/cpu0/cpufreq"
    files |= {
        f"{base}/{name}": value
        for name, value in [
            ("cpuinfo_min_freq", "800000"),
            ("cpuinfo_max_freq", "3500000"),
            ("scaling_min_freq", "800000"),
            ("scaling_max_freq", "3500000"),
            ("scaling_driver", "intel_pstate"),
            ("scaling_governor", "powersave"),
        ]
    }
    result = read_cpufreq(HostFS(make_tree(files)))
    assert isinstance(result, Unsupported)
    assert "no cpufreq for CPU 1" in result.reason


@pytest.mark.parametrize(
    ("dirs", "version", "driver"),
    [
        (["sys/fs/cgroup/kubepods.slice"], 2, "systemd"),
        (["sys/fs/cgroup/kubepods"], 2, "cgroupfs"),
    ],
)
def test_cgroup_v2_driver(make_tree: MakeTree, dirs: list[str], version: int, driver: str) -> None:
    root = make_tree({"sys/fs/cgroup/cgroup.controllers": "cpu memory\n"})
    for d in dirs:
        (root / d).mkdir(parents=True)
    info = read_cgroups(HostFS(root))
    assert not isinstance(info, Unsupported)
    assert (info.version, info.driver) == (version, driver)


def test_cgroup_v1_and_no_kubelet(make_tree: MakeTree, tmp_path: Path) -> None:
    root = make_tree({"sys/fs/cgroup/cpu,cpuacct/cpu.shares": "1024\n"})
    info = read_cgroups(HostFS(root))
    assert not isinstance(info, Unsupported)
    assert info.version == 1
    assert isinstance(info.driver, Unsupported)
    assert isinstance(read_cgroups(HostFS(tmp_path / "empty")), Unsupported)
