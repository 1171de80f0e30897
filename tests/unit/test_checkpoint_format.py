"""Kubelet checkpoint format: checksums against the kubelet's own test vectors, decoding, encoding.

The vectors and most file texts are the fixtures of kubernetes' state_checkpoint_test.go (cpumanager and
memorymanager) as listed in reference/numa-topology-podresources.md §2.3. Note the fixtures spell
"defaultCPUSet" where the kubelet writes "defaultCpuSet": Go matches JSON keys case-insensitively.
"""

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmd_api.cpuset import format_cpu_list
from rmd_api.kubelet.checkpoint import (
    CheckpointFormatError,
    CpuManagerState,
    GoPtr,
    GoStruct,
    MemoryBlock,
    MemoryManagerState,
    MemoryTable,
    NumaNodeMemoryState,
    decode_cpu_manager_state,
    decode_memory_manager_state,
    encode_cpu_manager_state_v2,
    encode_cpu_manager_state_v3,
    encode_cpu_manager_state_v4,
    encode_memory_manager_state,
    encode_memory_manager_state_v3,
    fnv1a_32,
    go_dump_for_hash,
    parse_kubelet_cpuset,
)

SOURCE = "/var/lib/kubelet/cpu_manager_state"
POD_ENTRIES = {"pod": {"container1": "4-6", "container2": "1-3"}}

# --- FNV-1a and the go-spew dump ---


@pytest.mark.parametrize(
    ("data", "expected"), [(b"", 0x811C9DC5), (b"a", 0xE40C292C), (b"foobar", 0xBF9CF968)]
)
def test_fnv1a_32_matches_the_published_test_vectors(data: bytes, expected: int) -> None:
    assert fnv1a_32(data) == expected


def _memory_table(total: int, system: int, allocatable: int, reserved: int, free: int) -> GoPtr:
    return GoPtr(
        GoStruct(
            (
                ("TotalMemSize", "uint64", total),
                ("SystemReserved", "uint64", system),
                ("Allocatable", "uint64", allocatable),
                ("Reserved", "uint64", reserved),
                ("Free", "uint64", free),
            )
        )
    )


def test_dump_reproduces_the_verified_memory_manager_string() -> None:
    node = GoPtr(
        GoStruct(
            (
                ("NumberOfAssignments", "int", 0),
                (
                    "MemoryMap",
                    "map[v1.ResourceName]*state.MemoryTable",
                    {"memory": _memory_table(2048, 512, 1536, 512, 1024)},
                ),
                ("Cells", "[]int", ()),
            )
        )
    )
    block = GoStruct(
        (("NUMAAffinity", "[]int", (0,)), ("Type", "v1.ResourceName", "memory"), ("Size", "uint64", 512))
    )
    checkpoint = GoStruct(
        (
            ("PolicyName", "string", "static"),
            ("MachineState", "state.NUMANodeMap", {0: node}),
            ("Entries", "state.ContainerMemoryAssignments", {"pod": {"container1": (block,)}}),
            ("Checksum", "checksum.Checksum", 0),
        )
    )
    dumped = go_dump_for_hash(GoPtr(checkpoint), "*state.MemoryManagerCheckpoint")
    assert dumped == (
        "(*state.MemoryManagerCheckpoint){PolicyName:(string)static MachineState:(state.NUMANodeMap)"
        "map[0:<*>{NumberOfAssignments:(int)0 MemoryMap:(map[v1.ResourceName]*state.MemoryTable)"
        "map[memory:<*>{TotalMemSize:(uint64)2048 SystemReserved:(uint64)512 Allocatable:(uint64)1536 "
        "Reserved:(uint64)512 Free:(uint64)1024}] Cells:([]int)[]}] "
        "Entries:(state.ContainerMemoryAssignments)map[pod:map[container1:[{NUMAAffinity:([]int)[0] "
        "Type:(v1.ResourceName)memory Size:(uint64)512}]]] "
        "Checksum:(checksum.Checksum)0}"
    )
    assert fnv1a_32(dumped.encode()) == 4215593881


