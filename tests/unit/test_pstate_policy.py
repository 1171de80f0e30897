"""The branch-ratio frequency policy (rmd_agent.pstate.policy): pure, so mostly properties."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmd_agent.pstate.policy import (
    BranchCounts,
    Decision,
    FreqLimits,
    PolicyConfig,
    Vote,
    branch_miss_pct,
    clamp,
    decide,
    frequency_steps,
)

KHZ = st.integers(min_value=100_000, max_value=6_000_000)


@st.composite
def cpu_ranges(draw: st.DrawFn) -> tuple[int, int, tuple[int, ...]]:
    lo = draw(KHZ)
    hi = draw(st.integers(min_value=lo, max_value=lo + 5_000_000))
    available = draw(st.lists(st.integers(min_value=lo // 2, max_value=hi * 2), max_size=20))
    return lo, hi, frequency_steps(lo, hi, available, levels=draw(st.integers(1, 40)))


counts = st.integers(min_value=0, max_value=2**48)
limits_anywhere = st.builds(FreqLimits, st.integers(1, 10_000_000), st.integers(1, 10_000_000))


def _config(threshold: float = 2.0, down_after: int = 3, idle: int = 1_000) -> PolicyConfig:
    return PolicyConfig(threshold_pct=threshold, idle_branches=idle, down_after=down_after)


def _sample(prev: BranchCounts, branches: int, ratio_pct: float) -> BranchCounts:
    return BranchCounts(prev.branches + branches, prev.misses + round(branches * ratio_pct / 100))


# -- the ratio -----------------------------------------------------------------------------------------


@given(counts, counts, st.integers(1, 2**40), st.integers(0, 2**40))
def test_ratio_is_misses_per_hundred_branches(b0: int, m0: int, db: int, dm: int) -> None:
    ratio = branch_miss_pct(BranchCounts(b0, m0), BranchCounts(b0 + db, m0 + dm))
    assert ratio == pytest.approx(dm * 100 / db)


def test_ratio_is_none_without_branches_or_when_counters_go_back() -> None:
    start = BranchCounts(1_000, 10)
    assert branch_miss_pct(start, start) is None
    assert branch_miss_pct(start, BranchCounts(900, 20)) is None
    assert branch_miss_pct(start, BranchCounts(2_000, 5)) is None


# -- steps ---------------------------------------------------------------------------------------------


@given(cpu_ranges())
def test_steps_run_from_cpuinfo_min_to_max(r: tuple[int, int, tuple[int, ...]]) -> None:
    lo, hi, steps = r
    assert steps[0] == lo
    assert steps[-1] == hi
    assert list(steps) == sorted(set(steps))


@given(KHZ, st.integers(0, 5_000_000), st.integers(2, 30))
def test_generated_steps_are_whole_100mhz_inside(lo: int, span: int, levels: int) -> None:
    steps = frequency_steps(lo, lo + span, levels=levels)
    assert len(steps) <= levels
    assert all(f % 100_000 == 0 for f in steps[1:-1])


def test_driver_frequencies_are_used_when_listed() -> None:
    listed = [2_601_000, 2_600_000, 2_200_000, 1_800_000, 1_200_000, 900_000]
    steps = frequency_steps(1_200_000, 2_601_000, listed)
    assert steps == tuple(sorted(f for f in listed if 1_200_000 <= f <= 2_601_000))


def test_bad_range_is_refused() -> None:
    with pytest.raises(ValueError):
        frequency_steps(2_000_000, 1_000_000)
    with pytest.raises(ValueError):
        PolicyConfig(threshold_pct=0)


# -- decisions: invariants -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One decision's inputs: the core's steps, its counters before and after, limits and streak."""

    lo: int
    hi: int
    steps: tuple[int, ...]
    prev: BranchCounts
    cur: BranchCounts
    current: FreqLimits
    streak: int
    config: PolicyConfig


@st.composite
def cases(draw: st.DrawFn, *, forward: bool = False) -> Case:
    lo, hi, steps = draw(cpu_ranges())
    prev = BranchCounts(draw(counts), draw(counts))
    back = 0 if forward else 2**20
    cur = BranchCounts(
        max(prev.branches + draw(st.integers(-back, 2**30)), 0),
        max(prev.misses + draw(st.integers(-back, 2**30)), 0),
    )
    return Case(
        lo,
        hi,
        steps,
        prev,
        cur,
        draw(limits_anywhere),
        draw(st.integers(0, 20)),
        _config(draw(st.floats(min_value=0.001, max_value=100)), down_after=draw(st.integers(1, 6))),
    )


def _decide(case: Case, cur: BranchCounts | None = None) -> Decision:
    return decide(case.config, case.steps, case.prev, cur or case.cur, case.current, low_streak=case.streak)


