"""Write per-CPU frequency limits (cpufreq scaling_min_freq / scaling_max_freq) and put them back exactly.

The first write to a CPU remembers its limits as they were; `restore` writes those back and forgets them.
`set_limits` is all or nothing: when a write fails, the files it already changed are written back to what
they held before the call, and CpufreqWriteError is raised. Writes are ordered so that min <= max holds after
every single write (older kernels reject a min above the max with EINVAL): when the new min is above the
current max, the max goes first, otherwise the min.

A cpufreq policy can govern several CPUs (acpi-cpufreq on older machines); its files are shared, so the
caller controls a policy through its lowest CPU and must own all of `policy_cpus(cpu)` (see plugin.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rmd_agent.errors import AgentError, HostReadError
from rmd_agent.hostfs import HostFS
from rmd_agent.pstate.policy import FreqLimits, frequency_steps

log = logging.getLogger(__name__)

MIN_FILE = "scaling_min_freq"
MAX_FILE = "scaling_max_freq"


def cpufreq_dir(cpu: int) -> str:
    return f"sys/devices/system/cpu/cpu{cpu}/cpufreq"


class CpufreqWriteError(AgentError):
    """A limit could not be written (or put back). `reason` names the file and the cause."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class CpuFreqRange:
    cpu: int
    cpuinfo_min_khz: int
    cpuinfo_max_khz: int
    steps: tuple[int, ...]  # ascending, from cpuinfo_min to cpuinfo_max (see policy.frequency_steps)


def write_sysfs(path: Path, text: str) -> None:
    """One write(2) of the whole value, as sysfs wants it."""
    with path.open("w") as f:
        f.write(text)


@dataclass(frozen=True)
class _Write:
    cpu: int
    name: str  # MIN_FILE or MAX_FILE
    value: int
    before: int


