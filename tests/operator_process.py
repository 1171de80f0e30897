"""The real operator as a process (`rmd-operator run --standalone`) for the e2e tests: one namespace, no
agents (plaintext: nothing is dialled), short retries, dying with the test process. Import as
`operator_process` (tests/conftest.py puts this directory on sys.path).
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TypeVar

from rmd_sim.control_plane import ControlPlane

_PR_SET_PDEATHSIG = 1
_T = TypeVar("_T")


def _die_with_parent() -> None:
    # Runs between fork and exec: the operator dies with the test process, even on SIGKILL.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Operator:
    """`rmd-operator run --standalone` for one namespace; no agents (plaintext: nothing is dialled)."""

    def __init__(
        self,
        cp: ControlPlane,
        namespace: str,
        log_path: Path,
        extra: Sequence[str] = (),
        kubeconfig: Path | None = None,  # another identity than the control plane's admin
    ) -> None:
        self.port = _free_port()
        script = Path(sys.executable).with_name("rmd-operator")
        command = [str(script)] if script.exists() else [sys.executable, "-m", "rmd_operator.cli"]
        argv = [
            *command,
            "run",
            "--standalone",
            "--insecure-agents",
            "--namespaces",
            namespace,
            "--node-state-namespace",
            namespace,
            "--liveness-listen",
            f"127.0.0.1:{self.port}",
            "--retry-initial-seconds",
            "0.5",
            "--retry-max-seconds",
            "2",
            "--watch-timeout-seconds",
            "10",
            "--log-level",
            "debug",
            *extra,
        ]
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("ab")
        env = cp.env()
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        self.popen = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509  # only a prctl runs in the child
        )

    def wait_for(
        self,
        predicate: Callable[[], _T | None],
        what: Callable[[], str] | str,
        timeout: float,
        interval: float = 0.2,
    ) -> _T:
        """Poll `predicate` until it returns something true; on timeout fail with the operator's log."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                said = what() if callable(what) else what
                raise AssertionError(
                    f"timed out waiting for {said}\n--- operator log ---\n{self.log()[-6000:]}"
                )
            time.sleep(interval)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_alive(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.popen.poll() is not None:
                raise AssertionError(f"operator exited with {self.popen.returncode}:\n{self.log()[-5000:]}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                try:
                    conn.request("GET", "/healthz")
                    if conn.getresponse().status == 200:
                        return
                finally:
                    conn.close()
            if time.monotonic() > deadline:
                raise AssertionError(f"operator not alive after {timeout} s:\n{self.log()[-5000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self._log.close()
