"""Fuzz campaign (docs/security.md, "Hostile input"): the kubelet's checkpoint files. Whatever a file holds,
decoding gives a state or CheckpointFormatError (the agent's readers: CheckpointError), within the deadline,
and no file makes the agent expand or hash more CPUs than a node can have."""

from __future__ import annotations

import json
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmd_agent.errors import CheckpointError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.checkpoints import read_cpu_manager_state, read_memory_manager_state
from rmd_api.cpuset import MAX_CPU_ID
from rmd_api.kubelet.checkpoint import (
    CheckpointFormatError,
    CpuManagerState,
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
)

FUZZ = settings.get_profile("fuzz")
SOURCE = "/var/lib/kubelet/cpu_manager_state"
ENTRIES = {"pod-a": {"app": "2-3", "init": "2-3"}, "pod-b": {"app": "4"}}
NODE = NumaNodeMemoryState(1, {"memory": MemoryTable(100, 10, 90, 20, 70)}, (0,))
BLOCKS = {"pod-a": {"app": (MemoryBlock((0,), "memory", 20),)}}

# Files the kubelet writes, in every format, to be mutated.
CPU_FILES = [
    encode_cpu_manager_state_v2("static", "0-1,5-7", ENTRIES),
    encode_cpu_manager_state_v3("static", "0-1,5-7", ENTRIES, {"pod-a": "2-3"}),
    encode_cpu_manager_state_v4("static", "0-1,5-7", ENTRIES, {"pod-a": "2-3"}),
    '{"policyName":"static","defaultCpuSet":"0-7","entries":{"c0ffee":"2"},"checksum":0}',  # v1
]
MEMORY_FILES = [
    encode_memory_manager_state("Static", {0: NODE}, BLOCKS),
    encode_memory_manager_state_v3(
        "Static", {0: NODE}, BLOCKS, {"pod-a": (MemoryBlock((0,), "memory", 20),)}
    ),
]
# What a mutation inserts: JSON's punctuation, cpuset syntax, escapes, big numbers, nesting.
_INSERTS = st.one_of(
    st.text('{}[]",:-0123456789 \\unlte', max_size=6),
    st.sampled_from(["null", "0", "-1", "1e3", "1.0", "18446744073709551616", "\\ud800", "[" * 50, "9" * 30]),
    st.text(max_size=4),
)


@st.composite
def _mutated(draw: st.DrawFn, files: list[str]) -> str:
    """A kubelet file with a few spans replaced (truncations and insertions included)."""
    text = draw(st.sampled_from(files))
    for _ in range(draw(st.integers(1, 3))):
        start = draw(st.integers(0, len(text)))
        end = draw(st.integers(start, min(len(text), start + 8)))
        text = text[:start] + draw(_INSERTS) + text[end:]
    return text


def _decodes(decode: Callable[[str, str], object], text: str) -> None:
    try:
        decode(text, SOURCE)
    except CheckpointFormatError as exc:
        assert exc.source == SOURCE


@FUZZ
@given(_mutated(CPU_FILES) | st.text(max_size=60))
def test_any_cpu_manager_text_decodes_or_is_a_checkpoint_format_error(text: str) -> None:
    _decodes(decode_cpu_manager_state, text)


@FUZZ
@given(_mutated(MEMORY_FILES) | st.text(max_size=60))
def test_any_memory_manager_text_decodes_or_is_a_checkpoint_format_error(text: str) -> None:
    _decodes(decode_memory_manager_state, text)


@settings(FUZZ, max_examples=FUZZ.max_examples // 2)  # writes files
@given(st.binary(max_size=200) | _mutated(CPU_FILES + MEMORY_FILES).map(str.encode))
def test_any_file_reads_as_a_state_unsupported_or_a_checkpoint_error(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as root:
        kubelet = Path(root, "var/lib/kubelet")
        kubelet.mkdir(parents=True)
        for name in ("cpu_manager_state", "memory_manager_state"):
            (kubelet / name).write_bytes(data)
        fs = HostFS(root)
        for read, kind in (
            (read_cpu_manager_state, CpuManagerState),
            (read_memory_manager_state, MemoryManagerState),
        ):
            try:
                state = read(fs)
            except CheckpointError as exc:
                assert "(not trusted)" in str(exc) or "not UTF-8" in str(exc)
            else:
                assert isinstance(state, kind | Unsupported)


# -- large adversarial files ---------------------------------------------------------------------------------

_MAX_SECONDS = 5.0  # a fraction of a second on an idle machine; each regression took minutes or gigabytes
_MAX_BYTES = 256 * 1024 * 1024  # the 1 MB text and its parse are in it; a regression takes gigabytes


def _refused_in_bounds(decode: Callable[[str, str], object], text: str) -> CheckpointFormatError:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(CheckpointFormatError) as caught:
            decode(text, SOURCE)
    finally:
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < _MAX_SECONDS, elapsed
    assert peak < _MAX_BYTES, peak
    return caught.value


def test_pod_entries_naming_more_cpus_than_a_node_has_are_refused_before_hashing() -> None:
    # 6 kB naming every possible CPU 200 times: the checksum over it took 40 s and 3 GB before the bound.
    pods = {f"pod-{i}": {"cpuSet": f"0-{MAX_CPU_ID}"} for i in range(200)}
    text = json.dumps({"policyName": "static", "defaultCpuSet": "", "podEntries": pods, "checksum": 1})
    error = _refused_in_bounds(decode_cpu_manager_state, text)
    assert "more CPUs than a node can have" in str(error)


def test_entries_of_an_unverified_file_are_checked_without_expanding_them() -> None:
    # Checksum 0 is "none" for v1/v2 files, so every cpuset is parsed: 0.6 MB, 20 000 times every CPU.
    entries = {f"pod-{i}": {"app": f"0-{MAX_CPU_ID}"} for i in range(20_000)}
    text = json.dumps({"policyName": "static", "defaultCpuSet": "", "entries": entries, "checksum": 0})
    started = time.perf_counter()
    state = decode_cpu_manager_state(text, SOURCE)
    assert time.perf_counter() - started < _MAX_SECONDS
    assert len(state.entries) == 20_000 and not state.verified


def test_a_numa_node_key_too_long_for_any_integer_is_a_checkpoint_format_error() -> None:
    # int() refuses 4300+ digits with a plain ValueError, which escaped the decoder before.
    text = json.dumps({"policyName": "Static", "machineState": {"1" * 5000: None}, "checksum": 1})
    error = _refused_in_bounds(decode_memory_manager_state, text)
    assert "map key is not an integer" in str(error)


def test_a_megabyte_of_nesting_is_a_checkpoint_format_error() -> None:
    for decode in (decode_cpu_manager_state, decode_memory_manager_state):
        _refused_in_bounds(decode, '{"entries":' + "[" * 1_000_000)