def test_dump_tells_nil_from_empty_and_types_only_top_level_and_fields() -> None:
    value = GoStruct(
        (
            ("Nil", "map[string]string", None),
            ("Empty", "map[string]string", {}),
            ("NilSlice", "[]int", None),
            ("NilPtr", "*state.T", None),
            ("Inner", "map[string]*state.T", {"b": None, "a": GoPtr(GoStruct())}),
        )
    )
    assert go_dump_for_hash(value, "state.S") == (
        "(state.S){Nil:(map[string]string)<nil> Empty:(map[string]string)map[] NilSlice:([]int)<nil> "
        "NilPtr:(*state.T)<nil> Inner:(map[string]*state.T)map[a:<*>{} b:<nil>]}"
    )


def test_dump_sorts_int_keys_numerically_and_string_keys_bytewise() -> None:
    assert (
        go_dump_for_hash({10: "x", 9: "y", -1: "z"}, "map[int]string") == "(map[int]string)map[-1:z 9:y 10:x]"
    )
    assert go_dump_for_hash({"b": 1, "B": 2, "é": 3, "a": 4}, "map[string]int") == (
        "(map[string]int)map[B:2 a:4 b:1 é:3]"
    )


# --- the reference vectors, decoded ---

CPU_VECTORS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "v2 none policy, as the kubelet writes it (1353318690)",
        '{"policyName":"none","defaultCpuSet":"","checksum":1353318690}',
        {"policy_name": "none", "default_cpu_set": "", "entries": {}, "format_version": "v2"},
    ),
    (
        "v2 Restore valid checkpoint (3610638499)",
        json.dumps(
            {"policyName": "none", "defaultCPUSet": "1-3", "entries": POD_ENTRIES, "checksum": 3610638499}
        ),
        {"policy_name": "none", "default_cpu_set": "1-3", "entries": POD_ENTRIES, "format_version": "v2"},
    ),
    (
        "v1 with the type-name rewrite (2026311253)",
        json.dumps(
            {
                "policyName": "static",
                "defaultCPUSet": "7-9",
                "entries": {"containerID1": "4-6", "containerID2": "1-3"},
                "checksum": 2026311253,
            }
        ),
        {
            "policy_name": "static",
            "default_cpu_set": "7-9",
            "entries": {},
            "container_id_entries": {"containerID1": "4-6", "containerID2": "1-3"},
            "format_version": "v1",
        },
    ),
    (
        "v1 without entries (1694838852)",
        '{"policyName": "none", "defaultCPUSet": "1-3", "checksum": 1694838852}',
        {"policy_name": "none", "default_cpu_set": "1-3", "format_version": "v1"},
    ),
    (
        "v2 layout hashed as the V3 struct with empty PodEntries (1942532442)",
        json.dumps(
            {"policyName": "static", "defaultCPUSet": "7-9", "entries": POD_ENTRIES, "checksum": 1942532442}
        ),
        {"default_cpu_set": "7-9", "entries": POD_ENTRIES, "pod_entries": {}, "format_version": "v3"},
    ),
    (
        "v3 with podEntries, hashed under its own type name (2284712151)",
        json.dumps(
            {
                "policyName": "static",
                "defaultCPUSet": "1-2",
                "entries": {"pod1": {"container1": "5-6", "container2": "3-4"}},
                "podEntries": {"pod2": {"cpuSet": "7-9"}},
                "checksum": 2284712151,
            }
        ),
        {"default_cpu_set": "1-2", "pod_entries": {"pod2": "7-9"}, "format_version": "v3"},
    ),
    (
        "v4 data checksum (657950972)",
        json.dumps({"data": '{"policyName":"none","defaultCPUSet":"4-6"}', "checksum": 657950972}),
        {"policy_name": "none", "default_cpu_set": "4-6", "entries": {}, "format_version": "v4"},
    ),
    (
        "v4 with entries and podEntries in data (2328898362)",
        json.dumps(
            {
                "data": '{"policyName":"static","defaultCPUSet":"1-3","entries":{"pod":{"container1":"4-6",'
                '"container2":"7-9"}},"podEntries":{"pod":{"cpuSet":"4-10"}}}',
                "checksum": 2328898362,
            }
        ),
        {
            "entries": {"pod": {"container1": "4-6", "container2": "7-9"}},
            "pod_entries": {"pod": "4-10"},
            "format_version": "v4",
        },
    ),
    (
        "v4 ignores unknown fields in data (3492408555)",
        json.dumps(
            {
                "data": '{"policyName":"none","defaultCPUSet":"4-6","unknownField":"value"}',
                "checksum": 3492408555,
            }
        ),
        {"default_cpu_set": "4-6", "format_version": "v4"},
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [(t, e) for _, t, e in CPU_VECTORS], ids=[n for n, _, _ in CPU_VECTORS]
)
def test_cpu_vectors_decode_and_verify(text: str, expected: dict[str, Any]) -> None:
    state = decode_cpu_manager_state(text, SOURCE)
    assert state.verified
    for attribute, value in expected.items():
        assert getattr(state, attribute) == value, attribute


