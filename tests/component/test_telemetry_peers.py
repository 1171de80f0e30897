"""Node telemetry against real peers nobody here wrote, started on loopback by the tests:

* sushy-tools' Redfish emulator (`sushy-emulator --fake`) over TLS with HTTP basic auth, serving a chassis
  Thermal resource with a `PhysicalContext: Intake` sensor (25 °C);
* sushy-tools' static server (`sushy-static`) serving mockups the test writes: a DMTF ThermalSubsystem /
  ThermalMetrics BMC with a MachineLearningModel (the predictor's endpoint provider), and a Dell iDRAC one;
* MLServer (from its own virtualenv, ./dev setup_peers) serving a scikit-learn linear regression the test
  trains, over the V2 inference protocol;
* a differential-pressure endpoint (no public implementation exists: a small HTTP server here).

The peers are started by tests/telemetry_peers.py (shared with the e2e test). Locally a missing peer skips
these tests; with CI set it fails them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from rmd_operator.telemetry.manager import SourceSnapshot, TelemetryManager
from rmd_operator.telemetry.metrics import TelemetryCollector
from rmd_operator.telemetry.runner import Outcome
from rmd_operator.telemetry.spec import parse_node_config
from rmd_sim.netutil import free_port
from telemetry_peers import (
    EMULATOR_INLET,
    PASSWORD,
    USER,
    PressureApi,
    expected_watts,
    make_pki,
    require_sushy_tools,
    stop,
    wait_http,
)
from telemetry_peers import (
    mlserver as run_mlserver,
)
from telemetry_peers import (
    redfish_emulator as run_redfish_emulator,
)

NS = "wao-system"
NODE = "worker-node-1"
PRESSURE = 7.25
CPU = 40.0
INTERVAL = "1s"


# -- peers ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def redfish_emulator(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Any]) -> Iterator[str]:
    with run_redfish_emulator(tmp_path_factory.mktemp("sushy"), pki) as url:
        yield url


def write_mockup(root: Path, docs: Mapping[str, Any]) -> None:
    for path, doc in docs.items():
        target = root / path.removeprefix("/redfish/v1").strip("/") / "index.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({"@odata.id": path, **doc}))


@pytest.fixture(scope="module")
def static_redfish(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Mapping[str, Any]], str]]:
    """Starts sushy-static on a mockup the test describes; returns its URL."""
    require_sushy_tools()
    procs: list[subprocess.Popen[bytes]] = []

    def start(docs: Mapping[str, Any]) -> str:
        root = tmp_path_factory.mktemp("mockup")
        write_mockup(root, docs)
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "sushy_tools.static.main",
            "-m",
            str(root),
            "-i",
            "127.0.0.1",
            "-p",
            str(port),
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        wait_http(f"http://127.0.0.1:{port}/redfish/v1", proc)
        return f"http://127.0.0.1:{port}"

    try:
        yield start
    finally:
        for proc in procs:
            stop(proc)


@pytest.fixture
def pressure_api() -> Iterator[PressureApi]:
    api = PressureApi(NODE, PRESSURE)
    api.start()
    yield api
    api.stop()


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with run_mlserver(tmp_path_factory.mktemp("mlserver")) as url:
        yield url


# -- helpers ----------------------------------------------------------------------------------------------


def secrets_for(pki: dict[str, Any]) -> Callable[[str, str], Any]:
    store = {
        "bmc-auth": {"username": USER.encode(), "password": PASSWORD.encode()},
        "bad-auth": {"username": USER.encode(), "password": b"wrong"},
        "bmc-ca": {"ca.crt": pki["ca"]},
        "other-ca": {"ca.crt": pki["other"]},
    }

    async def read(namespace: str, name: str) -> Mapping[str, bytes] | None:
        assert namespace == NS  # only the NodeConfig's own namespace is ever read
        return store.get(name)

    return read


async def cpu_usage(node: str) -> float | None:
    return CPU if node == NODE else None


def redfish_term(
    url: str, secret: str | None = "bmc-auth", ca: str | None = "bmc-ca", **extra: Any
) -> dict[str, Any]:
    term: dict[str, Any] = {"type": "Redfish", "endpoint": url, "fetchInterval": INTERVAL, **extra}
    if secret:
        term["basicAuthSecret"] = {"name": secret}
    if ca:
        term["caBundleSecret"] = {"name": ca}
    return term


def nodeconfig(
    inlet: dict[str, Any], delta: dict[str, Any] | None = None, predictor: dict[str, Any] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": NODE,
        "metricsCollector": {
            "inletTemp": inlet,
            "deltaP": delta or {"type": "Fake", "fetchInterval": INTERVAL},
        },
    }
    if predictor:
        spec["predictor"] = predictor
    return spec


def snapshot(manager: TelemetryManager, kind: str) -> SourceSnapshot:
    return next(s for s in manager.snapshot() if s.kind == kind)


def condition(snap: SourceSnapshot, kind: str) -> tuple[bool, str, str]:
    found = next(c for c in snap.conditions if c.type == kind)
    return found.status, found.reason, found.message


def scrape(manager: TelemetryManager) -> str:
    registry = CollectorRegistry()
    registry.register(TelemetryCollector(manager))
    return generate_latest(registry).decode()


async def until(predicate: Callable[[], bool], within: float, what: str) -> float:
    """Seconds until `predicate` held; fails after `timeout`."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < within, f"{what}: not within {within}s"
        await asyncio.sleep(0.05)
    return time.monotonic() - start


