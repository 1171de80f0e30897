"""Fuzz campaign (docs/security.md, "Hostile input"): what the agent reads from the host besides checkpoints.
Whatever sysfs, procfs, resctrl, the kubelet's config file or the policy file hold, the readers answer with
their result, Unsupported (the reason) or their documented error, within the deadline."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmd_agent.errors import ConfigError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.config import KubeletConfig, parse_kubelet_config, read_kubelet_config
from rmd_agent.metrics.rdt_collector import GroupMonitoring, read_group_monitoring
from rmd_agent.observe.caches import read_l3_caches
from rmd_agent.observe.cpufreq import read_cpufreq
from rmd_agent.observe.cpus import read_cpus
from rmd_agent.observe.numa import read_numa_nodes
from rmd_agent.observe.rapl import read_rapl_zones
from rmd_agent.observe.resctrl import ResctrlState, parse_schemata, read_resctrl
from rmd_agent.plan.policy import PolicyBook, parse_policies, platform_from_cpuinfo
from rmd_agent.power.pod_meta import POD_LOGS_DIR, pod_logs_dir
from rmd_agent.settings import load_policy_file, load_settings

FUZZ = settings.get_profile("fuzz")
FILES = settings(
    FUZZ, max_examples=FUZZ.max_examples // 2
)  # examples that write files: they cost milliseconds

# What a sysfs or procfs value may turn out to be: plausible values, their neighbours, and anything.
_VALUES = st.one_of(
    st.sampled_from(["0", "1", "3", "7ff", "fffff", "0-1", "0,1", "2048K", "32M", "-1", "", "\n", " 1 "]),
    st.sampled_from(["Unavailable", "0x10", "1_0", "٣", "99999999999999999999", "9" * 5000, "0-4294967295"]),
    st.integers(-(2**70), 2**70).map(str),
    st.text("0123456789abcdef,-:;= \nKMGL", max_size=20),
    st.text(max_size=20),
)


@contextmanager
def _host(files: Mapping[str, str | bytes | None]) -> Iterator[HostFS]:
    """A host tree with `files` (None: left out); bytes are written as they are."""
    with tempfile.TemporaryDirectory() as root:
        for rel, content in files.items():
            if content is None:
                continue
            path = Path(root, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, errors="surrogatepass")
        yield HostFS(root)


def _fuzzed(base: Mapping[str, str]) -> st.SearchStrategy[dict[str, str | None]]:
    """`base` with some of its files replaced by fuzzed values or left out."""
    overrides = st.dictionaries(st.sampled_from(sorted(base)), _VALUES | st.none(), max_size=len(base))
    return overrides.map(lambda o: {**base, **o})


# -- resctrl -------------------------------------------------------------------------------------------------

R = "sys/fs/resctrl"
RESCTRL_TREE = {
    "proc/mounts": "resctrl /sys/fs/resctrl resctrl rw,relatime,mba_MBps 0 0\n",
    "proc/cpuinfo": "processor\t: 0\nflags\t\t: fpu rdt_a cat_l3\n",
    f"{R}/info/L3/cbm_mask": "7ff\n",
    f"{R}/info/L3/min_cbm_bits": "1\n",
    f"{R}/info/L3/num_closids": "16\n",
    f"{R}/info/L3/shareable_bits": "600\n",
    f"{R}/info/L3/sparse_masks": "0\n",
    f"{R}/info/MB/min_bandwidth": "10\n",
    f"{R}/info/MB/bandwidth_gran": "10\n",
    f"{R}/info/MB/delay_linear": "1\n",
    f"{R}/info/MB/num_closids": "8\n",
    f"{R}/info/last_cmd_status": "ok\n",
    f"{R}/schemata": "    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n",
    f"{R}/cpus_list": "0-3\n",
    f"{R}/mode": "shareable\n",
    f"{R}/g1/schemata": "L3:0=00f;1=00f\nMB:0=50;1=50\n",
    f"{R}/g1/cpus_list": "2-3\n",
    f"{R}/g1/mode": "exclusive\n",
}
_SCHEMATA = st.one_of(
    st.lists(
        st.tuples(st.sampled_from(["L3", "MB", "L3CODE", "", " L2"]), st.lists(_VALUES, max_size=3)),
        max_size=3,
    ).map(lambda lines: "\n".join(f"{r}:" + ";".join(items) for r, items in lines)),
    st.text("L3MB:;=0123456789abcdef \n", max_size=40),
    st.text(max_size=30),
)


@FUZZ
@given(_SCHEMATA)
def test_any_schemata_text_parses_or_is_a_value_error(text: str) -> None:
    try:
        parsed = parse_schemata(text)
    except ValueError:
        return
    assert all(isinstance(domain, int) for values in parsed.values() for domain in values)


@FILES
@given(_fuzzed(RESCTRL_TREE), st.one_of(_SCHEMATA, st.none()), st.booleans())
def test_any_resctrl_tree_reads_as_a_state_or_unsupported(
    files: dict[str, str | None], schemata: str | None, mounted: bool
) -> None:
    files[f"{R}/g1/schemata"] = schemata
    if not mounted:  # the path that reads /proc/cpuinfo to say why
        files = {k: v for k, v in files.items() if not k.startswith(R)}
    with _host(files) as fs:
        state = read_resctrl(fs)
    assert isinstance(state, ResctrlState | Unsupported)


@FUZZ
@given(st.lists(st.text(max_size=30) | st.sampled_from(["flags", "flags:", "flags\t: rdt_a"]), max_size=4))
def test_any_cpuinfo_explains_an_unmounted_resctrl(lines: list[str]) -> None:
    with _host({"proc/cpuinfo": "\n".join(lines)}) as fs:
        state = read_resctrl(fs)
    assert isinstance(state, Unsupported)


@FILES
@given(
    st.dictionaries(
        st.sampled_from(["mon_L3_00", "mon_L3_01", "mon_L3_x", "mon_L3_٣"]),
        st.dictionaries(
            st.sampled_from(["llc_occupancy", "mbm_total_bytes", "mbm_local_bytes"]),
            _VALUES.map(str.encode) | st.binary(max_size=12),
            max_size=3,
        ),
        max_size=3,
    )
)
def test_any_mon_data_reads_as_counters_or_an_os_or_value_error(domains: dict[str, dict[str, bytes]]) -> None:
    files: dict[str, str | bytes | None] = {
        f"{R}/g1/mon_data/{domain}/{event}": value
        for domain, events in domains.items()
        for event, value in events.items()
    }
    with _host(files) as fs:
        try:
            counters = read_group_monitoring(fs, "g1")
        except (OSError, ValueError):  # what the collector counts as a refresh error
            return
    assert isinstance(counters, GroupMonitoring | None)
    for values in (counters.llc_occupancy, counters.mbm_total, counters.mbm_local) if counters else ():
        assert all(isinstance(v, int) and v >= 0 for v in values.values())


# -- sysfs topology, caches, NUMA, cpufreq, RAPL ------------------------------------------------------------

C = "sys/devices/system/cpu"
N = "sys/devices/system/node/node0"
P = "sys/class/powercap"
SYSFS_TREE = {
    f"{C}/online": "0-1\n",
    **{
        f"{C}/cpu{cpu}/{name}": value
        for cpu in (0, 1)
        for name, value in {
            "topology/physical_package_id": "0\n",
            "topology/core_id": "0\n",
            "topology/thread_siblings_list": "0-1\n",
            "cache/index3/level": "3\n",
            "cache/index3/id": "0\n",
            "cache/index3/shared_cpu_list": "0-1\n",
            "cache/index3/ways_of_associativity": "11\n",
            "cache/index3/size": "16384K\n",
            "cpufreq/cpuinfo_min_freq": "800000\n",
            "cpufreq/cpuinfo_max_freq": "3500000\n",
            "cpufreq/scaling_min_freq": "800000\n",
            "cpufreq/scaling_max_freq": "3500000\n",
            "cpufreq/scaling_driver": "intel_pstate\n",
            "cpufreq/scaling_governor": "performance\n",
        }.items()
    },
    f"{N}/meminfo": "Node 0 MemTotal:       32768000 kB\nNode 0 MemFree:        1024 kB\n",
    f"{N}/distance": "10\n",
    f"{N}/cpulist": "0-1\n",
    f"{N}/hugepages/hugepages-2048kB/nr_hugepages": "4\n",
    f"{N}/hugepages/hugepages-2048kB/free_hugepages": "4\n",
    f"{P}/intel-rapl:0/name": "package-0\n",
    f"{P}/intel-rapl:0/energy_uj": "123456\n",
    f"{P}/intel-rapl:0/max_energy_range_uj": "262143328850\n",
    f"{P}/intel-rapl:0:0/name": "core\n",
    f"{P}/intel-rapl:0:0/energy_uj": "654\n",
    f"{P}/intel-rapl:0:0/max_energy_range_uj": "262143328850\n",
}
_MEMINFO = st.lists(
    st.tuples(st.sampled_from(["MemTotal", "MemFree", "Bogus", ""]), _VALUES, st.sampled_from([" kB", ""])),
    max_size=3,
).map(lambda lines: "\n".join(f"Node 0 {key}: {value}{unit}" for key, value, unit in lines))

_SYSFS_READERS: list[Callable[[HostFS], object]] = [
    read_cpus,
    read_l3_caches,
    read_numa_nodes,
    read_cpufreq,
    read_rapl_zones,
]


@FILES
@given(_fuzzed(SYSFS_TREE), st.one_of(_MEMINFO, st.none()))
def test_any_sysfs_tree_reads_as_a_list_or_unsupported(
    files: dict[str, str | None], meminfo: str | None
) -> None:
    if meminfo is not None:
        files[f"{N}/meminfo"] = meminfo
    with _host(files) as fs:
        for read in _SYSFS_READERS:
            result = read(fs)
            assert isinstance(result, list | Unsupported), (read.__name__, result)


# -- the kubelet's config file -------------------------------------------------------------------------------

KUBELET_CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cpuManagerPolicy: static
topologyManagerPolicy: single-numa-node
reservedSystemCPUs: "0-1"
cgroupDriver: systemd
podLogsDir: /var/log/pods
"""
# Scalars PyYAML resolves or constructs with Python's own conversions, and YAML's structural tricks.
_YAML_SCALARS = st.sampled_from(
    [
        "2001-02-30",
        "!!timestamp 2001-99-99",
        "!!int abc",
        "!!float x",
        "!!bool maybe",
        "!!binary xx",
        "!!python/object:os.system x",
        "&a [*a]",
        "&b {k: *b}",
        "*undefined",
        "1" * 5000,
        "[" * 60,  # deeper nesting costs PyYAML 0.2-0.8 s to refuse: the parametrized tests below
        "{a: 1, a: 2}",
        "0-4294967295",
        "0",
        "~",
        "[]",
        "!!set {a}",
    ]
)
_YAML_TEXT = st.one_of(
    st.lists(
        st.tuples(
            st.sampled_from(
                ["kind", "apiVersion", "cpuManagerPolicy", "reservedSystemCPUs", "x", "podLogsDir"]
            ),
            _YAML_SCALARS | _VALUES,
        ),
        max_size=4,
    ).map(lambda pairs: KUBELET_CONFIG + "".join(f"{key}: {value}\n" for key, value in pairs)),
    _YAML_SCALARS,
    st.text("[]{}:-&*!?|>'\"#%@`, \nab01", max_size=30),
    st.text(max_size=30),
)


