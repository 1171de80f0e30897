"""The operator's NodeConfig collectors glue (node_telemetry.py, node_telemetry_status.py, metrics_http.py)
without an API server: status patches only on change, Events for transitions, runners stopped on deletion,
the CPU usage figure, and the /metrics endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from rmd_operator.errors import ConfigError
from rmd_operator.metrics_http import MetricsServer
from rmd_operator.node_telemetry import NodeTelemetry, TelemetryKubeApi, cpu_percent
from rmd_operator.node_telemetry_status import sources_patch
from rmd_operator.settings import load_settings
from rmd_operator.status import EventText
from rmd_operator.telemetry.errors import CollectError
from rmd_operator.telemetry.manager import SourceSnapshot
from rmd_operator.telemetry.metrics import TelemetryCollector

NS = "wao-system"
FAKE: dict[str, Any] = {
    "nodeName": "worker-1",
    "metricsCollector": {
        "inletTemp": {"type": "Fake", "fetchInterval": "1s"},
        "deltaP": {"type": "Fake", "fetchInterval": "1s"},
    },
    "predictor": {"powerConsumption": {"type": "Fake", "fetchInterval": "1s"}},
}


def node_config(name: str, spec: Mapping[str, Any], **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "wao.bitmedia.co.jp/v1beta1",
        "kind": "NodeConfig",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 3},
        "spec": spec,
    }
    if status:
        body["status"] = status
    return body


class FakeApi:
    def __init__(self, secrets: Mapping[str, Mapping[str, bytes]] | None = None) -> None:
        self.secrets = dict(secrets or {})
        self.patches: list[tuple[str, str, Mapping[str, Any]]] = []
        self.closed = False

    async def read_secret(self, namespace: str, name: str) -> Mapping[str, bytes] | None:
        assert namespace == NS  # only the NodeConfig's own namespace
        return self.secrets.get(name)

    async def cpu_usage(self, node: str) -> float | None:
        return 40.0

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        self.patches.append((namespace, name, status))
        return True

    def close(self) -> None:
        self.closed = True


async def until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not predicate():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.02)


def merged(api: FakeApi, name: str) -> dict[str, Any]:
    """status.sources as the API server would hold it after the merge patches."""
    sources: dict[str, Any] = {}
    for _, patched, status in api.patches:
        if patched == name:
            for kind, entry in status["sources"].items():
                if entry is None:
                    sources.pop(kind, None)
                else:  # a merge patch: null removes a key, other keys are kept
                    merged_entry = {**sources.get(kind, {}), **entry}
                    sources[kind] = {k: v for k, v in merged_entry.items() if v is not None}
    return sources


async def test_fake_values_reach_the_status_with_the_generation() -> None:
    api = FakeApi()
    events: list[tuple[Mapping[str, Any], EventText]] = []
    telemetry = NodeTelemetry(api, lambda obj, event: events.append((obj, event)))
    try:
        await telemetry.changed(None, node_config("w1", FAKE))
        await until(
            lambda: len(merged(api, "w1")) == 3 and all("value" in e for e in merged(api, "w1").values())
        )
        sources = merged(api, "w1")
        assert {k: v["value"] for k, v in sources.items()} == {
            "inletTemp": "15.5",
            "deltaP": "7.5",
            "powerConsumption": "3.14",
        }
        assert all(p[2]["observedGeneration"] == 3 for p in api.patches)
        available = next(c for c in sources["inletTemp"]["conditions"] if c["type"] == "Available")
        assert (available["status"], available["reason"]) == ("True", "Fetched")
        assert events == []  # a first value is no recovery
    finally:
        await telemetry.close()


async def test_steady_values_are_not_written_after_every_fetch() -> None:
    api = FakeApi()
    telemetry = NodeTelemetry(api, lambda obj, event: None)

    def inlet_writes() -> int:
        return sum(1 for _, _, status in api.patches if "value" in (status["sources"].get("inletTemp") or {}))

    try:
        await telemetry.changed(None, node_config("w1", FAKE))
        await until(lambda: inlet_writes() > 0)
        runner = telemetry.manager.runner(f"{NS}/w1", "inletTemp")
        assert runner is not None
        writes, fetches = inlet_writes(), runner.fetches
        await asyncio.sleep(3.3)  # 3 fetches of 1 s; the unchanged value's time is written every TTL/2 = 2 s
        assert runner.fetches - fetches >= 3
        assert 1 <= inlet_writes() - writes < runner.fetches - fetches
    finally:
        await telemetry.close()


async def test_an_error_is_a_warning_event_and_a_condition_in_the_status() -> None:
    api = FakeApi()
    events: list[tuple[Mapping[str, Any], EventText]] = []
    spec = {
        **FAKE,
        "metricsCollector": {
            "inletTemp": {
                "type": "Redfish",
                "endpoint": "https://127.0.0.1:1",
                "basicAuthSecret": {"name": "missing"},
                "fetchInterval": "1s",
            },
            "deltaP": {"type": "Fake", "fetchInterval": "1s"},
        },
    }
    telemetry = NodeTelemetry(api, lambda obj, event: events.append((obj, event)))
    try:
        await telemetry.changed(None, node_config("w2", spec))
        await until(lambda: any(e.reason == "InvalidConfig" for _, e in events))
        obj, event = next((o, e) for o, e in events if e.reason == "InvalidConfig")
        assert event.type == "Warning"
        assert event.message.startswith("inletTemp: ") and f"Secret {NS}/missing not found" in event.message
        assert obj["kind"] == "NodeConfig" and obj["metadata"] == {
            "name": "w2",
            "namespace": NS,
            "uid": "uid-w2",
        }
        await until(lambda: "inletTemp" in merged(api, "w2"))
        error = next(c for c in merged(api, "w2")["inletTemp"]["conditions"] if c["type"] == "Error")
        assert (error["status"], error["reason"]) == ("True", "InvalidConfig")
    finally:
        await telemetry.close()


async def test_a_removed_source_leaves_the_status_and_deletion_stops_the_runners() -> None:
    api = FakeApi()
    stored = {"powerConsumption": {"value": "3.14", "conditions": []}, "inletTemp": {"conditions": []}}
    telemetry = NodeTelemetry(api, lambda obj, event: None)
    try:
        spec = {k: v for k, v in FAKE.items() if k != "predictor"}
        await telemetry.changed(None, node_config("w3", spec, sources=stored))
        assert api.patches and api.patches[0][2]["sources"]["powerConsumption"] is None
        assert telemetry.manager.keys() == [f"{NS}/w3"]
        await telemetry.changed("DELETED", node_config("w3", spec))
        assert telemetry.manager.keys() == []
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("telemetry ")]
    finally:
        await telemetry.close()


def snap(value: float | None, when: float, ttl: float = 4.0) -> SourceSnapshot:
    return SourceSnapshot(
        key=f"{NS}/w",
        namespace=NS,
        name="w",
        node="n",
        kind="deltaP",
        type="Fake",
        value=value,
        last_value=value,
        value_time=when,
        age=0.0,
        stale=False,
        ttl=ttl,
        errors_total={},
        conditions=(),
    )


def test_sources_patch_writes_changes_and_refreshes_the_time_at_half_the_ttl() -> None:
    first = sources_patch([snap(7.5, 1000.0)], {}, 1000.0, {})
    assert set(first) == {"deltaP"} and first["deltaP"] is not None and first["deltaP"]["value"] == "7.5"
    written = {"deltaP": first["deltaP"]}
    assert sources_patch([snap(7.5, 1000.0)], written, 1000.5, {"deltaP": 1000.0}) == {}
    assert sources_patch([snap(7.5, 1001.0)], written, 1001.0, {"deltaP": 1000.0}) == {}  # time only
    refreshed = sources_patch([snap(7.5, 1002.0)], written, 1002.0, {"deltaP": 1000.0})  # TTL/2 = 2 s
    assert refreshed["deltaP"] is not None and refreshed["deltaP"]["time"] == "1970-01-01T00:16:42Z"
    assert set(sources_patch([snap(8.0, 1001.0)], written, 1001.0, {"deltaP": 1000.0})) == {"deltaP"}
    assert sources_patch([], written, 1001.0, {}) == {"deltaP": None}


def test_cpu_percent_of_capacity() -> None:
    assert cpu_percent("500m", "2") == 25.0
    assert cpu_percent("1500000000n", "4") == 37.5
    assert cpu_percent(None, "4") is None
    assert cpu_percent("1", "0") is None
    assert cpu_percent("lots", "4") is None


async def test_metrics_endpoint_serves_the_telemetry() -> None:
    api = FakeApi()
    telemetry = NodeTelemetry(api, lambda obj, event: None)
    registry = CollectorRegistry()
    registry.register(TelemetryCollector(telemetry.manager))
    server = MetricsServer(registry)
    port = await server.start("127.0.0.1:0")
    try:
        await telemetry.changed(None, node_config("w4", FAKE))
        label = f'{{node="worker-1",nodeconfig="{NS}/w4"}}'
        async with aiohttp.ClientSession() as session:
            text = ""
            for _ in range(100):
                async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                    assert response.status == 200
                    assert response.headers["Content-Type"].startswith("text/plain")
                    text = await response.text()
                if f"rmd_node_inlet_temperature_celsius{label} 15.5" in text:
                    break
                await asyncio.sleep(0.05)
            assert f"rmd_node_inlet_temperature_celsius{label} 15.5" in text
    finally:
        await server.close()
        await telemetry.close()


@pytest.mark.parametrize("value", ["8081", "localhost", "0.0.0.0:port", ":8081"])
def test_metrics_listen_must_be_host_and_port(value: str) -> None:
    with pytest.raises(ConfigError, match="metrics_listen"):
        load_settings({"metrics_listen": value}, {})


def test_metrics_listen_is_off_by_default_and_telemetry_on() -> None:
    settings = load_settings({}, {})
    assert settings.metrics_listen == "" and settings.node_telemetry is True
    assert load_settings({"metrics_listen": "0.0.0.0:8081"}, {}).metrics_listen == "0.0.0.0:8081"


def test_a_source_without_a_value_clears_the_value_the_status_held() -> None:
    """A merge patch keeps every key it does not name: a source replaced (new endpoint) or an operator that
    restarted must not leave the old value in the status next to conditions saying there is none."""
    held = {"deltaP": {"value": "7.5", "time": "2026-01-02T03:04:05Z", "conditions": []}}
    patch = sources_patch([snap(None, 0.0)], held, 1000.0, {})
    entry = patch["deltaP"]
    assert entry is not None and entry["value"] is None and entry["time"] is None
    # and once cleared, nothing more to write
    assert sources_patch([snap(None, 0.0)], {"deltaP": entry}, 1001.0, {"deltaP": 1000.0}) == {}


class FakeCore:
    """CoreV1Api's read_namespaced_secret: an answer per (namespace, name), or the status to fail with."""

    def __init__(self, answers: Mapping[tuple[str, str], Any]) -> None:
        self.answers = answers

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> Any:
        answer = self.answers[(namespace, name)]
        if isinstance(answer, int):
            raise ApiException(status=answer, reason="Forbidden" if answer == 403 else "Not Found")
        return client.V1Secret(data=answer)