def _with_checksum(text: str, key: str, value: int) -> str:
    document = json.loads(text)
    document[key] = value
    return json.dumps(document)


@pytest.mark.parametrize("text", [t for _, t, _ in CPU_VECTORS], ids=[n for n, _, _ in CPU_VECTORS])
def test_cpu_vectors_with_another_checksum_are_refused(text: str) -> None:
    stored = json.loads(text)["checksum"]
    with pytest.raises(CheckpointFormatError) as caught:
        decode_cpu_manager_state(_with_checksum(text, "checksum", stored + 1), SOURCE)
    message = str(caught.value)
    assert message.startswith(f"{SOURCE}: checksum mismatch: file says {stored + 1}, content hashes to ")
    # The error names the most likely layout's hash; two vectors are hashed as a less likely one.
    if not any(vector in text for vector in ("1942532442", "1694838852")):
        assert message.endswith(f"content hashes to {stored}")


MEMORY_STATE = (
    '"machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,'
    '"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}}'
)
MEMORY_ENTRIES = '"entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}}'
MEMORY_POD_ENTRIES = '"podEntries":{"pod":{"memoryBlocks":[{"numaAffinity":[0],"type":"memory","size":512}]}}'
MEMORY_CLASSIC = '{"policyName":"static",' + MEMORY_STATE + "," + MEMORY_ENTRIES + ',"checksum":4215593881}'
MEMORY_DATA = '{"policyName":"static",' + MEMORY_STATE + "," + MEMORY_ENTRIES + "}"
BLOCK = MemoryBlock(numa_affinity=(0,), type="memory", size=512)
NODE0 = NumaNodeMemoryState(
    number_of_assignments=0,
    memory_map={
        "memory": MemoryTable(total=2048, system_reserved=512, allocatable=1536, reserved=512, free=1024)
    },
    cells=(),
)

MEMORY_VECTORS: list[tuple[str, str, str, str]] = [
    ("classic (4215593881)", MEMORY_CLASSIC, "checksum", "v1"),
    (
        "V2 with podEntries (1278640530)",
        '{"policyName":"static",'
        + MEMORY_STATE
        + ","
        + MEMORY_ENTRIES
        + ","
        + MEMORY_POD_ENTRIES
        + ',"checksum":1278640530}',
        "checksum",
        "v2",
    ),
    (
        # The top level is deliberately wrong, as in the kubelet's fixture: only data counts.
        "V3 data checksum (1849615440)",
        json.dumps(
            {"policyName": "other", "checksum": 1234, "data": MEMORY_DATA, "dataChecksum": 1849615440}
        ),
        "dataChecksum",
        "v3",
    ),
]


