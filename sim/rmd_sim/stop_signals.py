"""Stopping a long-running simulator command (the demo) on SIGTERM, SIGINT or SIGHUP, FUSE mounts included.

The command's process serves FUSE mounts from threads, and libfuse takes SIGTERM, SIGHUP and SIGINT for
its own loop when they are at their default disposition: a SIGTERM then ends one mount's loop (whichever
mounted last) and nothing else, the process runs on. A process started with SIGINT ignored (a shell's
background job, `cmd &`) keeps ignoring it: Python installs its KeyboardInterrupt handler, and asyncio.run
its Ctrl-C handling, only over the default. So the command sets its own handlers before the first mount,
and libfuse leaves them alone.

    with SignalStop(workdir, keep=False) as stops:    # handlers set; a signal now is remembered
        asyncio.run(main(stops))                      # main calls stops.attach() where it may be cancelled

The first signal cancels the attached task, whose cleanup stops the processes and unmounts; a watchdog
forces the exit if that cleanup takes longer than `FORCE_AFTER`. A second signal forces it at once. Forcing
kills every child process's group with SIGKILL, unmounts the FUSE mounts under the work directory lazily,
removes the directory (unless kept) and exits. A signal before `attach()` (the demo's real-node part, which
cleans up after itself in a thread) takes effect at attach(), with no forcing. Either way the exit status is
128 + the first signal's number, as a shell reports a command ended by that signal (130 for Ctrl-C, 143 for
SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, Self

import psutil

from rmd_sim.mounts import mount_points
from rmd_sim.resctrl_fuse import ResctrlMountError, unmount

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORCE_AFTER = 45.0  # seconds an orderly stop may take (the operator's and agents' own graces are 15-20 s)


def say(message: str) -> None:
    """Write to stdout from a signal handler: print() there can hit the buffer the interrupted code holds."""
    with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) has nowhere to write
        os.write(1, f"\n{message}\n".encode())


def mounts_under(directory: Path) -> list[str]:
    prefix = os.path.realpath(directory) + "/"
    return [point for point in mount_points() if point.startswith(prefix)]


def force_stop(workdir: Path, *, keep: bool, status: int) -> NoReturn:
    """Kill the children, lazily unmount what is mounted under `workdir`, remove it unless kept, exit."""
    children = psutil.Process().children()
    for child in children:
        # The agents, the operator and the control plane components each lead a process group of their own.
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=5)
    for point in reversed(mounts_under(workdir)):
        with contextlib.suppress(ResctrlMountError, OSError):
            unmount(Path(point), lazy=True)  # detached at once, even while this process's threads serve it
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    say(f"forced stop; mounts under {workdir} detached")
    os._exit(status)


class SignalStop:
    """STOP_SIGNALS turned into an orderly stop of one asyncio task (see the module docstring)."""

    def __init__(self, workdir: Path, *, keep: bool = False) -> None:
        self.workdir = workdir
        self.keep = keep
        self.signum: int | None = None  # the first signal received
        self._phase = "before"  # then "attached" (a signal cancels the task), then "detached" (cleaning up)
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cancelled = False
        self._watchdog: threading.Timer | None = None
        self._previous: dict[int, Any] = {}

    def status(self, default: int) -> int:
        """The exit status: 128 + the first signal's number, or `default` when none came."""
        return default if self.signum is None else 128 + self.signum

    def __enter__(self) -> Self:
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def attach(self) -> bool:
        """From here on a signal cancels the calling task; False when one came already (do not start)."""
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._phase = "attached"
        return self.signum is None

    def detach(self) -> None:
        """The task is cleaning up: a first signal from here on must not interrupt that; a second forces."""
        self._phase = "detached"
        if self._cancelled and self._task is not None:
            self._cancelled = False
            self._task.uncancel()  # the cancel was taken: asyncio.timeout() in the cleanup works as usual

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._phase == "before":  # e.g. the real node part, which cleans up after itself in a thread
            self.signum = self.signum or signum
            say(f"{name}: stopping once the current step is done")
        elif self.signum is None:
            self.signum = signum
            say(f"{name}: stopping (another signal forces it)")
            if self._phase == "attached":
                self._cancel()
            else:
                self._start_watchdog()
        else:
            say(f"{name} again: forcing the stop")
            force_stop(self.workdir, keep=self.keep, status=self.status(1))

    def _cancel(self) -> None:
        assert self._task is not None and self._loop is not None
        self._cancelled = True
        self._task.cancel()  # as asyncio.Runner does for Ctrl-C; the wakeup below gets the loop to it
        with contextlib.suppress(RuntimeError):  # the loop closed already: nothing left to wake
            self._loop.call_soon_threadsafe(lambda: None)
        self._start_watchdog()

    def _start_watchdog(self) -> None:
        self._watchdog = threading.Timer(FORCE_AFTER, self._force_late)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _force_late(self) -> None:
        say(f"still stopping after {FORCE_AFTER:.0f} s: forcing it")
        force_stop(self.workdir, keep=self.keep, status=self.status(1))
