"""Per-CPU branch counters: retired branch instructions and branch misses, cumulative.

`PerfEventCounters` opens the kernel's generic hardware events (perf_event_open(2), PERF_TYPE_HARDWARE
BRANCH_INSTRUCTIONS and BRANCH_MISSES) per CPU for every process (pid=-1, cpu=N), as one group so both are
counted over exactly the same time even when the PMU multiplexes. That needs root or CAP_PERFMON (per-CPU
events are refused to others unless kernel.perf_event_paranoid <= 0) and a CPU whose PMU the kernel knows:
VMs usually have none, and the open fails with ENOENT.

`FileCounters` reads the counts a simulated node writes as files (rmd_sim.perf keeps them):

    <host root>/.rmd-sim/perf/cpuN/branches        cumulative branch instructions, decimal, newline
    <host root>/.rmd-sim/perf/cpuN/branch_misses   cumulative branch misses, decimal, newline

The setting `pstate_counters` chooses between them (`counter_source`): perf everywhere but on simulated
nodes, which set files.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from rmd_agent.errors import AgentError, ConfigError, HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.pstate.policy import BranchCounts

log = logging.getLogger(__name__)

SIM_PERF_DIR = ".rmd-sim/perf"  # relative to the host root; the layout rmd_sim.perf writes
PERF, FILES = "perf", "files"  # the values of the setting pstate_counters

# perf_event_open syscall numbers (arch/*/entry/syscalls, include/uapi/asm-generic/unistd.h).
PERF_EVENT_OPEN_SYSCALL = {
    "x86_64": 298,
    "aarch64": 241,
    "riscv64": 241,
    "i386": 336,
    "i686": 336,
    "armv7l": 364,
    "ppc64le": 319,
    "s390x": 331,
}
PERF_TYPE_HARDWARE = 0
PERF_COUNT_HW_BRANCH_INSTRUCTIONS = 4
PERF_COUNT_HW_BRANCH_MISSES = 5
PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_FORMAT_GROUP = 1 << 3
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_ATTR_SIZE_VER0 = 64
# Group read with both time fields: nr, time_enabled, time_running, then one value per event.
_GROUP_READ = struct.Struct("=5Q")


class CounterUnavailable(AgentError):
    """Counters of a CPU cannot be opened or read. `reason` is for people (and the workload status)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CounterSource(Protocol):
    def probe(self, cpu: int) -> Unsupported | None:
        """None if `read(cpu)` can work; otherwise why not. Leaves nothing open."""

    def read(self, cpu: int) -> BranchCounts:
        """Cumulative counts of `cpu` (opened on first use). CounterUnavailable if they cannot be had."""

    def release(self, cpu: int) -> None:
        """Stop counting on `cpu` (closes what read opened); harmless if nothing is open."""

    def close(self) -> None:
        """Release every CPU."""


class _PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr up to config1 (PERF_ATTR_SIZE_VER0); the kernel zero-extends the rest."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        # Bit 0 is `disabled`; all zero: count from the open, in user and kernel mode.
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
    ]


_ERRNO_REASONS = {
    errno.ENOENT: "no hardware counters: typical in VMs",
    errno.EOPNOTSUPP: "the PMU does not support these events (or has no interrupt)",
    errno.ENODEV: "no such CPU, or it is offline",
    errno.ENOSYS: "the kernel has no perf events (CONFIG_PERF_EVENTS is off)",
    errno.EBUSY: "the counters are held exclusively by someone else",
    errno.EMFILE: "too many open files",
    errno.EINVAL: "the kernel rejected the event attributes or the CPU number",
}


