import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmd_sim.spec import NodeSpec, SpecError, load_spec, spec_from_mapping


def test_default_spec_is_the_documented_machine() -> None:
    spec = NodeSpec.default()
    assert (spec.sockets, spec.cores_per_socket, spec.threads_per_core, spec.numa_nodes) == (2, 16, 2, 2)
    assert spec.cpus == 64
    assert (spec.l3_ways, spec.cbm_mask, spec.cbm_len, spec.num_closids, spec.mba) == (
        11,
        "7ff",
        11,
        16,
        True,
    )
    assert spec.rapl_zones == ("package", "dram")
    assert (spec.cpufreq_min_khz, spec.cpufreq_max_khz) == (800_000, 3_500_000)


def test_linux_cpu_numbering_puts_siblings_after_all_first_threads() -> None:
    spec = NodeSpec.default()
    # cpu = thread*(sockets*cores) + socket*cores + core
    assert spec.cpu_id(socket=0, core=0, thread=1) == 32
    assert spec.cpu_id(socket=1, core=3, thread=0) == 19
    assert spec.cpu_location(51) == (1, 3, 1)
    assert spec.thread_siblings(19) == [19, 51]
    assert spec.cpus_of_socket(1) == [*range(16, 32), *range(48, 64)]
    assert spec.cpus_of_node(0) == [*range(0, 16), *range(32, 48)]


def test_large_spec_has_256_cpus_over_8_numa_nodes_within_sockets() -> None:
    spec = NodeSpec.large()
    assert (spec.cpus, spec.numa_nodes, spec.sockets) == (256, 8, 2)
    for node in range(8):
        cpus = spec.cpus_of_node(node)
        assert len(cpus) == 32
        assert {spec.cpu_location(c)[0] for c in cpus} == {spec.socket_of_node(node)}
    assert spec.cbm_mask == "7fff" and spec.l3_ways == 15


@st.composite
def topologies(draw: st.DrawFn) -> NodeSpec:
    sockets = draw(st.integers(1, 4))
    per_socket = draw(st.sampled_from([1, 2, 4]))
    cores = per_socket * draw(st.integers(1, 6))
    threads = draw(st.integers(1, 2))
    return NodeSpec(
        sockets=sockets, cores_per_socket=cores, threads_per_core=threads, numa_nodes=sockets * per_socket
    )


@given(topologies())
def test_cpu_ids_cover_every_cpu_once_and_nodes_partition_them(spec: NodeSpec) -> None:
    ids = [
        spec.cpu_id(s, c, t)
        for s in range(spec.sockets)
        for c in range(spec.cores_per_socket)
        for t in range(spec.threads_per_core)
    ]
    assert sorted(ids) == list(range(spec.cpus))
    assert all(spec.cpu_location(spec.cpu_id(*spec.cpu_location(i))) == spec.cpu_location(i) for i in ids)
    by_node = [spec.cpus_of_node(n) for n in range(spec.numa_nodes)]
    assert sorted(c for cpus in by_node for c in cpus) == list(range(spec.cpus))
    assert len({len(cpus) for cpus in by_node}) == 1  # nodes split sockets evenly
    for cpu in ids:  # hyperthreads never straddle NUMA nodes
        assert {spec.numa_node_of(s) for s in spec.thread_siblings(cpu)} == {spec.numa_node_of(cpu)}


def test_builtin_names_load(tmp_path: Path) -> None:
    assert load_spec("default") == NodeSpec.default()
    assert load_spec("large") == NodeSpec.large()


def test_yaml_file_overrides_default_fields(tmp_path: Path) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(
        "sockets: 1\nnuma_nodes: 1\nl3_ways: 12\nrapl_zones: [package, core, psys]\nsparse_masks: 1\n"
    )
    spec = load_spec(path)
    assert spec.name == "odd"
    assert (spec.sockets, spec.cpus, spec.l3_ways) == (1, 32, 12)
    assert spec.cbm_mask == "fff"  # derived from l3_ways when the file leaves it out
    assert spec.rapl_zones == ("package", "core", "psys")
    assert spec.sparse_masks == 1
    assert spec.num_closids == NodeSpec.default().num_closids


def test_json_file_with_large_base(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"base": "large", "num_closids": 8, "name": "big8"}))
    spec = load_spec(path)
    assert spec == dataclasses.replace(NodeSpec.large(), num_closids=8, name="big8")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("socket: 2\n", "unknown spec key(s): socket"),
        ("mba: 1\n", "mba must be true or false"),
        ("sockets: two\n", "sockets must be an integer"),
        ("cbm_mask: 0x7ff\n", "quoted hex string"),
        ("numa_nodes: 3\n", "multiple of sockets"),
        ("l3_ways: 11\ncbm_mask: 'ff'\n", "does not match l3_ways"),
        ("rapl_zones: [dram]\n", "subzones of package"),
        ("reserved_cpus: '0-99'\n", "beyond the 64"),
        ("- a list\n", "expected a mapping"),
        ("base: huge\n", "base must be one of"),
        ("resctrl_mounted: true\nrdt: false\n", "refuses to mount"),
    ],
)
def test_bad_spec_files_give_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(SpecError, match=r"bad\.yaml") as info:
        load_spec(path)
    assert message in str(info.value)


def test_unknown_name_is_an_error() -> None:
    with pytest.raises(SpecError, match="built-in: default, large"):
        load_spec("medium")


def test_mapping_round_trip_through_to_dict() -> None:
    spec = dataclasses.replace(NodeSpec.large(), rapl_zones=("package", "dram", "psys"), sparse_masks=0)
    assert spec_from_mapping(json.loads(json.dumps(spec.to_dict()))) == spec