@pytest.mark.parametrize(
    ("text", "version"), [(t, v) for _, t, _, v in MEMORY_VECTORS], ids=[n for n, *_ in MEMORY_VECTORS]
)
def test_memory_vectors_decode_and_verify(text: str, version: str) -> None:
    state = decode_memory_manager_state(text, "mm")
    assert state.verified
    assert state.format_version == version
    assert state.policy_name == "static"
    assert state.machine_state == {0: NODE0}
    assert state.entries == {"pod": {"container1": (BLOCK,)}}
    assert state.pod_entries == ({"pod": (BLOCK,)} if version == "v2" else {})


@pytest.mark.parametrize(
    ("text", "key"), [(t, k) for _, t, k, _ in MEMORY_VECTORS], ids=[n for n, *_ in MEMORY_VECTORS]
)
def test_memory_vectors_with_another_checksum_are_refused(text: str, key: str) -> None:
    stored = json.loads(text)[key]
    with pytest.raises(
        CheckpointFormatError,
        match=f"^mm: checksum mismatch: file says {stored + 1}, content hashes to {stored}$",
    ):
        decode_memory_manager_state(_with_checksum(text, key, stored + 1), "mm")


# --- encoding: the exact bytes the kubelet writes ---


def test_encode_v2_none_policy_is_the_kubelets_file() -> None:
    assert encode_cpu_manager_state_v2("none", "", {}) == (
        '{"policyName":"none","defaultCpuSet":"","checksum":1353318690}'
    )


def test_encode_v2_with_entries_is_the_kubelets_file() -> None:
    assert encode_cpu_manager_state_v2("none", "1-3", POD_ENTRIES) == (
        '{"policyName":"none","defaultCpuSet":"1-3","entries":{"pod":{"container1":"4-6",'
        '"container2":"1-3"}},"checksum":3610638499}'
    )


def test_encode_v2_refuses_cpusets_the_kubelet_cannot_parse() -> None:
    with pytest.raises(ValueError, match="default_cpu_set"):
        encode_cpu_manager_state_v2("static", "1.3", {})
    with pytest.raises(ValueError, match="entries\\['p'\\]\\['c'\\]"):
        encode_cpu_manager_state_v2("static", "0", {"p": {"c": "3-1"}})


def test_encode_escapes_like_go() -> None:
    text = encode_cpu_manager_state_v2("<&>", "", {"p\u2028": {"c\n": "1"}})
    assert '"policyName":"\\u003c\\u0026\\u003e"' in text
    assert '"p\\u2028":{"c\\n":"1"}' in text
    assert decode_cpu_manager_state(text, SOURCE).entries == {"p\u2028": {"c\n": "1"}}


def test_encode_memory_classic_is_the_kubelets_file() -> None:
    text = encode_memory_manager_state("static", {0: NODE0}, {"pod": {"container1": [BLOCK]}})
    assert text == MEMORY_CLASSIC


def test_encode_memory_v3_matches_the_kubelets_data_and_both_checksums() -> None:
    text = encode_memory_manager_state_v3("static", {0: NODE0}, {"pod": {"container1": [BLOCK]}}, {})
    document = json.loads(text)
    assert document["data"] == MEMORY_DATA
    assert document["dataChecksum"] == 1849615440
    assert document["checksum"] == 4215593881  # older kubelets still verify the top level


def test_encode_memory_sorts_numa_keys_as_go_does() -> None:
    nodes = {n: NumaNodeMemoryState(0, {}, (n,)) for n in (2, 10)}
    text = encode_memory_manager_state("Static", nodes, {})
    assert text.index('"10":') < text.index('"2":')
    assert decode_memory_manager_state(text, "mm").machine_state == nodes


def test_encode_cpu_v3_and_v4_write_pod_entries_canonically() -> None:
    v3 = json.loads(encode_cpu_manager_state_v3("static", "0", {}, {"p": "3,1,2", "q": ""}))
    assert v3["podEntries"] == {"p": {"cpuSet": "1-3"}, "q": {}}
    v4 = json.loads(encode_cpu_manager_state_v4("static", "0", {}, {"p": "3,1,2"}))
    assert v4["checksum"] == 0
    assert json.loads(v4["data"]) == {
        "policyName": "static",
        "defaultCpuSet": "0",
        "podEntries": {"p": {"cpuSet": "1-3"}},
    }


