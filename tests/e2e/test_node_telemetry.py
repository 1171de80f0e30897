"""NodeConfig collectors end to end: a real API server, the real operator process (`rmd-operator run`, serving
/metrics on metrics_listen) and real peers on loopback (tests/telemetry_peers.py): sushy-tools' Redfish
emulator over TLS with basic auth (the Secrets created in the test's namespace), a differential-pressure
endpoint and MLServer serving a V2 model.

The predictor's CPU input comes from metrics.k8s.io NodeMetrics. No metrics-server runs here, so the test
serves that API as a CRD of the same group, version and plural (`nodes.metrics.k8s.io`, cluster-scoped): the
operator reads it over the same path, `/apis/metrics.k8s.io/v1beta1/nodes/<node>`.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube_clients import KubeClients
from operator_process import Operator
from rmd_api.names import NODE_CONFIG
from rmd_sim.control_plane import ControlPlane
from rmd_sim.netutil import free_port
from telemetry_peers import (
    EMULATOR_INLET,
    PASSWORD,
    USER,
    PressureApi,
    expected_watts,
    make_pki,
    mlserver,
    redfish_emulator,
)

pytestmark = pytest.mark.e2e

GROUP, VERSION = NODE_CONFIG.group, NODE_CONFIG.version
INTERVAL = 2.0  # seconds: the fetchInterval of every source here
PRESSURE = 7.25
CPU_USAGE, CPU_CAPACITY, CPU_PERCENT = "1600m", "4", 40.0
WAIT = 30.0
_T = TypeVar("_T")
Obj = dict[str, Any]

NODE_METRICS_CRD: Obj = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {
        "name": "nodes.metrics.k8s.io",
        # A *.k8s.io group needs this: it stands in for metrics-server's aggregated API in this test only.
        "annotations": {"api-approved.kubernetes.io": "unapproved, testing only"},
    },
    "spec": {
        "group": "metrics.k8s.io",
        "scope": "Cluster",
        "names": {"plural": "nodes", "singular": "nodemetrics", "kind": "NodeMetrics"},
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


# --- peers (module-wide: started once) ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def bmc(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Any]) -> Iterator[str]:
    with redfish_emulator(tmp_path_factory.mktemp("sushy"), pki) as url:
        yield url


@pytest.fixture(scope="module")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlserver(tmp_path_factory.mktemp("mlserver")) as url:
        yield url


@pytest.fixture(scope="module")
def node_metrics_api(control_plane: ControlPlane) -> Iterator[None]:
    with control_plane.api_client() as api:
        extensions = client.ApiextensionsV1Api(api)
        with contextlib.suppress(ApiException):
            extensions.create_custom_resource_definition(NODE_METRICS_CRD)
        objects = client.CustomObjectsApi(api)
        deadline = time.monotonic() + WAIT
        while True:  # served once established
            try:
                objects.list_cluster_custom_object("metrics.k8s.io", "v1beta1", "nodes")
                break
            except ApiException:
                assert time.monotonic() < deadline, "the NodeMetrics stand-in API is not served"
                time.sleep(0.2)
        try:
            yield
        finally:
            with contextlib.suppress(ApiException):
                extensions.delete_custom_resource_definition(NODE_METRICS_CRD["metadata"]["name"])


# --- the test's cluster ------------------------------------------------------------------------------------


@dataclass
class Env(KubeClients):
    api: Any
    namespace: str
    node: str
    operator: Operator
    metrics_port: int

    def create_node_config(self, name: str, spec: Obj) -> None:
        body = {"apiVersion": NODE_CONFIG.api_version, "kind": "NodeConfig", "metadata": {"name": name}}
        self.objects.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, NODE_CONFIG.plural, {**body, "spec": spec}
        )

    def sources(self, name: str) -> Obj:
        got = self.objects.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, NODE_CONFIG.plural, name
        )
        sources: Obj = (got.get("status") or {}).get("sources") or {}
        return sources

    def condition(self, name: str, source: str, kind: str) -> tuple[str, str, str] | None:
        for c in (self.sources(name).get(source) or {}).get("conditions") or ():
            if c["type"] == kind:
                return c["status"], c["reason"], c["message"]
        return None

    def events(self, name: str) -> list[tuple[str, str, str]]:
        events = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}")
        return [(e.type, e.reason, e.message or "") for e in events.items]

    def metrics(self) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=5)
        try:
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200
            return response.read().decode()
        finally:
            conn.close()

    def wait(
        self, predicate: Callable[[], _T | None], what: Callable[[], str] | str, timeout: float = WAIT
    ) -> _T:
        return self.operator.wait_for(predicate, what, timeout, 0.1)

    def wait_condition(self, name: str, source: str, kind: str, status: str, reason: str) -> str:
        def check() -> str | None:
            got = self.condition(name, source, kind)
            return got[2] or "(no message)" if got is not None and got[:2] == (status, reason) else None

        return self.wait(
            check,
            lambda: f"{name} {source} {kind}={status} ({reason}); now {self.condition(name, source, kind)}",
        )

    def wait_event(self, name: str, kind: str, reason: str, contains: str = "") -> tuple[str, str, str]:
        return self.wait(
            lambda: next(
                (e for e in self.events(name) if e[:2] == (kind, reason) and contains in e[2]), None
            ),
            lambda: f"Event {kind} {reason} ({contains!r}) on {name}; have {self.events(name)}",
        )


def _secret(name: str, data: dict[str, bytes]) -> Any:
    encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
    return client.V1Secret(metadata=client.V1ObjectMeta(name=name), data=encoded)


@pytest.fixture
def env(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, pki: dict[str, Any], node_metrics_api: None
) -> Iterator[Env]:
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        for name, data in {
            "bmc-auth": {"username": USER.encode(), "password": PASSWORD.encode()},
            "bad-auth": {"username": USER.encode(), "password": b"wrong"},
            "bmc-ca": {"ca.crt": pki["ca"]},
            "other-ca": {"ca.crt": pki["other"]},
        }.items():
            core.create_namespaced_secret(namespace, _secret(name, data))
        node = f"telemetry-{uuid.uuid4().hex[:6]}"
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
        core.patch_node_status(node, {"status": {"capacity": {"cpu": CPU_CAPACITY}}})
        objects = client.CustomObjectsApi(api)
        metrics = {"apiVersion": "metrics.k8s.io/v1beta1", "kind": "NodeMetrics", "metadata": {"name": node}}
        objects.create_cluster_custom_object(
            "metrics.k8s.io", "v1beta1", "nodes", {**metrics, "window": "10s", "usage": {"cpu": CPU_USAGE}}
        )
        port = free_port()
        operator = Operator(
            control_plane, namespace, tmp_path / "operator.log", ["--metrics-listen", f"127.0.0.1:{port}"]
        )
        try:
            operator.wait_alive()
            yield Env(api, namespace, node, operator, port)
        finally:
            operator.stop()
            with contextlib.suppress(ApiException):
                core.delete_node(node)
            with contextlib.suppress(ApiException):
                objects.delete_cluster_custom_object("metrics.k8s.io", "v1beta1", "nodes", node)


def term(kind: str, endpoint: str = "", **extra: Any) -> Obj:
    return {"type": kind, "endpoint": endpoint, "fetchInterval": f"{INTERVAL:g}s", **extra}


def label(env: Env, name: str) -> str:
    return f'{{node="{env.node}",nodeconfig="{env.namespace}/{name}"}}'


def test_values_reach_the_metrics_and_the_status(env: Env, bmc: str, model_server: str) -> None:
    pressure = PressureApi(env.node, PRESSURE)
    pressure.start()
    try:
        spec = {
            "nodeName": env.node,
            "metricsCollector": {
                "inletTemp": term(
                    "Redfish", bmc, basicAuthSecret={"name": "bmc-auth"}, caBundleSecret={"name": "bmc-ca"}
                ),
                "deltaP": term("DifferentialPressureAPI", pressure.url),
            },
            "predictor": {
                "powerConsumption": term(
                    "V2InferenceProtocol", f"{model_server}/v2/models/power/versions/v0.1.0/infer"
                )
            },
        }
        created = time.monotonic()
        env.create_node_config("full", spec)
        lines = (
            f"rmd_node_inlet_temperature_celsius{label(env, 'full')} {EMULATOR_INLET}",
            f"rmd_node_differential_pressure_pascals{label(env, 'full')} {PRESSURE}",
        )
        env.wait(lambda: all(line in env.metrics() for line in lines), f"{lines} in the operator's metrics")
        took = time.monotonic() - created
        assert took <= 2 * INTERVAL, f"values reached the metrics after {took:.1f}s"
        watts = expected_watts(CPU_PERCENT, EMULATOR_INLET, PRESSURE)

        def predicted() -> float | None:
            for line in env.metrics().splitlines():
                if line.startswith(f"rmd_node_predicted_power_watts{label(env, 'full')} "):
                    return float(line.split()[-1])
            return None

        value = env.wait(
            predicted, lambda: f"a prediction; now {env.sources('full').get('powerConsumption')}"
        )
        assert abs(value - watts) < 0.01

        def all_values() -> Obj | None:
            got = env.sources("full")
            return (
                got
                if all("value" in got.get(k, {}) for k in ("inletTemp", "deltaP", "powerConsumption"))
                else None
            )

        sources = env.wait(all_values, lambda: f"values in the status; have {env.sources('full')}")
        assert float(sources["inletTemp"]["value"]) == EMULATOR_INLET
        assert float(sources["deltaP"]["value"]) == PRESSURE
        assert abs(float(sources["powerConsumption"]["value"]) - watts) < 0.01
        _, reason, message = env.condition("full", "inletTemp", "Available") or ("", "", "")
        assert reason == "Fetched" and "DMTF Thermal of /redfish/v1/Chassis/" in message
    finally:
        pressure.stop()


def test_an_endpoint_taken_down_is_reported_stale_and_recovers(env: Env) -> None:
    pressure = PressureApi(env.node, PRESSURE)
    pressure.start()
    try:
        env.create_node_config(
            "down",
            {
                "nodeName": env.node,
                "metricsCollector": {
                    "inletTemp": term("Fake"),
                    "deltaP": term("DifferentialPressureAPI", pressure.url),
                },
            },
        )
        line = f"rmd_node_differential_pressure_pascals{label(env, 'down')} {PRESSURE}"
        env.wait(lambda: line in env.metrics(), "the pressure in the metrics")
        pressure.stop()
        message = env.wait_condition("down", "deltaP", "Error", "True", "Unreachable")
        assert pressure.url in message
        env.wait_event("down", "Warning", "Unreachable", "deltaP: ")
        # TTL = 4 intervals: then stale, out of the metrics, its age and errors still exported.
        env.wait_condition("down", "deltaP", "Stale", "True", "Expired")
        env.wait_event("down", "Warning", "Stale", "deltaP: ")
        text = env.metrics()
        assert "rmd_node_differential_pressure_pascals{" not in text
        assert 'collector="deltaP"' in text and 'error="Unreachable"' in text
        assert "value" in env.sources("down")["deltaP"]  # the last value stays in the status, with its time
        pressure.start()  # the endpoint is back, same port
        env.wait_event("down", "Normal", "Recovered", "deltaP: ")
        env.wait_condition("down", "deltaP", "Error", "False", "Fetched")
        env.wait(lambda: line in env.metrics(), "the pressure back in the metrics")
    finally:
        pressure.stop()


def test_wrong_credentials_and_a_wrong_ca_are_told_in_the_status(env: Env, bmc: str) -> None:
    fake = term("Fake")
    env.create_node_config(
        "badauth",
        {
            "nodeName": env.node,
            "metricsCollector": {
                "inletTemp": term(
                    "Redfish", bmc, basicAuthSecret={"name": "bad-auth"}, caBundleSecret={"name": "bmc-ca"}
                ),
                "deltaP": fake,
            },
        },
    )
    env.create_node_config(
        "badca",
        {
            "nodeName": env.node,
            "metricsCollector": {
                "inletTemp": term(
                    "Redfish", bmc, basicAuthSecret={"name": "bmc-auth"}, caBundleSecret={"name": "other-ca"}
                ),
                "deltaP": fake,
            },
        },
    )
    message = env.wait_condition("badauth", "inletTemp", "Error", "True", "Unauthorized")
    assert f"HTTP 401 from {bmc}/redfish/v1/" in message
    assert f"the BMC refused the credentials of Secret {env.namespace}/bad-auth" in message
    env.wait_event("badauth", "Warning", "Unauthorized", "inletTemp: ")
    message = env.wait_condition("badca", "inletTemp", "Error", "True", "TLSError")
    assert "certificate verify failed" in message and "caBundleSecret" in message
    env.wait_event("badca", "Warning", "TLSError", "inletTemp: ")
    env.wait_condition("badca", "deltaP", "Available", "True", "Fetched")  # one failing source stops no other
    # Deleted: its runners stop and its series leave the metrics.
    assert f'nodeconfig="{env.namespace}/badca"' in env.metrics()
    env.objects.delete_namespaced_custom_object(GROUP, VERSION, env.namespace, NODE_CONFIG.plural, "badca")
    env.wait(lambda: f'nodeconfig="{env.namespace}/badca"' not in env.metrics(), "badca's series gone")
    assert f'nodeconfig="{env.namespace}/badauth"' in env.metrics()
