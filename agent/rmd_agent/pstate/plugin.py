"""The P-state part of a workload, as the agent's engine uses it (RMD's P-state plugin; docs/pstate.md).

`ratio` is a branch-miss threshold in per cent and `monitoring` turns the per-workload monitor on or off:

- monitoring on: a WorkloadMonitor samples the workload's CPUs and pins each to the top frequency step while
  its branch-miss ratio is above `ratio`, and steps it down while it is not (policy.py). Status "applied".
- monitoring off: nothing on the node changes (a ratio means nothing without a measurement to compare it
  with, and RMD's plugin released a workload by "disabling monitoring"). Status "off".
- the node cannot do it (no cpufreq, read-only /sys, no hardware counters, a cpufreq policy shared with
  CPUs outside the workload): nothing changes, status "unsupported: <reason>". The workload's cache part is
  the engine's business and still applies.

Removing a workload, or closing the controller, writes back every limit that was changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from rmd_agent.errors import AgentError, HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.observe.cpufreq import read_cpufreq
from rmd_agent.pstate.counters import CounterSource, CounterUnavailable
from rmd_agent.pstate.cpufreq_control import CpufreqControl, CpufreqWriteError, cpufreq_dir
from rmd_agent.pstate.monitor import WorkloadMonitor
from rmd_agent.pstate.policy import PolicyConfig
from rmd_api.cpuset import format_cpu_list

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.1
DEFAULT_DOWN_AFTER = 10  # low samples (1 s at the default interval) before the first step down
DEFAULT_IDLE_BRANCHES = 10_000  # per interval; DPDK's branch monitor used the same floor per 100 µs poll


class PStateState(StrEnum):
    APPLIED = "applied"
    OFF = "off"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class PStateResult:
    state: PStateState
    reason: str = ""  # why, when unsupported

    @property
    def status(self) -> str:
        """ "applied", "off" or "unsupported: <reason>": the workload status text."""
        return f"unsupported: {self.reason}" if self.state is PStateState.UNSUPPORTED else str(self.state)

    def __str__(self) -> str:
        return self.status


class PStateConflict(AgentError):
    """CPUs already under another workload's P-state monitor (the engine should have refused the workload)."""


@dataclass
class _Entry:
    cpus: frozenset[int]
    ratio: float
    monitoring: bool
    result: PStateResult
    monitor: WorkloadMonitor | None = None
    task: asyncio.Task[None] | None = None


def probe_pstate(
    fs: HostFS, counters: CounterSource, cpus: Iterable[int] | None = None
) -> Unsupported | None:
    """None if the node (or just `cpus`) can run the P-state monitor; otherwise why not."""
    if cpus is None:
        found = read_cpufreq(fs)
        if isinstance(found, Unsupported):
            return found
        if not found:
            return Unsupported("no online CPUs")
        cpus = [found[0].cpu]
    return _check_cpus(CpufreqControl(fs), counters, sorted(set(cpus)))


def _check_cpus(control: CpufreqControl, counters: CounterSource, cpus: list[int]) -> Unsupported | None:
    for cpu in cpus:
        if not control.fs.is_dir(cpufreq_dir(cpu)):
            return Unsupported(
                f"no cpufreq for CPU {cpu} (/{cpufreq_dir(cpu)} is absent: no frequency driver, "
                "typical in VMs)"
            )
        try:
            control.read_range(cpu)
            control.read_limits(cpu)
        except HostReadError as exc:
            return Unsupported(f"cpufreq is not readable: {exc}")
        why = control.writable(cpu)
        if why:
            return Unsupported(why)
    for cpu in cpus:
        why_not = counters.probe(cpu)
        if why_not is not None:
            return why_not
    return None


def _policies(control: CpufreqControl, cpus: frozenset[int]) -> dict[int, frozenset[int]] | Unsupported:
    """Lead CPU -> CPUs of each cpufreq policy; Unsupported if a policy reaches outside `cpus`."""
    policies: dict[int, frozenset[int]] = {}
    for cpu in sorted(cpus):
        try:
            shared = control.policy_cpus(cpu)
        except HostReadError as exc:
            return Unsupported(f"cpufreq is not readable: {exc}")
        outside = shared - cpus
        if outside:
            return Unsupported(
                f"CPU {cpu}'s cpufreq policy also governs CPU(s) {format_cpu_list(outside)}, which are not "
                "the workload's: per-core P-states need a frequency driver with one policy per CPU"
            )
        policies[min(shared)] = shared
    return policies


