import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmd_api.cpuset import CpuListError, format_cpu_list, format_cpu_mask, parse_cpu_list, parse_cpu_mask


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("", set()), ("\n", set()), ("1", {1}), ("1-2", {1, 2}), ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11})],
)
def test_parse_cpu_list(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["a", "1-", "3-1", "1,,2", "-1", "1 - 2x"])
def test_parse_cpu_list_rejects_malformed(text: str) -> None:
    with pytest.raises(CpuListError, match="invalid cpu list"):
        parse_cpu_list(text)


def test_format_collapses_runs_like_the_kernel() -> None:
    assert format_cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert format_cpu_list({1}) == "1"
    assert format_cpu_list([]) == ""


@given(st.frozensets(st.integers(min_value=0, max_value=1023)))
def test_format_then_parse_round_trips(cpus: frozenset[int]) -> None:
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


def test_parse_cpu_mask_reads_comma_separated_words() -> None:
    assert parse_cpu_mask("00000001,00000003\n") == {0, 1, 32}
    assert parse_cpu_mask("0") == frozenset()


@pytest.mark.parametrize(
    ("cpus", "nbits", "text"),
    [({0, 1, 32}, 33, "1,00000003"), ({31}, 32, "80000000"), ({5}, 96, "00000000,00000000,00000020")],
)
def test_format_cpu_mask_prints_words_like_the_kernel(cpus: set[int], nbits: int, text: str) -> None:
    assert format_cpu_mask(cpus, nbits) == text


@given(
    st.integers(min_value=1, max_value=300).flatmap(
        lambda n: st.tuples(st.just(n), st.frozensets(st.integers(min_value=0, max_value=n - 1)))
    )
)
def test_format_cpu_mask_round_trips_and_is_as_wide_as_the_bitmap(case: tuple[int, frozenset[int]]) -> None:
    nbits, cpus = case
    text = format_cpu_mask(cpus, nbits)
    assert parse_cpu_mask(text) == cpus
    words = text.split(",")
    assert len(words) == -(-nbits // 32)
    assert all(len(w) == 8 for w in words[1:])
    assert len(words[0]) == -(-(nbits - 32 * (len(words) - 1)) // 4)
