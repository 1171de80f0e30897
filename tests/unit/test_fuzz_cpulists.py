"""Fuzz campaign (docs/security.md, "Hostile input"): the cpu-list parsers. Any text gives CPUs or the
parser's own error within the deadline, and no text makes a parser build more than the CPUs Linux can have."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmd_api.cpuset import (
    MAX_CPU_ID,
    CpuListError,
    format_cpu_list,
    parse_cpu_list,
    parse_cpu_list_entries,
    parse_cpu_mask,
)
from rmd_api.kubelet.checkpoint import parse_kubelet_cpuset

FUZZ = settings.get_profile("fuzz")

# Numbers around the bound and far beyond it, and the spellings int() takes that the syntax does not.
_numbers = st.one_of(
    st.integers(0, 70_000).map(str),
    st.integers(0, 2**64).map(str),
    st.sampled_from(["", "-1", "+1", "1_0", "٣", " 1", "0x1f", "1e3", "9" * 5000]),
)
_items = st.tuples(_numbers, st.sampled_from(["", "-", "--", " - "]), _numbers).map("".join)
cpu_lists = st.one_of(
    st.lists(_items, max_size=8).map(",".join),
    st.text("0123456789,- \n", max_size=40),
    st.text(max_size=40),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | cpu_lists,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=12,
)


def _bounded(cpus: frozenset[int]) -> bool:
    return all(isinstance(c, int) and 0 <= c <= MAX_CPU_ID for c in cpus)


@FUZZ
@given(cpu_lists)
def test_any_text_is_a_cpu_list_or_a_cpu_list_error(text: str) -> None:
    try:
        cpus = parse_cpu_list(text)
    except CpuListError as exc:
        assert str(exc).startswith("invalid cpu list")
        return
    assert _bounded(cpus)
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@FUZZ
@given(json_values)
def test_any_manifest_value_is_cpus_or_a_cpu_list_error(value: object) -> None:
    try:
        cpus = parse_cpu_list_entries(value, "spec.coreIds")
    except CpuListError as exc:
        assert str(exc).startswith("spec.coreIds")
        return
    assert _bounded(cpus)


@FUZZ
@given(st.one_of(st.text("0123456789abcdefABCDEF,", max_size=40), st.text(max_size=20)))
def test_any_text_is_a_cpu_mask_or_a_value_error(text: str) -> None:
    try:
        cpus = parse_cpu_mask(text)
    except ValueError:
        return
    assert _bounded(cpus)


@FUZZ
@given(cpu_lists)
def test_any_text_is_a_kubelet_cpuset_or_a_value_error(text: str) -> None:
    try:
        cpus = parse_kubelet_cpuset(text)
    except ValueError:
        return
    assert _bounded(cpus)


# -- large adversarial inputs --------------------------------------------------------------------------------

_REPEATED_RANGE = ",".join([f"0-{MAX_CPU_ID}"] * 150_000)  # 1.2 MB naming every possible CPU 150 000 times
_MANY_SINGLES = ",".join(str(i % (MAX_CPU_ID + 1)) for i in range(200_000))  # 1.3 MB of single CPUs
_MAX_SECONDS = 5.0  # well under a second on an idle machine; a regression takes minutes
_MAX_BYTES = 64 * 1024 * 1024  # a regression takes gigabytes


def _measured(
    parse: Callable[[str], frozenset[int]], text: str
) -> tuple[frozenset[int] | Exception, float, int]:
    """What `parse` makes of `text`, in how many seconds, and its peak of allocated bytes (a second run:
    tracing slows it down)."""

    def run() -> frozenset[int] | Exception:
        try:
            return parse(text)
        except ValueError as exc:
            return exc

    started = time.perf_counter()
    result = run()
    elapsed = time.perf_counter() - started
    tracemalloc.start()
    try:
        run()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, elapsed, peak


@pytest.mark.parametrize("parse", [parse_cpu_list, parse_kubelet_cpuset], ids=["linux", "kubelet"])
def test_huge_ranges_are_refused_without_being_expanded(parse: Callable[[str], frozenset[int]]) -> None:
    # Smallest first: an unbounded parser fails the first assertion before it tries 4 billion CPUs.
    for text in (f"0-{MAX_CPU_ID + 1}", "0-10000000", "0-4294967295", "4294967295", f"{MAX_CPU_ID + 1}"):
        result, elapsed, peak = _measured(parse, text)
        assert isinstance(result, ValueError), f"{text!r} gave {len(result)} CPUs"
        assert "beyond" in str(result)
        assert elapsed < _MAX_SECONDS and peak < _MAX_BYTES, (text, elapsed, peak)


@pytest.mark.parametrize("parse", [parse_cpu_list, parse_kubelet_cpuset], ids=["linux", "kubelet"])
@pytest.mark.parametrize("text", [_REPEATED_RANGE, _MANY_SINGLES], ids=["repeated-range", "many-singles"])
def test_a_megabyte_cpu_list_parses_in_bounded_time_and_memory(
    parse: Callable[[str], frozenset[int]], text: str
) -> None:
    result, elapsed, peak = _measured(parse, text)
    assert result == frozenset(range(MAX_CPU_ID + 1))
    assert elapsed < _MAX_SECONDS, elapsed
    assert peak < _MAX_BYTES, peak


def test_the_error_for_a_megabyte_list_does_not_repeat_it() -> None:
    with pytest.raises(CpuListError) as caught:
        parse_cpu_list(_REPEATED_RANGE + ",x")
    assert len(str(caught.value)) < 300