def kube_api(answers: Mapping[tuple[str, str], Any]) -> TelemetryKubeApi:
    api = TelemetryKubeApi(client.ApiClient(client.Configuration()))
    api._core = FakeCore(answers)
    return api


async def test_secrets_are_decoded_missing_is_none_and_forbidden_says_which_namespace_to_grant() -> None:
    api = kube_api({(NS, "auth"): {"username": "YWRtaW4="}, (NS, "gone"): 404, ("other", "auth"): 403})
    try:
        assert await api.read_secret(NS, "auth") == {"username": b"admin"}
        assert await api.read_secret(NS, "gone") is None
        with pytest.raises(CollectError) as raised:
            await api.read_secret("other", "auth")
        assert raised.value.reason == "InvalidConfig"
        assert "may not read Secret other/auth" in raised.value.message
        assert "nodeTelemetry.secretNamespaces" in raised.value.message
    finally:
        api.close()


class FakeMetricsApi:
    def __init__(self, usage: str | None) -> None:
        self.usage = usage

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str, **_: Any) -> Any:
        assert (group, version, plural) == ("metrics.k8s.io", "v1beta1", "nodes")
        if self.usage is None:
            raise ApiException(status=404, reason="Not Found")  # no metrics-server
        return {"metadata": {"name": name}, "usage": {"cpu": self.usage, "memory": "1Gi"}}


class FakeNodes:
    def read_node(self, name: str, **_: Any) -> Any:
        return client.V1Node(status=client.V1NodeStatus(capacity={"cpu": "4", "memory": "8Gi"}))


async def test_cpu_usage_from_node_metrics_else_none() -> None:
    api = TelemetryKubeApi(client.ApiClient(client.Configuration()))
    api._core = FakeNodes()
    try:
        api._objects = FakeMetricsApi("1600m")
        assert await api.cpu_usage("worker-1") == 40.0
        api._objects = FakeMetricsApi(None)
        assert await api.cpu_usage("worker-1") is None  # the predictor then reports InputsUnavailable
    finally:
        api.close()