class CpufreqControl:
    """Frequency limits of the CPUs of a host tree. `writer` exists so tests can make a write fail."""

    def __init__(self, fs: HostFS, writer: Callable[[Path, str], None] = write_sysfs) -> None:
        self.fs = fs
        self._write_file = writer
        self._originals: dict[int, FreqLimits] = {}

    @property
    def originals(self) -> Mapping[int, FreqLimits]:
        """Limits of every touched CPU before the first change: what `restore` will write back."""
        return dict(self._originals)

    def adopt_originals(self, originals: Mapping[int, FreqLimits]) -> None:
        """Take over originals saved by an earlier run (after an agent restart), without overriding any."""
        for cpu, limits in originals.items():
            self._originals.setdefault(cpu, limits)

    def read_range(self, cpu: int) -> CpuFreqRange:
        """The cpuinfo range and the steps the policy may use. HostReadError if cpufreq is not readable."""
        base = cpufreq_dir(cpu)
        lo = self.fs.read_int(f"{base}/cpuinfo_min_freq")
        hi = self.fs.read_int(f"{base}/cpuinfo_max_freq")
        if not 0 < lo <= hi:
            raise HostReadError(f"{base}/cpuinfo_min_freq", f"cpuinfo range {lo}-{hi} kHz is not a range")
        available: list[int] = []
        if self.fs.exists(f"{base}/scaling_available_frequencies"):
            text = self.fs.read_str(f"{base}/scaling_available_frequencies")
            available = [int(word) for word in text.split() if word.isdigit()]
        return CpuFreqRange(cpu, lo, hi, frequency_steps(lo, hi, available))

    def read_limits(self, cpu: int) -> FreqLimits:
        base = cpufreq_dir(cpu)
        return FreqLimits(self.fs.read_int(f"{base}/{MIN_FILE}"), self.fs.read_int(f"{base}/{MAX_FILE}"))

    def policy_cpus(self, cpu: int) -> frozenset[int]:
        """The online CPUs sharing `cpu`'s cpufreq policy (affected_cpus); just `cpu` if it is not listed."""
        rel = f"{cpufreq_dir(cpu)}/affected_cpus"
        if not self.fs.exists(rel):
            return frozenset({cpu})
        words = self.fs.read_str(rel).split()
        try:
            return frozenset(int(w) for w in words) | {cpu}
        except ValueError:
            raise HostReadError(rel, f"expected CPU numbers, found {' '.join(words)[:40]!r}") from None

    def writable(self, cpu: int) -> str | None:
        """None if both limit files accept writes; otherwise why not (e.g. /sys mounted read-only)."""
        for name in (MIN_FILE, MAX_FILE):
            path = self.fs.path(f"{cpufreq_dir(cpu)}/{name}")
            if not path.is_file() or not os.access(path, os.W_OK):
                return f"/{cpufreq_dir(cpu)}/{name} is not writable (the agent needs root, /sys read-write)"
        return None

    def set_limits(self, changes: Mapping[int, FreqLimits]) -> None:
        """Give each CPU its limits, all or nothing (see the module doc). Unchanged limits are not written."""
        for cpu, limits in changes.items():
            if not 0 < limits.min_khz <= limits.max_khz:
                raise ValueError(f"CPU {cpu}: bad limits {limits}")
        try:
            current = {cpu: self.read_limits(cpu) for cpu in changes}
        except HostReadError as exc:
            raise CpufreqWriteError(f"cannot read the current limits: {exc}") from exc
        plan = [w for cpu, target in changes.items() for w in _ordered_writes(cpu, current[cpu], target)]
        new = [cpu for cpu in changes if cpu not in self._originals and current[cpu] != changes[cpu]]
        done: list[_Write] = []
        try:
            for w in plan:
                self._write(w.cpu, w.name, w.value)
                done.append(w)
        except CpufreqWriteError as exc:
            undo_errors = self._undo(done)
            detail = f"; putting back failed too: {'; '.join(undo_errors)}" if undo_errors else ""
            raise CpufreqWriteError(f"{exc.reason}{detail}") from exc
        for cpu in new:
            self._originals[cpu] = current[cpu]

    def restore(self, cpus: Iterable[int]) -> None:
        """Write back the original limits of `cpus` (those touched) and forget them. Tries every CPU; raises
        CpufreqWriteError naming all that failed, which stay remembered so a later call can retry."""
        errors = []
        for cpu in sorted(set(cpus) & set(self._originals)):
            original = self._originals[cpu]
            try:
                self.set_limits({cpu: original})
            except CpufreqWriteError as exc:
                errors.append(f"CPU {cpu}: {exc.reason}")
                continue
            del self._originals[cpu]
        if errors:
            raise CpufreqWriteError("restoring frequency limits failed: " + "; ".join(errors))

    def restore_all(self) -> None:
        self.restore(list(self._originals))

    def _write(self, cpu: int, name: str, value: int) -> None:
        rel = f"{cpufreq_dir(cpu)}/{name}"
        try:
            self._write_file(self.fs.path(rel), f"{value}\n")
        except OSError as exc:
            raise CpufreqWriteError(f"writing {value} to /{rel}: {exc.strerror or exc}") from exc

    def _undo(self, done: list[_Write]) -> list[str]:
        errors = []
        for w in reversed(done):  # the reverse of a valid order is valid: the same states, backwards
            try:
                self._write(w.cpu, w.name, w.before)
            except CpufreqWriteError as exc:
                errors.append(exc.reason)
        if errors:
            log.error("could not put back frequency limits after a failed write: %s", "; ".join(errors))
        return errors


def _ordered_writes(cpu: int, current: FreqLimits, target: FreqLimits) -> list[_Write]:
    min_write = _Write(cpu, MIN_FILE, target.min_khz, current.min_khz)
    max_write = _Write(cpu, MAX_FILE, target.max_khz, current.max_khz)
    order = [max_write, min_write] if target.min_khz > current.max_khz else [min_write, max_write]
    return [w for w in order if w.value != w.before]
