"""The per-workload sampling loop: read branch counters, decide, write limits; restore when stopped.

One asyncio task per workload. Each interval it reads the counters of the workload's CPUs and moves the
frequency limits of each cpufreq policy they form (usually one per CPU) through CpufreqControl. Counter or
write errors of one interval are logged and kept in `last_error`; sampling goes on. Cancelling the task
releases the counters and writes every touched limit back; a failure to write back propagates from the task.

The reads and writes are small sysfs and perf fd operations made directly in the event loop: each takes
microseconds, less than handing it to a thread would.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from rmd_agent.errors import HostReadError
from rmd_agent.pstate.counters import CounterSource, CounterUnavailable
from rmd_agent.pstate.cpufreq_control import CpufreqControl, CpuFreqRange, CpufreqWriteError
from rmd_agent.pstate.policy import BranchCounts, Decision, PolicyConfig, decide

log = logging.getLogger(__name__)


@dataclass
class _Group:
    """The CPUs of one cpufreq policy: controlled through `lead`, counted together."""

    lead: int
    cpus: frozenset[int]
    freq_range: CpuFreqRange
    prev: BranchCounts
    low_streak: int = 0
    last: Decision | None = None


class WorkloadMonitor:
    def __init__(
        self,
        key: str,
        *,
        groups: list[_Group],
        config: PolicyConfig,
        control: CpufreqControl,
        counters: CounterSource,
        interval: float,
    ) -> None:
        self.key = key
        self.config = config
        self.interval = interval
        self._groups = groups
        self._control = control
        self._counters = counters
        self.last_error: str | None = None

    @classmethod
    def start(
        cls,
        key: str,
        *,
        policies: Mapping[int, frozenset[int]],
        config: PolicyConfig,
        control: CpufreqControl,
        counters: CounterSource,
        interval: float,
    ) -> WorkloadMonitor:
        """Read each policy's range and first counts. `policies` maps a lead CPU to the CPUs it governs.
        CounterUnavailable or HostReadError (after releasing what it opened) if either is unreadable."""
        if interval <= 0:
            raise ValueError(f"sampling interval must be positive, not {interval}")
        groups = []
        try:
            for lead, cpus in sorted(policies.items()):
                groups.append(_Group(lead, cpus, control.read_range(lead), _read_sum(counters, cpus)))
        except (CounterUnavailable, HostReadError):
            for cpus in policies.values():
                for cpu in cpus:
                    counters.release(cpu)
            raise
        return cls(key, groups=groups, config=config, control=control, counters=counters, interval=interval)

    @property
    def cpus(self) -> frozenset[int]:
        return frozenset().union(*(g.cpus for g in self._groups))

    @property
    def decisions(self) -> dict[int, Decision]:
        """The last decision per lead CPU (absent until its first good sample)."""
        return {g.lead: g.last for g in self._groups if g.last is not None}

    def step(self) -> None:
        """One sample of every policy: decide and write what changed."""
        errors = []
        for group in self._groups:
            try:
                self._step_group(group)
            except (CounterUnavailable, CpufreqWriteError) as exc:
                errors.append(exc.reason)
            except HostReadError as exc:
                errors.append(str(exc))
        error = "; ".join(errors) or None
        if error and error != self.last_error:
            log.warning("P-state monitor %s: %s", self.key, error)
        self.last_error = error

    async def run(self) -> None:
        """Sample every `interval` until cancelled, then restore."""
        try:
            while True:
                await asyncio.sleep(self.interval)
                self.step()
        finally:
            self.stop()

    def stop(self) -> None:
        """Release the counters and write back every limit this monitor's CPUs had. Raises
        CpufreqWriteError if a limit cannot be written back (the control keeps it for a retry)."""
        for cpu in self.cpus:
            self._counters.release(cpu)
        self._control.restore(g.lead for g in self._groups)

    def _step_group(self, group: _Group) -> None:
        cur = _read_sum(self._counters, group.cpus)
        current = self._control.read_limits(group.lead)
        decision = decide(
            self.config, group.freq_range.steps, group.prev, cur, current, low_streak=group.low_streak
        )
        group.prev = cur
        group.low_streak = decision.low_streak
        group.last = decision
        if decision.limits != current:
            self._control.set_limits({group.lead: decision.limits})


def _read_sum(counters: CounterSource, cpus: frozenset[int]) -> BranchCounts:
    total = BranchCounts(0, 0)
    for cpu in sorted(cpus):
        total += counters.read(cpu)
    return total