# -- tests ------------------------------------------------------------------------------------------------


async def test_values_from_real_peers_reach_the_metrics_within_two_intervals(
    redfish_emulator: str, pressure_api: PressureApi, mlserver: str, pki: dict[str, Any]
) -> None:
    spec = nodeconfig(
        redfish_term(redfish_emulator),
        {"type": "DifferentialPressureAPI", "endpoint": pressure_api.url, "fetchInterval": INTERVAL},
        {
            "powerConsumption": {
                "type": "V2InferenceProtocol",
                "endpoint": f"{mlserver}/v2/models/power/versions/v0.1.0/infer",
                "fetchInterval": INTERVAL,
            }
        },
    )
    manager = TelemetryManager(secrets_for(pki), cpu_usage=cpu_usage)
    try:
        await manager.apply(f"{NS}/worker", parse_node_config(NS, "worker", spec))
        label = f'{{node="{NODE}",nodeconfig="{NS}/worker"}}'
        watts = expected_watts(CPU, EMULATOR_INLET, PRESSURE)
        await until(
            lambda: all(
                line in scrape(manager)
                for line in (
                    f"rmd_node_inlet_temperature_celsius{label} {EMULATOR_INLET}",
                    f"rmd_node_differential_pressure_pascals{label} {PRESSURE}",
                )
            ),
            within=2.0,
            what="inlet temperature and pressure in the metrics",
        )
        await until(
            lambda: abs((snapshot(manager, "powerConsumption").value or 0) - watts) < 0.01,
            within=2.0,
            what="predicted power",
        )
        assert (
            f"rmd_node_predicted_power_watts{label} {snapshot(manager, 'powerConsumption').value}"
            in scrape(manager)
        )
        status, reason, message = condition(snapshot(manager, "inletTemp"), "Available")
        assert (status, reason) == (True, "Fetched")
        assert (
            "DMTF Thermal of /redfish/v1/Chassis/" in message
        )  # the emulator's Intake sensor, found and kept
    finally:
        await manager.close()


