"""Every metric the operator exports for node telemetry (NodeConfig collectors), in the shared catalog shape.

docs/metrics.md lists them after the agent's (tools/gen_metrics_doc.py). One series per NodeConfig source:
labels `node` and `nodeconfig` (namespace/name: two NodeConfigs may name the same node, e.g. one written by
hand and one from a template, and must not collide).
"""

from __future__ import annotations

from prometheus_client.core import Metric

from rmd_api.metric_spec import Group, MetricSpec

GROUPS = (
    Group(
        "telemetry",
        "Node telemetry (operator)",
        "Exported by the operator (`rmd_operator.telemetry.metrics.TelemetryCollector`) at `/metrics` on "
        "its `metrics_listen` address (the chart: port 8081, Service `<release>-rmd-operator`, and a "
        "ServiceMonitor with `serviceMonitor.enabled`), one series per NodeConfig source: inlet temperature "
        "over Redfish, differential pressure, power predicted over the V2 inference protocol "
        "([telemetry-collectors.md](telemetry-collectors.md)). A value older than its TTL (4 fetch "
        "intervals) is stale and not exported; its age still is.",
    ),
)

_NODE = ("node", "nodeconfig")

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "rmd_node_inlet_temperature_celsius",
        "gauge",
        "Inlet (intake) air temperature from the node's BMC over Redfish",
        _NODE,
        "telemetry",
        "°C",
    ),
    MetricSpec(
        "rmd_node_differential_pressure_pascals",
        "gauge",
        "Differential pressure across the node, from the pressure sensor API",
        _NODE,
        "telemetry",
        "Pa",
    ),
    MetricSpec(
        "rmd_node_predicted_power_watts",
        "gauge",
        "Node power predicted by the V2 inference model from CPU usage, inlet temperature and pressure",
        _NODE,
        "telemetry",
        "W",
    ),
    MetricSpec(
        "rmd_node_telemetry_fetch_errors_total",
        "counter",
        "Failed fetches of a NodeConfig source, by reason (Unreachable, Unauthorized, TLSError, BadResponse, "
        "InvalidConfig, InputsUnavailable)",
        (*_NODE, "collector", "error"),
        "telemetry",
    ),
    MetricSpec(
        "rmd_node_telemetry_value_age_seconds",
        "gauge",
        "Age of a source's last value (exported while stale too; absent before the first value)",
        (*_NODE, "collector"),
        "telemetry",
        "s",
    ),
)

LABELS: dict[str, str] = {
    "node": "the node a NodeConfig describes (spec.nodeName)",
    "nodeconfig": "the NodeConfig, namespace/name",
    "collector": "the NodeConfig source: inletTemp, deltaP or powerConsumption",
    "error": "why a fetch failed (the reason of the source's Error condition)",
}

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


def family(name: str) -> Metric:
    return BY_NAME[name].family()
