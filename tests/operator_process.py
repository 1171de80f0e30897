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


def operator_command() -> list[str]:
    """How to start `rmd-operator`: its console script beside this interpreter, else the module."""
    script = Path(sys.executable).with_name("rmd-operator")
    return [str(script)] if script.exists() else [sys.executable, "-m", "rmd_operator.cli"]


class OperatorProcess:
    """An `rmd-operator` command line as a process in its own session, its output in `log_path`, alive when
    its liveness endpoint (on `liveness_port`) answers 200."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log_path: Path, liveness_port: int) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.port = liveness_port
        self._log: IO[bytes] = log_path.open("ab")
        self.popen = subprocess.Popen(
            self.argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509  # only a prctl runs in the child
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def liveness(self) -> tuple[int, bytes]:
        """The liveness endpoint's status and body."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def wait_alive(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.popen.poll() is not None:
                raise AssertionError(f"operator exited with {self.popen.returncode}:\n{self.log()[-5000:]}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if self.liveness()[0] == 200:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"operator not alive after {timeout} s:\n{self.log()[-5000:]}")
            time.sleep(0.2)

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

    def stop(self) -> int:
        """SIGTERM to its session, SIGKILL after 20 s; then anything left in its group; its exit status."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self._log.close()
        return self.popen.returncode


class Operator(OperatorProcess):
    """`rmd-operator run --standalone` for one namespace; no agents (plaintext: nothing is dialled)."""

    def __init__(
        self,
        cp: ControlPlane,
        namespace: str,
        log_path: Path,
        extra: Sequence[str] = (),
        kubeconfig: Path | None = None,  # another identity than the control plane's admin
    ) -> None:
        port = _free_port()
        argv = [
            *operator_command(),
            "run",
            "--standalone",
            "--insecure-agents",
            "--namespaces",
            namespace,
            "--node-state-namespace",
            namespace,
            "--liveness-listen",
            f"127.0.0.1:{port}",
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
        env = cp.env()
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        super().__init__(argv, env, log_path, port)
