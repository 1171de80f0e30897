"""The shape of a metric catalog entry, shared by the agent's catalog and the operator's.

Each component lists the metrics it exports as `MetricSpec`s; its collectors build their families from them
and tools/gen_metrics_doc.py writes docs/metrics.md from all of them, so a name or label cannot drift from
its documentation. Names are as exposed: counters end in `_total`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

MetricType = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...]
    group: str
    unit: str = ""  # shown in the docs; Prometheus units live in the name (_joules, _watts, _bytes)

    @property
    def family_name(self) -> str:
        """The name prometheus_client wants: counters without the `_total` it appends itself."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name

    def sample_names(self) -> tuple[str, ...]:
        """Series names this metric produces in the exposition format."""
        if self.type == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)

    def family(self) -> Metric:
        """An empty family for this metric, with its labels declared."""
        labels: Sequence[str] = self.labels
        if self.type == "counter":
            return CounterMetricFamily(self.family_name, self.help, labels=labels)
        if self.type == "gauge":
            return GaugeMetricFamily(self.family_name, self.help, labels=labels)
        return HistogramMetricFamily(self.family_name, self.help, labels=labels)


@dataclass(frozen=True)
class Group:
    key: str
    title: str
    intro: str
