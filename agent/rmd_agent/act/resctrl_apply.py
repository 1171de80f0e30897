"""Execute resctrl operations (`plan.resctrl_layout.diff`) on the mount, all or nothing.

* One command per write(2): each schemata or cpus_list write opens the file O_WRONLY and writes the whole
  command once (resctrl parses every write as one command; O_TRUNC means nothing to it).
* `locked()` holds flock(LOCK_EX) on the mount directory, as the kernel documentation asks of every
  allocator around read-compute-write, so two tools never pick the same ways or CLOSID.
* On a refused operation the kernel's reason is read from info/last_cmd_status (before anything else
  overwrites it), the operations already done are undone in reverse order, and ResctrlWriteError carries
  both. Undoing restores each changed schemata value and cpus_list, removes the groups created and recreates
  the groups removed, so the tree is back where it started. Reversing a sequence of valid states passes
  through the same valid states, so the undo is accepted whenever the kernel accepted the original steps.
* Only groups `owned(name)` holds (and the root group's schemata) are written: every operation is checked
  before the first write, including where a cpus_list write takes its CPUs from, so a programming error can
  never touch another tool's group.

`on_write` is called after each operation the kernel accepted; it is None in production and lets the crash
tests stop the process between two writes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rmd_agent.engine_api import EngineUnavailable
from rmd_agent.errors import AgentError
from rmd_agent.observe.resctrl import ResctrlState
from rmd_agent.plan.resctrl_layout import Mkdir, Operation, Rmdir, WriteCpus, WriteSchemata

log = logging.getLogger(__name__)

MAX_COMMAND_BYTES = mmap.PAGESIZE - 1  # kernfs hands a write at most one page; longer would be cut
LOCK_POLL_S = 0.02


class ResctrlWriteError(AgentError):
    """The kernel refused an operation. `status` is info/last_cmd_status as the kernel left it; `undo_errors`
    lists what could not be undone (empty when the tree is back as it was)."""

    def __init__(
        self, op: Operation, detail: str, status: str, errno_: int | None, undo_errors: Sequence[str]
    ):
        message = f"{op}: {detail}"
        if status and status != "ok":
            message += f" (last_cmd_status: {status})"
        if undo_errors:
            message += "; undoing the earlier writes failed too: " + "; ".join(undo_errors)
        super().__init__(message)
        self.op = op
        self.detail = detail
        self.status = status
        self.errno = errno_
        self.undo_errors = tuple(undo_errors)


class ResctrlBusy(EngineUnavailable):
    """Another process held the resctrl lock for longer than the timeout (retry later)."""


OpHook = Callable[[Operation], None]


@dataclass
class _Shadow:
    """What the tree looks like after each operation, for checks and for computing undo operations."""

    owned: Callable[[str], bool]
    schemata: dict[str, dict[str, dict[int, str]]]  # group ("" = root) -> resource -> domain -> value
    cpus: dict[str, frozenset[int]]
    created: set[str] = field(default_factory=set)  # made in this batch: initial values unknown, not needed

    @classmethod
    def of(cls, state: ResctrlState | None, owned: Callable[[str], bool]) -> _Shadow:
        groups = [] if state is None else [state.root, *state.groups]
        return cls(
            owned,
            {g.name: {res: dict(v) for res, v in g.schemata.items()} for g in groups},
            {g.name: g.cpus for g in groups},
        )

    def copy(self) -> _Shadow:
        return _Shadow(
            self.owned,
            {g: {res: dict(v) for res, v in s.items()} for g, s in self.schemata.items()},
            dict(self.cpus),
            set(self.created),
        )

    def _check_owned(self, op: Operation) -> None:
        if isinstance(op, WriteSchemata) and op.group == "":
            return
        if not op.group or not self.owned(op.group):
            who = repr(op.group) if op.group else "(root)"
            raise ValueError(f"refusing to {op}: group {who} was not created by this agent")

    def step(self, op: Operation) -> list[Operation]:
        """Check `op` against the tree, record its effect, and return the operations that undo it."""
        self._check_owned(op)
        name = op.group
        if isinstance(op, Mkdir):
            if name in self.cpus:
                raise ValueError(f"refusing to {op}: the group exists")
            self.schemata[name], self.cpus[name] = {}, frozenset()
            self.created.add(name)
            return [Rmdir(name)]
        if name not in self.cpus:
            raise ValueError(f"refusing to {op}: there is no such group")
        if isinstance(op, Rmdir):
            undo: list[Operation] = [Mkdir(name), WriteSchemata(name, self.schemata.pop(name))]
            cpus = self.cpus.pop(name)
            if cpus:
                undo.append(WriteCpus(name, cpus))
            self.cpus[""] = self.cpus.get("", frozenset()) | cpus
            self.created.discard(name)
            return undo
        if isinstance(op, WriteSchemata):
            before: dict[str, dict[int, str]] = {}
            for res, values in op.schemata.items():
                have = self.schemata[name].setdefault(res, {})
                for d, value in values.items():
                    if d in have:
                        before.setdefault(res, {})[d] = have[d]
                    have[d] = value
            return [WriteSchemata(name, before)] if before and name not in self.created else []
        assert isinstance(op, WriteCpus)
        old = self.cpus[name]
        losers = {g: c for g, c in self.cpus.items() if g not in (name, "") and c & op.cpus}
        for g in losers:
            if not self.owned(g):
                raise ValueError(f"refusing to {op}: it would take CPUs from group {g!r}, which is not ours")
        undo = [WriteCpus(g, c) for g, c in sorted(losers.items())]
        if old or name not in self.created:
            undo.append(WriteCpus(name, old))
        for g, c in losers.items():
            self.cpus[g] = c - op.cpus
        self.cpus[""] = (self.cpus.get("", frozenset()) - op.cpus) | (old - op.cpus)
        self.cpus[name] = op.cpus
        return undo


class ResctrlApplier:
    """Operations on the resctrl mount at `mount` (e.g. <host root>/sys/fs/resctrl)."""

    def __init__(self, mount: Path, *, on_write: OpHook | None = None, lock_timeout: float = 10.0) -> None:
        self.mount = Path(mount)
        self.on_write = on_write
        self.lock_timeout = lock_timeout
        self.writes = 0  # kernel operations performed, undo included

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """flock(LOCK_EX) on the mount directory. ResctrlBusy if it is not free within `lock_timeout`."""
        fd = os.open(self.mount, os.O_RDONLY | os.O_DIRECTORY)
        try:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ResctrlBusy(
                            f"{self.mount} stayed locked (flock) by another process for "
                            f"{self.lock_timeout:g}s"
                        ) from None
                    time.sleep(LOCK_POLL_S)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def apply(
        self, ops: Sequence[Operation], current: ResctrlState | None, owned: Callable[[str], bool]
    ) -> int:
        """Execute `ops` on the tree `current` describes; all or nothing. Returns how many were executed.

        ValueError (before any write) if an operation would touch a group that is not `owned`, or does not
        fit the tree; ResctrlWriteError if the kernel refused one (the earlier ones are undone first)."""
        shadow = _Shadow.of(current, owned)
        dry = shadow.copy()
        for op in ops:
            dry.step(op)
            if isinstance(op, WriteSchemata | WriteCpus) and len(op.text.encode()) > MAX_COMMAND_BYTES:
                raise ValueError(f"refusing to {op}: longer than one page, the kernel would cut it")
        undo: list[list[Operation]] = []
        for op in ops:
            inverse = shadow.step(op)
            try:
                self._execute(op)
            except OSError as exc:
                status = self._last_cmd_status()
                undo_errors = self._undo(undo)
                detail = exc.strerror or str(exc)
                log.warning("resctrl refused %s: %s (%s); undone: %s", op, detail, status, not undo_errors)
                raise ResctrlWriteError(op, detail, status, exc.errno, undo_errors) from exc
            undo.append(inverse)
            if self.on_write is not None:
                self.on_write(op)
        return len(ops)

    def _undo(self, done: list[list[Operation]]) -> list[str]:
        errors = []
        for inverse in reversed(done):
            for op in inverse:
                try:
                    self._execute(op)
                except OSError as exc:
                    errors.append(f"{op}: {exc.strerror or exc} ({self._last_cmd_status()})")
        if errors:
            log.error("could not undo resctrl writes after a refusal: %s", "; ".join(errors))
        return errors

    def _path(self, group: str) -> Path:
        return self.mount / group if group else self.mount

    def _execute(self, op: Operation) -> None:
        self.writes += 1
        if isinstance(op, Mkdir):
            os.mkdir(self._path(op.group))
        elif isinstance(op, Rmdir):
            os.rmdir(self._path(op.group))
        elif isinstance(op, WriteSchemata):
            self._write(self._path(op.group) / "schemata", op.text)
        else:
            self._write(self._path(op.group) / "cpus_list", op.text)

    @staticmethod
    def _write(path: Path, text: str) -> None:
        data = text.encode()
        fd = os.open(path, os.O_WRONLY)
        try:
            written = os.write(fd, data)
        finally:
            os.close(fd)
        if written != len(data):
            raise OSError(errno.EIO, f"short write: {written} of {len(data)} bytes", str(path))

    def _last_cmd_status(self) -> str:
        try:
            return (self.mount / "info" / "last_cmd_status").read_text().strip()
        except OSError as exc:
            return f"(info/last_cmd_status unreadable: {exc.strerror or exc})"