async def test_an_endpoint_taken_down_is_an_error_then_stale_then_recovers(
    pressure_api: PressureApi, pki: dict[str, Any]
) -> None:
    outcomes: list[Outcome] = []
    spec = nodeconfig(
        {"type": "Fake", "fetchInterval": INTERVAL},
        {"type": "DifferentialPressureAPI", "endpoint": pressure_api.url, "fetchInterval": INTERVAL},
    )
    manager = TelemetryManager(secrets_for(pki), report=outcomes.append)
    try:
        await manager.apply(f"{NS}/down", parse_node_config(NS, "down", spec))
        await until(lambda: snapshot(manager, "deltaP").value == PRESSURE, 3.0, "first value")
        pressure_api.stop()
        await until(lambda: condition(snapshot(manager, "deltaP"), "Error")[0], 4.0, "Error condition")
        _, reason, message = condition(snapshot(manager, "deltaP"), "Error")
        assert reason == "Unreachable" and pressure_api.url in message
        assert snapshot(manager, "deltaP").errors_total["Unreachable"] >= 1
        events = [(o.transition.kind, o.transition.reason) for o in outcomes if o.transition]
        assert ("Warning", "Unreachable") in events
        # TTL = 4 intervals: then the value is stale, left out of the metrics, its age still there.
        await until(lambda: snapshot(manager, "deltaP").stale, 6.0, "stale value")
        text = scrape(manager)
        assert "rmd_node_differential_pressure_pascals{" not in text
        assert 'rmd_node_telemetry_value_age_seconds{collector="deltaP"' in text
        assert 'rmd_node_telemetry_fetch_errors_total{collector="deltaP",error="Unreachable"' in text
        assert condition(snapshot(manager, "deltaP"), "Stale")[:2] == (True, "Expired")
        pressure_api.start()  # same port: the endpoint is back
        await until(
            lambda: snapshot(manager, "deltaP").value == PRESSURE, 6.0, "recovery"
        )  # <= 4 intervals backoff
        assert condition(snapshot(manager, "deltaP"), "Error")[0] is False
        assert ("Normal", "Recovered") in [
            (o.transition.kind, o.transition.reason) for o in outcomes if o.transition
        ]
    finally:
        await manager.close()


async def test_wrong_credentials_are_unauthorized_with_the_secret_named(
    redfish_emulator: str, pki: dict[str, Any]
) -> None:
    manager = TelemetryManager(secrets_for(pki))
    try:
        await manager.apply(
            f"{NS}/bad", parse_node_config(NS, "bad", nodeconfig(redfish_term(redfish_emulator, "bad-auth")))
        )
        await until(lambda: condition(snapshot(manager, "inletTemp"), "Error")[0], 4.0, "Error condition")
        _, reason, message = condition(snapshot(manager, "inletTemp"), "Error")
        assert reason == "Unauthorized"
        assert f"HTTP 401 from {redfish_emulator}/redfish/v1/" in message
        assert f"the BMC refused the credentials of Secret {NS}/bad-auth" in message
    finally:
        await manager.close()


@pytest.mark.parametrize("ca", ["other-ca", None])
async def test_an_untrusted_certificate_is_a_tls_error(
    redfish_emulator: str, pki: dict[str, Any], ca: str | None
) -> None:
    manager = TelemetryManager(secrets_for(pki))
    try:
        await manager.apply(
            f"{NS}/tls", parse_node_config(NS, "tls", nodeconfig(redfish_term(redfish_emulator, ca=ca)))
        )
        await until(lambda: condition(snapshot(manager, "inletTemp"), "Error")[0], 4.0, "Error condition")
        _, reason, message = condition(snapshot(manager, "inletTemp"), "Error")
        assert reason == "TLSError"
        assert f"TLS with {redfish_emulator}/redfish/v1/ failed: certificate verify failed" in message
        assert "caBundleSecret" in message
    finally:
        await manager.close()


async def test_skipping_verification_only_when_asked(redfish_emulator: str, pki: dict[str, Any]) -> None:
    manager = TelemetryManager(secrets_for(pki))
    term = redfish_term(redfish_emulator, ca="other-ca", insecureSkipVerify=True)
    try:
        await manager.apply(f"{NS}/skip", parse_node_config(NS, "skip", nodeconfig(term)))
        await until(
            lambda: snapshot(manager, "inletTemp").value == EMULATOR_INLET, 4.0, "value without verification"
        )
    finally:
        await manager.close()


