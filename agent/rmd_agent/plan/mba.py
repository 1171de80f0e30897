"""Memory bandwidth values as the kernel holds them: the one home of the rounding rule, and what a workload's
MBA request became on the node (`MbaApplied`, for the status). Pure: no I/O.

In percentage mode the kernel takes multiples of info/MB/bandwidth_gran and rounds a value up to the next one
(15 on a 10% step holds 20). The planner writes that value itself, so the group's schemata reads back as
planned, and the status reports it beside the request. Mounted with mba_MBps, the kernel takes the value as
given (its feedback loop sets the hardware's percentage underneath): nothing is rounded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rmd_agent.plan.workload import Workload

if TYPE_CHECKING:
    from rmd_agent.observe.resctrl import MbaInfo

MBA_UNLIMITED_MBPS = 2**32 - 1  # resctrl's "no limit" in mba_MBps mode
MBA_UNLIMITED_PERCENT = 100


def kernel_value(requested: int, mba: MbaInfo) -> int:
    """The MB value the kernel holds once `requested` is written: a percentage rounded up to a multiple of
    bandwidth_gran (at most 100), MBps as given."""
    if mba.mbps or mba.bandwidth_gran <= 0:
        return requested
    return min(MBA_UNLIMITED_PERCENT, -(-requested // mba.bandwidth_gran) * mba.bandwidth_gran)


@dataclass(frozen=True)
class MbaApplied:
    """A workload's MBA request and the value its group holds on the workload's domains."""

    requested: int
    value: int
    mbps: bool
    step: int  # bandwidth_gran in percentage mode; 0 with mba_MBps (no step)

    @property
    def rounded(self) -> bool:
        return self.value != self.requested

    @property
    def detail(self) -> str:
        """Why the value differs from the request, for people; "" when it does not. Only percentages are
        ever rounded (`kernel_value` keeps MBps as given)."""
        if not self.rounded:
            return ""
        return (
            f"MBA {self.requested}% rounded up to {self.value}%: the node's MBA step (bandwidth_gran) is "
            f"{self.step}%"
        )


def mba_applied(w: Workload, held: Mapping[int, int], mba: MbaInfo | None) -> MbaApplied | None:
    """What `w`'s MBA request became, from `held` (MB domain -> the value its group's schemata holds there,
    on the workload's domains); None without a request or without a value held."""
    if w.mba is None or not held or mba is None:
        return None
    # The plan writes one value on all of the workload's domains; the largest is the one it gets anywhere.
    return MbaApplied(w.mba, max(held.values()), mba.mbps, 0 if mba.mbps else mba.bandwidth_gran)