# --- decoding rules and refusals ---


def test_zero_checksum_means_none_for_v1_and_v2_only() -> None:
    v2 = decode_cpu_manager_state('{"policyName":"static","defaultCpuSet":"0-3","checksum":0}', SOURCE)
    assert (v2.format_version, v2.verified) == ("v2", False)
    v1 = decode_cpu_manager_state('{"policyName":"static","defaultCpuSet":"0","entries":{"id":"1"}}', SOURCE)
    assert (v1.format_version, v1.verified, v1.container_id_entries) == ("v1", False, {"id": "1"})
    with pytest.raises(CheckpointFormatError, match="checksum mismatch: file says 0"):
        decode_cpu_manager_state(json.dumps({"data": '{"policyName":"none"}', "dataChecksum": 0}), SOURCE)
    with pytest.raises(CheckpointFormatError, match="checksum mismatch: file says 0"):
        decode_memory_manager_state(json.dumps({"data": MEMORY_DATA}), "mm")


def test_zero_checksum_v3_falls_back_to_v2_and_drops_pod_entries_as_the_kubelet_does() -> None:
    text = '{"policyName":"static","defaultCpuSet":"0","podEntries":{"p":{"cpuSet":"1"}},"checksum":0}'
    state = decode_cpu_manager_state(text, SOURCE)
    assert (state.format_version, state.verified, state.pod_entries) == ("v2", False, {})


def test_absent_and_null_entries_hash_differently() -> None:
    # The kubelet pre-fills Entries with an empty map; JSON null makes it nil, which go-spew prints as <nil>.
    absent = '{"policyName":"none","defaultCpuSet":"","checksum":1353318690}'
    assert decode_cpu_manager_state(absent, SOURCE).verified
    with pytest.raises(CheckpointFormatError, match="checksum mismatch"):
        decode_cpu_manager_state(absent.replace('"checksum"', '"entries":null,"checksum"'), SOURCE)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "not valid JSON"),
        ("{", "not valid JSON"),
        ('{"checksum": NaN}', "not valid JSON"),
        ("[]", "expected a JSON object, found an array"),
        ("null", "expected a JSON object, found null"),
        ('{"policyName": 5}', "policyName: expected a string, found a number"),
        ('{"checksum": -1}', "does not fit a Go uint64"),
        ('{"checksum": 1.0}', "checksum: expected an integer"),
        ('{"policyName":"a","PolicyName":"b"}', "field 'policyName' appears more than once"),
        ('{"entries":{"p":{"c":"1"}},"entries":{}}', "appears more than once"),
        ('{"entries":{"p":{"c":"1"},"p":{}}}', "key appears more than once"),
        ('{"entries":{"p":{"c":1}}}', "entries['p']['c']: expected a string"),
        ('{"entries":{"p":{"c":"1"},"id":"2"}}', "entries['id']: expected a JSON object"),
        ('{"data":"{","dataChecksum":1}', "checksum mismatch"),
    ],
)
def test_cpu_decode_refuses_malformed_files(text: str, problem: str) -> None:
    with pytest.raises(CheckpointFormatError) as caught:
        decode_cpu_manager_state(text, SOURCE)
    assert caught.value.source == SOURCE
    assert problem in str(caught.value)


def test_cpu_decode_refuses_a_cpuset_the_kubelet_cannot_parse_even_with_a_good_checksum() -> None:
    # Fixture "Restore checkpoint with unparsable default cpu set" (3033143655).
    text = json.dumps({"data": '{"policyName":"none","defaultCPUSet":"1.3"}', "checksum": 3033143655})
    with pytest.raises(CheckpointFormatError, match=re.escape("defaultCpuSet: invalid cpuset '1.3'")):
        decode_cpu_manager_state(text, SOURCE)


def test_memory_decode_ignores_unknown_fields_in_data() -> None:
    # Fixture "Restore checkpoint ignoring unknown fields in data section" (2100279793).
    data = '{"unknownField":"value",' + MEMORY_DATA[1:]
    state = decode_memory_manager_state(json.dumps({"data": data, "dataChecksum": 2100279793}), "mm")
    assert state.entries == {"pod": {"container1": (BLOCK,)}}