CHASSIS = {
    "/redfish/v1": {
        "Id": "RootService",
        "Chassis": {"@odata.id": "/redfish/v1/Chassis"},
        "Systems": {"@odata.id": "/redfish/v1/Systems"},
    },
    "/redfish/v1/Chassis": {"Members": [{"@odata.id": "/redfish/v1/Chassis/1U"}], "Members@odata.count": 1},
}


async def test_thermal_metrics_and_the_endpoint_provider(
    static_redfish: Callable[[Mapping[str, Any]], str],
    pressure_api: PressureApi,
    mlserver: str,
    pki: dict[str, Any],
) -> None:
    base = static_redfish(
        {
            **CHASSIS,
            "/redfish/v1/Chassis/1U": {
                "Id": "1U",
                "ThermalSubsystem": {"@odata.id": "/redfish/v1/Chassis/1U/ThermalSubsystem"},
            },
            "/redfish/v1/Chassis/1U/ThermalSubsystem": {
                "ThermalMetrics": {"@odata.id": "/redfish/v1/Chassis/1U/ThermalSubsystem/ThermalMetrics"}
            },
            "/redfish/v1/Chassis/1U/ThermalSubsystem/ThermalMetrics": {
                "TemperatureSummaryCelsius": {"Intake": {"Reading": 22.5}},
                "TemperatureReadingsCelsius": [
                    {"DeviceName": "Intake", "PhysicalContext": "Intake", "Reading": 22.5}
                ],
            },
            "/redfish/v1/Systems": {"Members": [{"@odata.id": "/redfish/v1/Systems/1"}]},
            "/redfish/v1/Systems/1": {"Id": "1"},
            "/redfish/v1/Systems/1/MachineLearningModel": {
                "PowerConsumptionModel": {
                    "Name": "power",
                    "Url": mlserver,
                    "Type": "V2InferenceProtocol",
                    "Version": "v0.1.0",
                }
            },
        }
    )
    spec = nodeconfig(
        redfish_term(base, secret=None, ca=None),
        {"type": "DifferentialPressureAPI", "endpoint": pressure_api.url, "fetchInterval": INTERVAL},
        {
            "powerConsumption": {"type": "", "endpoint": "", "fetchInterval": INTERVAL},
            "powerConsumptionEndpointProvider": {"type": "Redfish", "endpoint": base},
        },
    )
    manager = TelemetryManager(secrets_for(pki), cpu_usage=cpu_usage)
    try:
        await manager.apply(f"{NS}/modern", parse_node_config(NS, "modern", spec))
        watts = expected_watts(CPU, 22.5, PRESSURE)
        await until(
            lambda: abs((snapshot(manager, "powerConsumption").value or 0) - watts) < 0.01, 4.0, "prediction"
        )
        assert snapshot(manager, "inletTemp").value == 22.5
        assert (
            "DMTF ThermalMetrics of /redfish/v1/Chassis/1U"
            in condition(snapshot(manager, "inletTemp"), "Available")[2]
        )
        assert (
            f"model power at {mlserver}/v2/models/power/versions/v0.1.0/infer"
            in snapshot(manager, "powerConsumption").detail
        )
    finally:
        await manager.close()


async def test_vendor_path_when_no_standard_sensor(
    static_redfish: Callable[[Mapping[str, Any]], str], pki: dict[str, Any]
) -> None:
    base = static_redfish(
        {
            **CHASSIS,
            "/redfish/v1/Chassis/1U": {"Id": "1U"},  # links no thermal resource
            "/redfish/v1/Chassis/System.Embedded.1/Sensors/SystemBoardInletTemp": {
                "Name": "System Board Inlet Temp",
                "Reading": 21.0,
            },
        }
    )
    manager = TelemetryManager(secrets_for(pki))
    try:
        await manager.apply(
            f"{NS}/dell", parse_node_config(NS, "dell", nodeconfig(redfish_term(base, secret=None, ca=None)))
        )
        await until(lambda: snapshot(manager, "inletTemp").value == 21.0, 4.0, "value from the Dell path")
        assert "Dell iDRAC" in snapshot(manager, "inletTemp").detail
    finally:
        await manager.close()
