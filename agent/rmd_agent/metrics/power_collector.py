"""Prometheus collector for the power snapshots: one snapshot per scrape, families built from the catalog.

Register on the agent's one registry: `registry.register(PowerCollector(sampler))`. The collector holds no
per-series state; every scrape renders the sampler's current snapshot, so all series of a scrape belong to
the same interval and series of departed pods vanish with them. Terminated pods appear in exactly one
scrape (their final counters), then the sampler drops them.

Served through `exposition.generate()` (the agent's /metrics), the pod and container families, nearly all
of the series, are written as text directly: label strings are built once per pod, container and zone and
reused while the pod lives, so a scrape of 500 pods is string joins, not 8,000 passes through
prometheus_client's validation and escaping. Values are the same floats, rounded to the µJ (the RAPL
counters' unit) and µW: shorter text, no information lost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from rmd_agent.metrics import catalog, exposition
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
        self._text = TextRenderer()

    def describe(self) -> Iterator[Metric]:
        for name in NAMES:
            yield catalog.family(name)

    def collect(self) -> Iterator[Metric]:
        snap = self.source.snapshot()
        if exposition.text_wanted():
            exposition.add_text(self._text.render(snap, containers=self.containers))
        else:
            yield from render(snap, containers=self.containers)
        terminated = {p.uid for p in snap.pods if p.terminated}
        if terminated:
            self.source.mark_exported(terminated)


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def _text(families: list[Metric]) -> bytes:
    return generate_latest(_Families(families))  # only collect() is used


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(round(value, 6))


_POD_ENERGY, _POD_WATTS = "rmd_pod_energy_joules_total", "rmd_pod_power_watts"
_PART_ENERGY, _PART_WATTS = "rmd_container_energy_joules_total", "rmd_container_power_watts"
_PER_POD = (_POD_ENERGY, _POD_WATTS, _PART_ENERGY, _PART_WATTS)


class TextRenderer:
    """The text of one snapshot, pod and container lines from cached label strings (see the module doc)."""

    def __init__(self) -> None:
        self._headers = {name: _text([catalog.family(name)]) for name in _PER_POD}
        self._family_names = {catalog.family(name).name for name in _PER_POD}
        self._labels: dict[tuple[str, ...], str] = {}

    def _labels_of(
        self, key: tuple[str, ...], names: tuple[str, ...], seen: dict[tuple[str, ...], str]
    ) -> str:
        text = self._labels.get(key)
        if text is None:
            text = "{" + ",".join(f'{n}="{_label(v)}"' for n, v in zip(names, key, strict=True)) + "}"
        seen[key] = text
        return text

    def render(self, snap: PowerSnapshot, *, containers: bool = True) -> bytes:
        rest = dataclasses.replace(snap, pods=(), containers=())
        head = _text([f for f in render(rest) if f.name not in self._family_names])
        seen: dict[tuple[str, ...], str] = {}
        pod_names = ("namespace", "pod", "uid", "zone")
        energy: list[str] = []
        watts: list[str] = []
        for pod in snap.pods:
            for kind, joules in sorted(pod.energy_j.items()):
                labels = self._labels_of((pod.namespace, pod.name, pod.uid, kind), pod_names, seen)
                energy.append(f"{_POD_ENERGY}{labels} {_number(joules)}\n")
                if not pod.terminated:
                    watts.append(f"{_POD_WATTS}{labels} {_number(pod.watts.get(kind, 0.0))}\n")
        out = [head, self._headers[_POD_ENERGY], "".join(energy).encode()]
        out += [self._headers[_POD_WATTS], "".join(watts).encode()]
        if containers:
            part_names = ("namespace", "pod", "uid", "container", "zone")
            energy, watts = [], []
            for part in snap.containers:
                for kind, joules in sorted(part.energy_j.items()):
                    key = (part.namespace, part.pod, part.uid, part.container, kind)
                    labels = self._labels_of(key, part_names, seen)
                    energy.append(f"{_PART_ENERGY}{labels} {_number(joules)}\n")
                    if not part.terminated:
                        watts.append(f"{_PART_WATTS}{labels} {_number(part.watts.get(kind, 0.0))}\n")
            out += [self._headers[_PART_ENERGY], "".join(energy).encode()]
            out += [self._headers[_PART_WATTS], "".join(watts).encode()]
        self._labels = seen  # label strings of pods gone since the last scrape are dropped
        return b"".join(out)


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