@settings(max_examples=300)
@given(cases())
def test_limits_always_inside_the_cpuinfo_range(case: Case) -> None:
    d = _decide(case)
    assert case.lo <= d.limits.min_khz <= d.limits.max_khz <= case.hi
    assert d.limits.min_khz in case.steps or d.limits == clamp(case.current, case.steps)


@settings(max_examples=300)
@given(cases(forward=True), st.integers(0, 2**30), st.integers(0, 2**30))
def test_response_is_monotone_in_the_ratio(case: Case, more_a: int, more_b: int) -> None:
    """With everything else equal, more misses per branch never gives a lower frequency."""
    fewer, more = sorted((more_a, more_b))
    a = _decide(case, BranchCounts(case.cur.branches, case.cur.misses + fewer))
    b = _decide(case, BranchCounts(case.cur.branches, case.cur.misses + more))
    assert a.limits.max_khz <= b.limits.max_khz
    assert a.limits.min_khz <= b.limits.min_khz


# -- decisions: behaviour ------------------------------------------------------------------------------

STEPS = frequency_steps(800_000, 3_500_000, levels=8)
UNPINNED = FreqLimits(STEPS[0], STEPS[-1])
START = BranchCounts(7_000_000, 70_000)


def test_above_threshold_pins_the_top_step_at_once() -> None:
    config = _config(threshold=2.0)
    d = decide(config, STEPS, START, _sample(START, 100_000, 2.5), FreqLimits.pinned(STEPS[0]), low_streak=2)
    assert d.vote is Vote.UP
    assert d.limits == FreqLimits.pinned(STEPS[-1])
    assert d.low_streak == 0
    assert d.ratio_pct == pytest.approx(2.5)


def test_at_or_below_threshold_holds_until_down_after_then_steps_down_one_at_a_time() -> None:
    config = _config(threshold=2.0, down_after=3)
    limits, streak, prev = UNPINNED, 0, START
    seen = []
    for _ in range(config.down_after - 1 + len(STEPS) + 2):
        cur = _sample(prev, 100_000, 2.0)  # exactly at the threshold: not above it
        d = decide(config, STEPS, prev, cur, limits, low_streak=streak)
        assert d.vote is Vote.LOW
        prev, limits, streak = cur, d.limits, d.low_streak
        seen.append(limits)
    # the first down_after-1 samples keep the limits as they were
    assert seen[: config.down_after - 1] == [UNPINNED] * (config.down_after - 1)
    # then one step per sample, pinned, from the step below the top down to the bottom, where it stays
    stepping = seen[config.down_after - 1 :]
    expected = [FreqLimits.pinned(f) for f in reversed(STEPS[:-1])]
    assert stepping[: len(expected)] == expected
    assert set(stepping[len(expected) :]) == {FreqLimits.pinned(STEPS[0])}


def test_a_short_lull_does_not_lower_a_busy_core() -> None:
    config = _config(threshold=1.0, down_after=4)
    limits, streak, prev = FreqLimits.pinned(STEPS[-1]), 0, START
    pattern = [0.2, 0.2, 0.2, 3.0] * 5  # three low samples, then a busy one, repeated
    for ratio in pattern:
        cur = _sample(prev, 50_000, ratio)
        d = decide(config, STEPS, prev, cur, limits, low_streak=streak)
        prev, limits, streak = cur, d.limits, d.low_streak
        assert limits == FreqLimits.pinned(STEPS[-1])


def test_an_idle_core_counts_as_low_whatever_its_ratio() -> None:
    config = _config(threshold=1.0, down_after=1, idle=10_000)
    top = FreqLimits.pinned(STEPS[-1])
    d = decide(config, STEPS, START, _sample(START, 9_999, 50.0), top, low_streak=0)
    assert d.vote is Vote.LOW
    assert d.ratio_pct is None
    assert d.limits == FreqLimits.pinned(STEPS[-2])


def test_counters_going_back_hold_and_keep_the_streak() -> None:
    config = _config(down_after=3)
    current = FreqLimits.pinned(STEPS[3])
    d = decide(config, STEPS, START, BranchCounts(START.branches - 1, START.misses), current, low_streak=2)
    assert d.vote is Vote.HOLD
    assert d.limits == current
    assert d.low_streak == 2


def test_stepping_down_from_between_steps_goes_to_the_step_below() -> None:
    config = _config(down_after=1)
    between = FreqLimits.pinned((STEPS[4] + STEPS[5]) // 2)
    d = decide(config, STEPS, START, _sample(START, 100_000, 0.0), between, low_streak=0)
    assert d.limits == FreqLimits.pinned(STEPS[4])