class PStateController:
    """The P-state side of every workload on the node, by workload key. Use from one event loop."""

    def __init__(
        self,
        fs: HostFS,
        counters: CounterSource,
        *,
        interval: float = DEFAULT_INTERVAL_S,
        down_after: int = DEFAULT_DOWN_AFTER,
        idle_branches: int = DEFAULT_IDLE_BRANCHES,
        control: CpufreqControl | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, not {interval}")
        self.fs = fs
        self.counters = counters
        self.control = control or CpufreqControl(fs)
        self.interval = interval
        self.down_after = down_after
        self.idle_branches = idle_branches
        self._entries: dict[str, _Entry] = {}
        self._lock = asyncio.Lock()

    @property
    def results(self) -> Mapping[str, PStateResult]:
        return {key: e.result for key, e in self._entries.items()}

    def monitor(self, key: str) -> WorkloadMonitor | None:
        entry = self._entries.get(key)
        return entry.monitor if entry else None

    async def apply(self, key: str, cpus: frozenset[int], ratio: float, monitoring: bool) -> PStateResult:
        """Give workload `key` its P-state; again with other values replaces it. Idempotent."""
        if not cpus:
            raise ValueError(f"workload {key}: no CPUs")
        config = PolicyConfig(ratio, idle_branches=self.idle_branches, down_after=self.down_after)
        async with self._lock:
            entry = self._entries.get(key)
            same = entry and (entry.cpus, entry.ratio, entry.monitoring) == (cpus, ratio, monitoring)
            if entry and same and (entry.task is None or not entry.task.done()):
                return entry.result
            for other_key, other in self._entries.items():
                if other_key != key and other.monitor is not None and other.cpus & cpus:
                    raise PStateConflict(
                        f"workload {key}: CPU(s) {format_cpu_list(other.cpus & cpus)} already have the "
                        f"P-state of workload {other_key}"
                    )
            if entry:
                await self._remove(key)
            entry = _Entry(cpus, ratio, monitoring, PStateResult(PStateState.OFF))
            if monitoring:
                entry.result = self._start(key, entry, config)
            self._entries[key] = entry
            log.info("P-state of %s on CPUs %s: %s", key, format_cpu_list(cpus), entry.result)
            return entry.result

    async def remove(self, key: str) -> None:
        """Stop `key`'s monitor and write back its CPUs' limits. CpufreqWriteError if that fails (the limits
        stay remembered; close() retries them). Unknown keys are ignored."""
        async with self._lock:
            await self._remove(key)

    async def close(self) -> None:
        """Remove every workload, write back anything left, close the counters."""
        async with self._lock:
            errors = []
            for key in list(self._entries):
                try:
                    await self._remove(key)
                except CpufreqWriteError as exc:
                    errors.append(exc.reason)
            try:
                self.control.restore_all()
            except CpufreqWriteError as exc:
                errors.append(exc.reason)
            self.counters.close()
            if errors:
                raise CpufreqWriteError("; ".join(errors))

    def _start(self, key: str, entry: _Entry, config: PolicyConfig) -> PStateResult:
        why = _check_cpus(self.control, self.counters, sorted(entry.cpus))
        policies = _policies(self.control, entry.cpus) if why is None else why
        if isinstance(policies, Unsupported):
            return PStateResult(PStateState.UNSUPPORTED, policies.reason)
        try:
            monitor = WorkloadMonitor.start(
                key,
                policies=policies,
                config=config,
                control=self.control,
                counters=self.counters,
                interval=self.interval,
            )
        except CounterUnavailable as exc:
            return PStateResult(PStateState.UNSUPPORTED, exc.reason)
        except HostReadError as exc:
            return PStateResult(PStateState.UNSUPPORTED, f"cpufreq is not readable: {exc}")
        entry.monitor = monitor
        entry.task = asyncio.create_task(monitor.run(), name=f"pstate-monitor:{key}")
        return PStateResult(PStateState.APPLIED)

    async def _remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is None or entry.monitor is None:
            return
        failure: BaseException | None = None
        if entry.task is not None:
            entry.task.cancel()
            await asyncio.wait([entry.task])
            if not entry.task.cancelled():
                failure = entry.task.exception()
        # The task restores in its own `finally`, unless it was cancelled before it ever ran; stopping
        # again is harmless (nothing left to restore) and covers that case.
        try:
            entry.monitor.stop()
        except CpufreqWriteError as exc:
            failure = exc
        if isinstance(failure, CpufreqWriteError):
            raise failure
        if failure is not None:
            log.error("P-state monitor of %s had failed: %r", key, failure)
