"""The numeric limits of a workload request, in one place: the CRD states the same numbers
(crds/rmdworkloads.intel.com.yaml; tests/unit/test_request_limits.py compares them), and the operator's
reader (rmd_api.workload_spec), the pod annotations (rmd_operator.pods), the agent's request check
(rmd_agent.plan.workload) and its policy file (rmd_agent.plan.policy) refuse a value outside them in the same
words. So an object stored before the CRD had a range still ends InvalidSpec, never silently applied.
rmd-operator accepted any number.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Error = Callable[[str], Exception]  # what the caller raises: InvalidSpec, ConfigError, a WorkloadRejected


@dataclass(frozen=True)
class IntRange:
    """Whole numbers from `low` to `high`, both included."""

    low: int
    high: int

    def contains(self, value: int) -> bool:
        return self.low <= value <= self.high

    def require(self, name: str, value: object, error: Error) -> int:
        """`value` if it is an int in range, else raises `error` naming `name`, the range and the value."""
        if isinstance(value, int) and not isinstance(value, bool) and self.contains(value):
            return value
        raise error(f"{name} must be an integer within {self.low}..{self.high}, not {value!r}")


@dataclass(frozen=True)
class RatioRange:
    """Decimal numbers strictly between `above` and `below`, written as `pattern` where they are strings."""

    above: float
    below: float
    pattern: str  # RE2 and Python alike: the CRD's CEL rule and the pod annotations use it
    rule: str  # what the messages say

    def parse(self, value: object) -> float | None:
        """The number in range that a decimal string or a number stands for; None for anything else."""
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            return None
        try:
            number = float(value)
        except ValueError:
            return None
        return number if self.above < number < self.below else None  # NaN fails both comparisons

    def require(self, name: str, value: object, error: Error) -> float:
        """`parse(value)`, or raises `error` naming `name` and the range (a string value stays quoted)."""
        number = self.parse(value)
        if number is None:
            raise error(f"{name} must be {self.rule}, not {value!r}")
        return number


# The kernel keeps a cache bit mask in a u32 (resctrl's staged config, on every architecture; x86 CPUID leaf
# 0x10 reports at most 32 bits), so no L3 cache offers a group more than 32 ways.
CACHE_WAYS = IntRange(0, 32)
MBA_PERCENTAGE = IntRange(1, 100)
# RMD's bound for MBps; resctrl's own "unlimited" is U32_MAX (4294967295).
MBA_MBPS = IntRange(1, 4294967290)
# The threshold the agent compares a core's branch-miss ratio with: 100 * misses / branches, never above 100.
# Only a ratio strictly above it counts as busy, so a threshold of 100 or more can never be passed, and 0
# (one miss in a sample makes the core busy) was refused already.
PSTATE_RATIO = RatioRange(
    above=0.0,
    below=100.0,
    pattern="[0-9]{1,4}([.][0-9]{1,4})?",
    rule="a decimal number greater than 0 and less than 100 (a branch-miss threshold in per cent), "
    'such as "3.0"',
)