@pytest.mark.parametrize(
    ("replace", "by", "problem"),
    [
        ('"0":{', '"x":{', "map key is not an integer"),
        ('"size":512', '"size":-512', "does not fit a Go uint64"),
        ('"cells":[]', '"cells":{}', "cells: expected an array"),
        ('"numaAffinity":[0]', '"numaAffinity":[0.5]', "numaAffinity[0]: expected an integer"),
    ],
)
def test_memory_decode_refuses_malformed_files(replace: str, by: str, problem: str) -> None:
    with pytest.raises(CheckpointFormatError, match=re.escape(problem)):
        decode_memory_manager_state(MEMORY_CLASSIC.replace(replace, by), "mm")


def test_memory_decode_refuses_a_null_node_even_with_a_good_checksum() -> None:
    struct = GoStruct(
        (
            ("PolicyName", "string", "Static"),
            ("MachineState", "state.NUMANodeMap", {0: None}),
            ("Entries", "state.ContainerMemoryAssignments", {}),
            ("Checksum", "checksum.Checksum", 0),
        )
    )
    checksum = fnv1a_32(go_dump_for_hash(GoPtr(struct), "*state.MemoryManagerCheckpoint").encode())
    text = f'{{"policyName":"Static","machineState":{{"0":null}},"checksum":{checksum}}}'
    with pytest.raises(CheckpointFormatError, match=re.escape("mm: machineState[0] is null")):
        decode_memory_manager_state(text, "mm")


@pytest.mark.parametrize(
    ("text", "cpus"), [("", set()), ("0", {0}), ("0-2,5", {0, 1, 2, 5}), ("+3", {3}), ("2-2", {2})]
)
def test_parse_kubelet_cpuset_accepts_what_go_accepts(text: str, cpus: set[int]) -> None:
    assert parse_kubelet_cpuset(text) == cpus


@pytest.mark.parametrize("text", [" 1", "1,", "1,,2", "-1", "3-1", "1-2-3", "a", "1_0", "٣", "0-99999999"])
def test_parse_kubelet_cpuset_refuses_what_go_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="invalid cpuset"):
        parse_kubelet_cpuset(text)


# --- properties ---

cpusets = st.frozensets(st.integers(min_value=0, max_value=255), max_size=12).map(format_cpu_list)
names = st.text(max_size=8)
entries_strategy = st.dictionaries(names, st.dictionaries(names, cpusets, max_size=3), max_size=3)
pod_entries_strategy = st.dictionaries(names, cpusets, max_size=3)


@given(st.sampled_from(["none", "static"]), cpusets, entries_strategy)
def test_cpu_v2_encode_then_decode_round_trips(
    policy: str, default: str, entries: dict[str, dict[str, str]]
) -> None:
    state = decode_cpu_manager_state(encode_cpu_manager_state_v2(policy, default, entries), SOURCE)
    assert state == CpuManagerState(policy, default, entries, {}, "v2")


@given(cpusets, entries_strategy, pod_entries_strategy, st.sampled_from(["v3", "v4"]))
def test_cpu_v3_v4_encode_then_decode_round_trips(
    default: str, entries: dict[str, dict[str, str]], pods: dict[str, str], version: str
) -> None:
    encode = encode_cpu_manager_state_v3 if version == "v3" else encode_cpu_manager_state_v4
    state = decode_cpu_manager_state(encode("static", default, entries, pods), SOURCE)
    assert state == CpuManagerState("static", default, entries, pods, version)


def _tamper(text: str, start: int, length: int, offset: int, replacement: str) -> str | None:
    position = start + offset % length
    if text[position] == replacement:
        return None
    return text[:position] + replacement + text[position + 1 :]