@FUZZ
@given(_YAML_TEXT)
def test_any_kubelet_config_text_is_a_config_or_unsupported(text: str) -> None:
    config = parse_kubelet_config(text, "/var/lib/kubelet/config.yaml")
    assert isinstance(config, KubeletConfig | Unsupported)


@FILES
@given(_YAML_TEXT.map(lambda t: t.encode(errors="surrogatepass")) | st.binary(max_size=60))
def test_any_kubelet_config_file_is_a_config_or_unsupported(data: bytes) -> None:
    with _host({"var/lib/kubelet/config.yaml": data}) as fs:
        config = read_kubelet_config(fs)
        logs = pod_logs_dir(fs)
    assert isinstance(config, KubeletConfig | Unsupported)
    assert isinstance(logs, str) and logs


@pytest.mark.parametrize("text", ["a: 2001-02-30", "a: " + "1" * 5000, "a: !!bool maybe", "[" * 1_000_000])
def test_yaml_python_cannot_build_is_unsupported_not_a_crash(text: str) -> None:
    started = time.perf_counter()
    config = parse_kubelet_config(text, "/var/lib/kubelet/config.yaml")
    assert isinstance(config, Unsupported)
    assert config.reason.startswith("/var/lib/kubelet/config.yaml: not valid YAML: ")
    assert time.perf_counter() - started < 5.0
    with _host({"var/lib/kubelet/config.yaml": text}) as fs:
        assert pod_logs_dir(fs) == POD_LOGS_DIR


