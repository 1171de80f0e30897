"""Prometheus collector for the power snapshots: one snapshot per scrape, families built from the catalog.

Register on the agent's one registry: `registry.register(PowerCollector(sampler))`. The collector holds no
per-series state; every scrape renders the sampler's current snapshot, so all series of a scrape belong to
the same interval and series of departed pods vanish with them. Terminated pods appear in exactly one
scrape (their final counters), then the sampler drops them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from rmd_agent.metrics import catalog
from rmd_agent.power.sampler import DURATION_BUCKETS, PowerSnapshot

NAMES = (
    *(m.name for m in catalog.METRICS if m.group in ("node", "workload")),
    "rmd_agent_power_samples_total",
    "rmd_agent_power_sample_errors_total",
    "rmd_agent_power_sample_duration_seconds",
    "rmd_agent_power_last_sample_timestamp_seconds",
)


class SnapshotSource(Protocol):
    def snapshot(self) -> PowerSnapshot: ...

    def mark_exported(self, uids: set[str]) -> None: ...


class PowerCollector(Collector):
    """`containers=False` leaves out the container level (three quarters of the series on a node whose
    pods have three containers); pods, node and system are always exported."""

    def __init__(self, source: SnapshotSource, *, containers: bool = True) -> None:
        self.source = source
        self.containers = containers

    def describe(self) -> Iterator[Metric]:
        for name in NAMES:
            yield catalog.family(name)

    def collect(self) -> Iterator[Metric]:
        snap = self.source.snapshot()
        yield from render(snap, containers=self.containers)
        terminated = {p.uid for p in snap.pods if p.terminated}
        if terminated:
            self.source.mark_exported(terminated)


def render(snap: PowerSnapshot, *, containers: bool = True) -> Iterator[Metric]:
    """The families of one snapshot (pure; also used by tests and the bench)."""
    fam = {name: catalog.family(name) for name in NAMES}

    def add(name: str, labels: list[str], value: float) -> None:
        fam[name].add_metric(labels, value)  # type: ignore[attr-defined]

    for zone in snap.zones:
        labels = [zone.key.kind, zone.key.socket]
        add("rmd_node_energy_joules_total", labels, zone.energy_j)
        add("rmd_node_active_energy_joules_total", labels, zone.active_j)
        add("rmd_node_idle_energy_joules_total", labels, zone.idle_j)
        add("rmd_node_power_watts", labels, zone.watts)
        add("rmd_node_active_power_watts", labels, zone.active_watts)
        add("rmd_node_idle_power_watts", labels, zone.idle_watts)
    if snap.zones:
        zones = "+".join(snap.host_kinds)
        add("rmd_node_host_energy_joules_total", [zones], snap.host_energy_j())
        add("rmd_node_host_power_watts", [zones], snap.host_watts())
    add("rmd_node_cpu_busy_ratio", [], snap.busy_ratio)
    add("rmd_rapl_available", [snap.rapl_reason], 0.0 if snap.rapl_reason else 1.0)
    for pod in snap.pods:
        for kind, joules in sorted(pod.energy_j.items()):
            labels = [pod.namespace, pod.name, pod.uid, kind]
            add("rmd_pod_energy_joules_total", labels, joules)
            if not pod.terminated:
                add("rmd_pod_power_watts", labels, pod.watts.get(kind, 0.0))
    for part in snap.containers if containers else ():
        for kind, joules in sorted(part.energy_j.items()):
            labels = [part.namespace, part.pod, part.uid, part.container, kind]
            add("rmd_container_energy_joules_total", labels, joules)
            if not part.terminated:
                add("rmd_container_power_watts", labels, part.watts.get(kind, 0.0))
    for kind, joules in sorted(snap.system_j.items()):
        add("rmd_system_energy_joules_total", [kind], joules)
        add("rmd_system_power_watts", [kind], snap.system_watts.get(kind, 0.0))
    stats = snap.stats
    add("rmd_agent_power_samples_total", [], stats.samples)
    for source, count in sorted(stats.errors.items()):
        add("rmd_agent_power_sample_errors_total", [source], count)
    histogram = fam["rmd_agent_power_sample_duration_seconds"]
    assert isinstance(histogram, HistogramMetricFamily)
    buckets = [
        (f"{bound:g}", float(count))
        for bound, count in zip(DURATION_BUCKETS, stats.duration_buckets, strict=True)
    ]
    buckets.append(("+Inf", float(stats.samples)))
    histogram.add_metric([], buckets, stats.duration_sum)
    if stats.last_sample_time:
        add("rmd_agent_power_last_sample_timestamp_seconds", [], stats.last_sample_time)
    yield from fam.values()
