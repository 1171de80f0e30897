"""The branch-ratio frequency policy: from two counter readings of a core, its next frequency limits.

The load signal is the branch-miss ratio in per cent, 100 * Δbranch_misses / Δbranch_instructions over one
sampling interval (the formula of DPDK's vm_power_manager branch monitor, where RMD's P-state plugin comes
from; see docs/pstate.md). A core spinning in an idle poll loop predicts nearly every branch; real work makes
branches less predictable and the ratio rises.

- ratio above the threshold: pin the core to the top step at once (a busy core must not wait);
- ratio at or below it, or hardly any branches at all (an idle core): a "low" sample. Only after `down_after`
  consecutive low samples does the core step down, one step per further low sample, to the bottom step.
  This is the hysteresis: one busy sample restores the top step, a short lull does not lower it;
- counters that went backwards (a reset or wrap): hold, and keep the count of low samples.

Limits are always pinned (scaling_min == scaling_max == a step), except while holding, when the current
limits are kept, clamped into the cpuinfo range. Pure: no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

DEFAULT_STEP_LEVELS = 8  # frequency steps when the driver lists none (intel_pstate accepts any kHz value)
STEP_ROUNDING_KHZ = 100_000  # intermediate steps are whole 100 MHz, like the P-state ratios of Intel CPUs


@dataclass(frozen=True)
class BranchCounts:
    """Cumulative counts of one core (or the sum over the CPUs of one cpufreq policy)."""

    branches: int
    misses: int

    def __add__(self, other: BranchCounts) -> BranchCounts:
        return BranchCounts(self.branches + other.branches, self.misses + other.misses)


@dataclass(frozen=True)
class FreqLimits:
    """scaling_min_freq / scaling_max_freq, in kHz."""

    min_khz: int
    max_khz: int

    @classmethod
    def pinned(cls, khz: int) -> FreqLimits:
        return cls(khz, khz)


@dataclass(frozen=True)
class PolicyConfig:
    threshold_pct: float  # the workload's `ratio`: branch misses per 100 branch instructions
    idle_branches: int = 10_000  # fewer branches than this in one interval: the core is idle, a low sample
    down_after: int = 10  # consecutive low samples before the first step down

    def __post_init__(self) -> None:
        if not self.threshold_pct > 0:
            raise ValueError(f"threshold must be positive, not {self.threshold_pct}")
        if self.idle_branches < 0 or self.down_after < 1:
            raise ValueError("idle_branches must be >= 0 and down_after >= 1")


class Vote(StrEnum):
    UP = "up"
    LOW = "low"
    HOLD = "hold"


@dataclass(frozen=True)
class Decision:
    limits: FreqLimits  # what the core's limits should be after this sample
    low_streak: int  # consecutive low samples so far, to pass to the next decision
    vote: Vote
    ratio_pct: float | None  # None when the sample had no usable ratio (idle or counters went backwards)


def branch_miss_pct(prev: BranchCounts, cur: BranchCounts) -> float | None:
    """100 * Δmisses / Δbranches; None if either counter went backwards or no branch retired."""
    branches = cur.branches - prev.branches
    misses = cur.misses - prev.misses
    if branches <= 0 or misses < 0:
        return None
    return 100.0 * misses / branches


def frequency_steps(
    cpuinfo_min_khz: int,
    cpuinfo_max_khz: int,
    available_khz: Iterable[int] = (),
    levels: int = DEFAULT_STEP_LEVELS,
) -> tuple[int, ...]:
    """Ascending frequencies the policy moves between, always from cpuinfo_min to cpuinfo_max.

    The driver's scaling_available_frequencies (acpi-cpufreq) are used when given; otherwise `levels` evenly
    spaced steps, the inner ones rounded to 100 MHz.
    """
    if not 0 < cpuinfo_min_khz <= cpuinfo_max_khz:
        raise ValueError(f"bad cpuinfo range {cpuinfo_min_khz}-{cpuinfo_max_khz} kHz")
    inside = {f for f in available_khz if cpuinfo_min_khz <= f <= cpuinfo_max_khz}
    if not inside:
        span = cpuinfo_max_khz - cpuinfo_min_khz
        for i in range(1, max(levels, 2) - 1):
            raw = cpuinfo_min_khz + span * i / (max(levels, 2) - 1)
            inside.add(round(raw / STEP_ROUNDING_KHZ) * STEP_ROUNDING_KHZ)
    inside |= {cpuinfo_min_khz, cpuinfo_max_khz}
    return tuple(sorted(f for f in inside if cpuinfo_min_khz <= f <= cpuinfo_max_khz))


def clamp(limits: FreqLimits, steps: tuple[int, ...]) -> FreqLimits:
    """Limits moved into [steps[0], steps[-1]] with min <= max."""
    lo, hi = steps[0], steps[-1]
    max_khz = min(max(limits.max_khz, lo), hi)
    min_khz = min(max(limits.min_khz, lo), max_khz)
    return FreqLimits(min_khz, max_khz)


def decide(
    config: PolicyConfig,
    steps: tuple[int, ...],
    prev: BranchCounts,
    cur: BranchCounts,
    current: FreqLimits,
    *,
    low_streak: int,
) -> Decision:
    """The next limits of one core from its counters at the start and end of an interval."""
    if not steps:
        raise ValueError("no frequency steps")
    held = clamp(current, steps)
    d_branches = cur.branches - prev.branches
    d_misses = cur.misses - prev.misses
    if d_branches < 0 or d_misses < 0:
        return Decision(held, low_streak, Vote.HOLD, None)
    ratio = branch_miss_pct(prev, cur)
    if d_branches >= max(config.idle_branches, 1) and ratio is not None and ratio > config.threshold_pct:
        return Decision(FreqLimits.pinned(steps[-1]), 0, Vote.UP, ratio)
    streak = min(low_streak + 1, config.down_after)  # capped: only "enough low samples yet?" matters
    usable = ratio if d_branches >= config.idle_branches else None
    if streak < config.down_after:
        return Decision(held, streak, Vote.LOW, usable)
    lower = steps[max(bisect.bisect_left(steps, held.max_khz) - 1, 0)]  # highest step below the current max
    return Decision(FreqLimits.pinned(lower), streak, Vote.LOW, usable)