# -- the policy file -----------------------------------------------------------------------------------------

POLICY = """\
default:
  gold: {cache: {max: 2, min: 2}, mba: {percentage: 80}, pstate: {ratio: 3.0, monitoring: on}}
skylake:
  - Gold:
      - cache: {Max: 4, Min: 4}
"""
_POLICY_TEXT = st.one_of(
    st.lists(
        st.tuples(
            st.sampled_from(["default", "skylake", "default.gold", "x"]),
            st.sampled_from(["cache", "mba", "pstate", "gold", "max", "Min"]),
            _YAML_SCALARS | _VALUES,
        ),
        max_size=3,
    ).map(lambda items: POLICY + "".join(f"{p}:\n  {k}: {v}\n" for p, k, v in items)),
    _YAML_TEXT,
)
json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["default", "gold", "cache", "max", "min", "mba", "x"]), children, max_size=3
        )
    ),
    max_leaves=15,
)


@FUZZ
@given(json_like)
def test_any_policy_document_is_a_book_or_a_config_error(data: Any) -> None:
    try:
        book = parse_policies(data)
    except ConfigError:
        return
    assert isinstance(book, PolicyBook)


@FILES
@given(_POLICY_TEXT.map(lambda t: t.encode(errors="surrogatepass")) | st.binary(max_size=60))
def test_any_policy_file_is_a_book_or_a_config_error(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as root:
        path = Path(root, "policy.yaml")
        path.write_bytes(data)
        try:
            book = load_policy_file(path)
        except ConfigError as exc:
            assert str(path) in str(exc)
            return
    assert isinstance(book, PolicyBook)


def _alias_bomb(levels: int) -> str:
    """A policy file of a few hundred bytes whose aliases stand for width ** levels policies."""
    lines = ["a0: &a0 {cache: {max: 1, min: 1}}"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join([*lines, f"default: *a{levels - 1}"])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("default: 2001-02-30", "is not valid YAML"),
        ("default: !!int x", "is not valid YAML"),
        ("[" * 1_000_000, "is not valid YAML"),
        ("default: &a [*a]", "refers to itself"),
        ("default: &a {gold: *a}", "refers to itself"),
        # 400 bytes standing for 10 million policies: 15 s and 1.2 GB before (9 levels: memory exhausted).
        (_alias_bomb(7), "default must be a mapping"),
    ],
    ids=["bad-date", "bad-int", "deep", "self-list", "self-map", "aliases"],
)
def test_hostile_policy_files_are_config_errors_in_bounded_time(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=problem):
        load_policy_file(path)
    assert time.perf_counter() - started < 5.0


