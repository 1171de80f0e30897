"""Prometheus collector over the manager's snapshot: one snapshot per scrape, families from the catalog.

Bounded labels: one series per NodeConfig source (and error reason); a removed NodeConfig's series go with
it, since each scrape renders only what the manager holds.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from rmd_operator.telemetry import catalog
from rmd_operator.telemetry.manager import TelemetryManager
from rmd_operator.telemetry.spec import DELTA_P, INLET_TEMP, POWER

VALUE_METRIC = {
    INLET_TEMP: "rmd_node_inlet_temperature_celsius",
    DELTA_P: "rmd_node_differential_pressure_pascals",
    POWER: "rmd_node_predicted_power_watts",
}


class TelemetryCollector(Collector):
    def __init__(self, manager: TelemetryManager) -> None:
        self.manager = manager

    def describe(self) -> Iterator[Metric]:
        for spec in catalog.METRICS:
            yield spec.family()

    def collect(self) -> Iterator[Metric]:
        families = {spec.name: spec.family() for spec in catalog.METRICS}
        for snap in self.manager.snapshot():
            node = [snap.node, f"{snap.namespace}/{snap.name}"]
            if snap.value is not None:
                families[VALUE_METRIC[snap.kind]].add_metric(node, snap.value)  # type: ignore[attr-defined]
            if snap.age is not None:
                families["rmd_node_telemetry_value_age_seconds"].add_metric(  # type: ignore[attr-defined]
                    [*node, snap.kind], snap.age
                )
            for reason, count in sorted(snap.errors_total.items()):
                families["rmd_node_telemetry_fetch_errors_total"].add_metric(  # type: ignore[attr-defined]
                    [*node, snap.kind, reason], count
                )
        yield from families.values()
