"""TelemetryManager with Fake sources (no network): values, replacement on update without leaks, removal,
stale values left out of the metrics, problems reported as conditions, the predictor's missing inputs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from rmd_operator.telemetry.manager import SourceSnapshot, TelemetryManager
from rmd_operator.telemetry.metrics import TelemetryCollector
from rmd_operator.telemetry.runner import Outcome
from rmd_operator.telemetry.spec import parse_node_config

FAKE = {
    "nodeName": "worker-node-1",
    "metricsCollector": {"inletTemp": {"type": "Fake"}, "deltaP": {"type": "Fake"}},
    "predictor": {"powerConsumption": {"type": "Fake"}},
}


LABEL = '{node="worker-node-1",nodeconfig="wao-system/worker-1"}'


async def no_secrets(namespace: str, name: str) -> Mapping[str, bytes] | None:
    return None


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return 1_700_000_000.0 + self.offset + asyncio.get_running_loop().time()


def telemetry_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("telemetry ")]


async def until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not predicate():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.02)


def by_kind(manager: TelemetryManager) -> dict[str, SourceSnapshot]:
    return {s.kind: s for s in manager.snapshot()}


async def test_fake_sources_give_wao_values_and_metrics() -> None:
    outcomes: list[Outcome] = []
    manager = TelemetryManager(no_secrets, report=outcomes.append, draw=lambda: 0.0)
    try:
        await manager.apply("wao-system/worker-1", parse_node_config("wao-system", "worker-1", FAKE))
        await until(
            lambda: all(s.value is not None for s in manager.snapshot()) and len(manager.snapshot()) == 3
        )
        values = {k: s.value for k, s in by_kind(manager).items()}
        assert values == {"inletTemp": 15.5, "deltaP": 7.5, "powerConsumption": 3.14}
        inlet = by_kind(manager)["inletTemp"]
        assert inlet.status()["value"] == "15.5"
        assert [c["type"] for c in inlet.status()["conditions"]] == ["Available", "Stale", "Error"]
        registry = CollectorRegistry()
        registry.register(TelemetryCollector(manager))
        text = generate_latest(registry).decode()
        assert f"rmd_node_inlet_temperature_celsius{LABEL} 15.5" in text
        assert f"rmd_node_differential_pressure_pascals{LABEL} 7.5" in text
        assert f"rmd_node_predicted_power_watts{LABEL} 3.14" in text
        assert 'rmd_node_telemetry_value_age_seconds{collector="inletTemp"' in text
        assert outcomes and all(o.key == "wao-system/worker-1" for o in outcomes)
    finally:
        await manager.close()
    assert telemetry_tasks() == []


async def test_update_replaces_only_changed_sources_and_leaks_nothing() -> None:
    manager = TelemetryManager(no_secrets, draw=lambda: 0.0)
    key = "wao-system/worker-1"
    try:
        await manager.apply(key, parse_node_config("wao-system", "worker-1", FAKE))
        inlet, delta = manager.runner(key, "inletTemp"), manager.runner(key, "deltaP")
        await manager.apply(key, parse_node_config("wao-system", "worker-1", FAKE))  # unchanged: nothing
        assert manager.runner(key, "inletTemp") is inlet and manager.runner(key, "deltaP") is delta
        changed = {
            **FAKE,
            "metricsCollector": {
                "inletTemp": {"type": "Fake"},
                "deltaP": {"type": "Fake", "fetchInterval": "5s"},
            },
        }
        for _ in range(5):  # repeated updates must not pile up runners (WAO leaked one per update)
            await manager.apply(key, parse_node_config("wao-system", "worker-1", changed))
            await manager.apply(key, parse_node_config("wao-system", "worker-1", FAKE))
        assert manager.runner(key, "inletTemp") is inlet
        assert delta is not None and not delta.running
        assert len(telemetry_tasks()) == 3
        await manager.remove(key)
        assert manager.snapshot() == [] and telemetry_tasks() == []
    finally:
        await manager.close()


async def test_a_stale_value_is_not_served_but_its_age_is() -> None:
    clock = Clock()
    manager = TelemetryManager(no_secrets, wall=clock, draw=lambda: 0.0)
    spec = {
        **FAKE,
        "metricsCollector": {
            "inletTemp": {"type": "Fake", "fetchInterval": "1h"},
            "deltaP": {"type": "Fake"},
        },
    }
    try:
        await manager.apply("ns/a", parse_node_config("ns", "a", spec))
        await until(lambda: by_kind(manager)["inletTemp"].value == 15.5)
        clock.offset = 4 * 3600 + 1  # past 4 intervals, the TTL
        inlet = by_kind(manager)["inletTemp"]
        assert inlet.value is None and inlet.stale and inlet.last_value == 15.5
        conditions = {c.type: (c.status, c.reason) for c in inlet.conditions}
        assert conditions["Available"] == (False, "Expired") and conditions["Stale"] == (True, "Expired")
        registry = CollectorRegistry()
        registry.register(TelemetryCollector(manager))
        text = generate_latest(registry).decode()
        assert "rmd_node_inlet_temperature_celsius{" not in text
        assert (
            'rmd_node_telemetry_value_age_seconds{collector="inletTemp",node="worker-node-1",'
            'nodeconfig="ns/a"} 14401' in text
        )
    finally:
        await manager.close()


async def test_problems_and_missing_inputs_are_conditions() -> None:
    spec = {
        "nodeName": "w",
        "metricsCollector": {"inletTemp": {"type": "Redfish"}, "deltaP": {"type": "Fake"}},
        "predictor": {
            "powerConsumption": {"type": "V2InferenceProtocol", "endpoint": "http://127.0.0.1:9/v2/models/m"}
        },
    }
    manager = TelemetryManager(no_secrets, draw=lambda: 0.0)
    try:
        await manager.apply("ns/b", parse_node_config("ns", "b", spec))
        await until(lambda: all(s.errors_total or s.value is not None for s in manager.snapshot()))
        snaps = by_kind(manager)
        inlet_error = {c.type: c for c in snaps["inletTemp"].conditions}["Error"]
        assert (inlet_error.status, inlet_error.reason) == (True, "InvalidConfig")
        assert "metricsCollector.inletTemp.endpoint is required" in inlet_error.message
        power_error = {c.type: c for c in snaps["powerConsumption"].conditions}["Error"]
        assert power_error.reason == "InputsUnavailable"
        assert "CPU usage, inlet temperature" in power_error.message
    finally:
        await manager.close()


@pytest.mark.parametrize("missing", ["secret", "key"])
async def test_missing_credentials_are_invalid_config(missing: str) -> None:
    async def secrets(namespace: str, name: str) -> Mapping[str, bytes] | None:
        return None if missing == "secret" else {"username": b"u"}

    spec = {
        "nodeName": "w",
        "metricsCollector": {
            "inletTemp": {"type": "Fake"},
            "deltaP": {
                "type": "DifferentialPressureAPI",
                "endpoint": "http://127.0.0.1:9",
                "basicAuthSecret": {"name": "dp"},
            },
        },
    }
    manager = TelemetryManager(secrets, draw=lambda: 0.0)
    try:
        await manager.apply("ns/c", parse_node_config("ns", "c", spec))
        await until(lambda: bool(by_kind(manager)["deltaP"].errors_total))
        error = {c.type: c for c in by_kind(manager)["deltaP"].conditions}["Error"]
        assert error.reason == "InvalidConfig"
        expected = "Secret ns/dp not found" if missing == "secret" else "Secret ns/dp has no key password"
        assert expected in error.message
    finally:
        await manager.close()
