"""Node-telemetry peers nobody here wrote, started on loopback (shared by the component test
tests/component/test_telemetry_peers.py and the e2e test tests/e2e/test_node_telemetry.py):

* sushy-tools' Redfish emulator (`sushy-emulator --fake`) over TLS with HTTP basic auth, serving a chassis
  Thermal resource with a `PhysicalContext: Intake` sensor (25 °C);
* MLServer (from its own virtualenv, ./dev setup_peers) serving a scikit-learn linear regression trained here,
  over the V2 inference protocol;
* a differential-pressure endpoint (no public implementation exists: a small HTTP server here).

Locally a missing peer skips the test; with CI set it fails it. Import as `telemetry_peers` (tests/conftest.py
puts this directory on sys.path).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import requests

from rmd_sim.netutil import free_port
from rmd_sim.pki import CertificateAuthority

REPO = Path(__file__).resolve().parents[1]
USER, PASSWORD = "admin", "s3cret"
EMULATOR_INLET = 25.0  # the emulator's Intake sensor
# The model trained: watts = 100 + 2 cpu + 1.5 inlet + 0.5 pressure (exact for a linear regression).
TRAIN = "100 + 2 * c + 1.5 * t + 0.5 * p"


def expected_watts(cpu: float, inlet: float, pressure: float) -> float:
    return 100 + 2 * cpu + 1.5 * inlet + 0.5 * pressure


def require(reason: str | None) -> None:
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"test peer required in CI: {reason}")
        pytest.skip(reason)


def require_sushy_tools() -> None:
    require(None if find_spec("sushy_tools") else "sushy-tools is not installed (pip install -e '.[dev]')")


def wait_http(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 60.0, **kw: Any) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited with {proc.returncode}")
        try:
            if requests.get(url, timeout=1, **kw).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer in {timeout}s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def make_pki(directory: Path) -> dict[str, Any]:
    """A BMC CA with a server certificate for 127.0.0.1/localhost, and an unrelated CA."""
    ca, other = CertificateAuthority("bmc-ca"), CertificateAuthority("some-other-ca")
    server = ca.issue_server("bmc", dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    (directory / "tls.crt").write_bytes(server.cert_pem + ca.cert_pem)
    (directory / "tls.key").write_bytes(server.key_pem)
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    return {
        "ca": ca.cert_pem,
        "other": other.cert_pem,
        "cert": directory / "tls.crt",
        "key": directory / "tls.key",
        "ca_file": directory / "ca.crt",
    }


@contextlib.contextmanager
def redfish_emulator(work: Path, pki: dict[str, Any]) -> Iterator[str]:
    """sushy-emulator over TLS (pki's certificate) with basic auth USER/PASSWORD; yields its URL."""
    require_sushy_tools()
    htpasswd = work / "htpasswd"
    htpasswd.write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    config = work / "emulator.conf"
    config.write_text(
        f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}\nSUSHY_EMULATOR_STATE_DIR = {str(work / 'state')!r}\n"
    )
    port = free_port()
    cmd = [sys.executable, "-m", "sushy_tools.emulator.main", "--config", str(config), "--fake"]
    cmd += ["-i", "127.0.0.1", "-p", str(port)]
    cmd += ["--ssl-certificate", str(pki["cert"]), "--ssl-key", str(pki["key"])]
    with (work / "emulator.log").open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"https://127.0.0.1:{port}/redfish/v1/", proc, verify=str(pki["ca_file"]))
        yield f"https://127.0.0.1:{port}"
    finally:
        stop(proc)


class PressureApi:
    """The differential-pressure endpoint: GET /api/sensor/by_nodename/<node>. Stoppable and restartable
    (on the same port)."""

    def __init__(self, node: str, pressure: float) -> None:
        self.node, self.pressure = node, pressure
        self.port = free_port()
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != f"/api/sensor/by_nodename/{api.node}":
                    self.send_error(404)
                    return
                sensor = {"pressure": api.pressure, "sensorid": "1", "temperature": 26.0}
                body = json.dumps({"code": 200, "sensor": [sensor]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def mlserver(work: Path) -> Iterator[str]:
    """MLServer serving model `power` version v0.1.0 (the TRAIN regression); yields its URL."""
    venv = Path(os.environ.get("RMD_MLSERVER_VENV", REPO / ".venv-mlserver"))
    require(
        None if (venv / "bin" / "mlserver").exists() else f"MLServer is not installed in {venv} (./dev setup)"
    )
    model = work / "models" / "power"
    model.mkdir(parents=True)
    train = (
        "import sys, joblib\nfrom sklearn.linear_model import LinearRegression\n"
        "X = [[c, t, p] for c in (10, 50, 90) for t in (18, 30) for p in (2, 12)]\n"
        f"y = [{TRAIN} for c, t, p in X]\n"
        "joblib.dump(LinearRegression().fit(X, y), sys.argv[1])\n"
    )
    subprocess.run(
        [str(venv / "bin" / "python"), "-c", train, str(model / "model.joblib")], check=True, timeout=120
    )
    settings = {
        "name": "power",
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": "./model.joblib", "version": "v0.1.0"},
    }
    (model / "model-settings.json").write_text(json.dumps(settings))
    port = free_port()
    env = {
        **os.environ,
        "MLSERVER_HOST": "127.0.0.1",
        "MLSERVER_HTTP_PORT": str(port),
        "MLSERVER_GRPC_PORT": str(free_port()),
        "MLSERVER_METRICS_PORT": str(free_port()),
        "MLSERVER_PARALLEL_WORKERS": "0",  # in-process inference: its worker pool breaks with recent uvloop
    }
    with (work / "mlserver.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(venv / "bin" / "mlserver"), "start", str(work / "models")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/models/power/ready", proc, timeout=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