def test_a_policy_file_that_is_not_text_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"default:\n  gold: \xff\n")
    with pytest.raises(ConfigError, match=f"policy file {path}: not UTF-8 text"):
        load_policy_file(path)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"node_name: 2001-02-30\n", "is not valid YAML"),
        (b"node_name: !!bool maybe\n", "is not valid YAML"),
        (b"node_name: " + b"[" * 5000, "is not valid YAML"),
        (b"node_name: \xff\n", "not UTF-8 text"),
    ],
    ids=["bad-date", "bad-bool", "deep", "not-text"],
)
def test_hostile_agent_config_files_are_config_errors(tmp_path: Path, content: bytes, problem: str) -> None:
    # The agent's own config file takes the same YAML reader as the policy file (rmd_api.settings_layers).
    config = tmp_path / "agent.yaml"
    config.write_bytes(content)
    with pytest.raises(ConfigError, match=problem):
        load_settings(config_file=config)


@FUZZ
@given(st.lists(st.text(max_size=30) | st.sampled_from(["cpu family\t: 6", "model\t: 85", "model: x", ""])))
def test_any_cpuinfo_gives_a_platform_or_none(lines: list[str]) -> None:
    assert platform_from_cpuinfo("\n".join(lines)) in (None, "broadwell", "skylake", "kabylake")