@given(
    cpusets.filter(bool),
    cpusets.filter(bool),
    st.booleans(),
    st.integers(min_value=0),
    st.sampled_from("0123456789,-"),
)
def test_changing_any_byte_of_a_cpuset_is_detected(
    default: str, assigned: str, in_entries: bool, offset: int, replacement: str
) -> None:
    text = encode_cpu_manager_state_v2("static", default, {"pod": {"app": assigned}})
    marker, value = ('"app":"', assigned) if in_entries else ('"defaultCpuSet":"', default)
    tampered = _tamper(text, text.index(marker) + len(marker), len(value), offset, replacement)
    if tampered is None:
        return
    with pytest.raises(CheckpointFormatError, match="checksum mismatch"):
        decode_cpu_manager_state(tampered, SOURCE)


@given(cpusets.filter(bool), st.integers(min_value=0), st.sampled_from("0123456789,-"))
def test_changing_any_byte_of_a_v4_data_cpuset_is_detected(
    default: str, offset: int, replacement: str
) -> None:
    text = encode_cpu_manager_state_v4("static", default, {}, {})
    marker = '\\"defaultCpuSet\\":\\"'
    tampered = _tamper(text, text.index(marker) + len(marker), len(default), offset, replacement)
    if tampered is None:
        return
    with pytest.raises(CheckpointFormatError, match="checksum mismatch"):
        decode_cpu_manager_state(tampered, SOURCE)


uint64s = st.integers(min_value=0, max_value=(1 << 64) - 1)
blocks = st.lists(
    st.builds(
        MemoryBlock,
        numa_affinity=st.lists(st.integers(0, 7), max_size=3).map(tuple),
        type=st.sampled_from(["memory", "hugepages-2Mi", "hugepages-1Gi"]),
        size=uint64s,
    ),
    max_size=3,
).map(tuple)
nodes = st.builds(
    NumaNodeMemoryState,
    number_of_assignments=st.integers(0, 100),
    memory_map=st.dictionaries(
        st.sampled_from(["memory", "hugepages-2Mi"]),
        st.builds(MemoryTable, uint64s, uint64s, uint64s, uint64s, uint64s),
        max_size=2,
    ),
    cells=st.lists(st.integers(0, 15), max_size=3).map(tuple),
)
machine_states = st.dictionaries(st.integers(0, 15), nodes, max_size=4)
memory_entries = st.dictionaries(names, st.dictionaries(names, blocks, max_size=2), max_size=3)


@given(st.sampled_from(["Static", "None"]), machine_states, memory_entries)
def test_memory_classic_encode_then_decode_round_trips(
    policy: str,
    machine: dict[int, NumaNodeMemoryState],
    entries: dict[str, dict[str, tuple[MemoryBlock, ...]]],
) -> None:
    state = decode_memory_manager_state(encode_memory_manager_state(policy, machine, entries), "mm")
    assert state == MemoryManagerState(policy, machine, entries, {}, "v1")


@given(machine_states, memory_entries, st.dictionaries(names, blocks, max_size=3))
def test_memory_v3_encode_then_decode_round_trips(
    machine: dict[int, NumaNodeMemoryState],
    entries: dict[str, dict[str, tuple[MemoryBlock, ...]]],
    pods: dict[str, tuple[MemoryBlock, ...]],
) -> None:
    state = decode_memory_manager_state(
        encode_memory_manager_state_v3("Static", machine, entries, pods), "mm"
    )
    assert state == MemoryManagerState("Static", machine, entries, pods, "v3")


FIELD_NAMES = [
    "policyName",
    "defaultCpuSet",
    "entries",
    "podEntries",
    "checksum",
    "data",
    "dataChecksum",
    "machineState",
    "memoryMap",
    "cells",
    "numaAffinity",
    "cpuSet",
    "memoryBlocks",
    "0",
]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(json_values)
def test_decoders_fail_only_with_checkpoint_format_error(value: object) -> None:
    text = json.dumps(value)
    for decode in (decode_cpu_manager_state, decode_memory_manager_state):
        try:
            decode(text, "fuzz")
        except CheckpointFormatError as exc:
            assert exc.source == "fuzz"