class PerfEventCounters:
    """Branch counters through perf_event_open. `fs` is only used to explain permission errors."""

    def __init__(self, fs: HostFS | None = None, machine: str | None = None) -> None:
        self._fs = fs
        self._machine = machine or platform.machine()
        self._fds: dict[int, tuple[int, int]] = {}  # cpu -> (leader: branches, member: misses)
        self._syscall: Callable[..., int] | None = None

    def __repr__(self) -> str:
        return f"PerfEventCounters(open={sorted(self._fds)})"

    def probe(self, cpu: int) -> Unsupported | None:
        if cpu in self._fds:
            return None
        try:
            fds = self._open_group(cpu)
        except CounterUnavailable as exc:
            return Unsupported(exc.reason)
        _close_group(fds)
        return None

    def read(self, cpu: int) -> BranchCounts:
        fds = self._fds.get(cpu)
        if fds is None:
            fds = self._fds[cpu] = self._open_group(cpu)
        try:
            data = os.read(fds[0], _GROUP_READ.size)
        except OSError as exc:
            raise CounterUnavailable(f"reading perf counters of CPU {cpu}: {_errno_text(exc.errno)}") from exc
        if len(data) != _GROUP_READ.size:
            raise CounterUnavailable(f"perf counters of CPU {cpu}: short read of {len(data)} bytes")
        nr, _enabled, _running, branches, misses = _GROUP_READ.unpack(data)
        if nr != 2:
            raise CounterUnavailable(f"perf counters of CPU {cpu}: group of {nr} events, expected 2")
        # Raw counts, not scaled by enabled/running: both events run together, so their ratio is exact
        # even under multiplexing, and raw counts never go backwards.
        return BranchCounts(branches, misses)

    def release(self, cpu: int) -> None:
        fds = self._fds.pop(cpu, None)
        if fds is not None:
            _close_group(fds)

    def close(self) -> None:
        for cpu in list(self._fds):
            self.release(cpu)

    def _open_group(self, cpu: int) -> tuple[int, int]:
        leader = self._open(cpu, PERF_COUNT_HW_BRANCH_INSTRUCTIONS, -1)
        try:
            member = self._open(cpu, PERF_COUNT_HW_BRANCH_MISSES, leader)
        except CounterUnavailable:
            os.close(leader)
            raise
        return leader, member

    def _open(self, cpu: int, config: int, group_fd: int) -> int:
        syscall_nr = PERF_EVENT_OPEN_SYSCALL.get(self._machine)
        if syscall_nr is None:
            raise CounterUnavailable(
                f"perf_event_open: no syscall number known for machine {self._machine!r}"
            )
        attr = _PerfEventAttr()
        attr.type = PERF_TYPE_HARDWARE
        attr.size = PERF_ATTR_SIZE_VER0
        attr.config = config
        attr.read_format = PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
        fd = self._libc_syscall()(
            ctypes.c_long(syscall_nr),
            ctypes.byref(attr),
            ctypes.c_long(-1),  # pid -1 with cpu N: every task that runs on CPU N
            ctypes.c_long(cpu),
            ctypes.c_long(group_fd),
            ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC),
        )
        if fd < 0:
            raise CounterUnavailable(self._explain(ctypes.get_errno(), cpu))
        return int(fd)

    def _libc_syscall(self) -> Callable[..., int]:
        if self._syscall is None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                func = libc.syscall
            except (OSError, AttributeError) as exc:
                raise CounterUnavailable(f"perf_event_open: no libc syscall() ({exc})") from exc
            func.restype = ctypes.c_long
            self._syscall = func
            return func
        return self._syscall

    def _explain(self, err: int, cpu: int) -> str:
        name = errno.errorcode.get(err, str(err))
        if err in (errno.EACCES, errno.EPERM):
            return (
                f"perf_event_open: {name} (per-CPU counters need root or CAP_PERFMON, or "
                f"kernel.perf_event_paranoid <= 0; it is {self._paranoid()})"
            )
        if err == errno.ENODEV:
            return f"perf_event_open: {name} (CPU {cpu}: {_ERRNO_REASONS[err]})"
        return f"perf_event_open: {_errno_text(err)}"

    def _paranoid(self) -> str:
        fs = self._fs or HostFS("/")
        try:
            return fs.read_str("proc/sys/kernel/perf_event_paranoid")
        except HostReadError:
            return "unknown"


def _errno_text(err: int | None) -> str:
    if err is None:
        return "unknown error"
    name = errno.errorcode.get(err, str(err))
    reason = _ERRNO_REASONS.get(err) or os.strerror(err)
    return f"{name} ({reason})"


def _close_group(fds: tuple[int, int]) -> None:
    for fd in reversed(fds):
        try:
            os.close(fd)
        except OSError as exc:  # nothing to undo; a leaked counter would only cost a PMU slot
            log.warning("closing perf event fd %d: %s", fd, exc)


class FileCounters:
    """Counters a simulated node exposes as files under `directory` (normally <root>/.rmd-sim/perf)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    @classmethod
    def for_host(cls, fs: HostFS) -> FileCounters:
        return cls(fs.path(SIM_PERF_DIR))

    def __repr__(self) -> str:
        return f"FileCounters({str(self.directory)!r})"

    def probe(self, cpu: int) -> Unsupported | None:
        try:
            self.read(cpu)
        except CounterUnavailable as exc:
            return Unsupported(exc.reason)
        return None

    def read(self, cpu: int) -> BranchCounts:
        fs = HostFS(self.directory)
        try:
            return BranchCounts(
                fs.read_int(f"cpu{cpu}/branches"),
                fs.read_int(f"cpu{cpu}/branch_misses"),
            )
        except HostReadError as exc:
            raise CounterUnavailable(f"simulated counters {self.directory}/{exc}") from exc

    def release(self, cpu: int) -> None:
        """Nothing is held open."""

    def close(self) -> None:
        """Nothing is held open."""


def counter_source(kind: str, fs: HostFS) -> CounterSource:
    """The branch counters setting `pstate_counters` names: the kernel's perf events, or a simulated
    node's files under `fs`."""
    if kind == PERF:
        return PerfEventCounters(fs)
    if kind == FILES:
        return FileCounters.for_host(fs)
    raise ConfigError(f"setting pstate_counters: {kind!r} must be {PERF!r} or {FILES!r}")
