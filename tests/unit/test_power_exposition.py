"""The /metrics text of the power collector written directly (exposition.generate) says what
prometheus_client's formatting of the same families says, and terminated pods still appear exactly once."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rmd_agent.metrics import exposition
from rmd_agent.metrics.power_collector import PowerCollector
from rmd_agent.power.attribution import ZoneKey
from rmd_agent.power.sampler import ContainerEnergy, NodeZone, PodEnergy, PowerSnapshot, SamplerStats

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Source:
    def __init__(self, snap: PowerSnapshot) -> None:
        self.snap = snap
        self.exported: list[set[str]] = []

    def snapshot(self) -> PowerSnapshot:
        return self.snap

    def mark_exported(self, uids: set[str]) -> None:
        self.exported.append(uids)
        self.snap = dataclasses.replace(
            self.snap,
            pods=tuple(p for p in self.snap.pods if p.uid not in uids),
            containers=tuple(c for c in self.snap.containers if c.uid not in uids),
        )


def snapshot() -> PowerSnapshot:
    kinds = {"package": 1234.567890123456, "dram": 0.1 + 0.2}
    pods = (
        PodEnergy("uid-a", "ns", "web", kinds, {"package": 12.3456789, "dram": 0.5}),
        PodEnergy("uid-b", "odd", 'quote"back\\slash', {"package": 2.0}, {"package": 0.25}),
        PodEnergy("uid-c", "ns", "gone", {"package": 99.0}, {}, terminated=True),
    )
    containers = (
        ContainerEnergy(
            "uid-a", "ns", "web", "", {"package": 1.0, "dram": 0.0}, {"package": 0.1, "dram": 0.0}
        ),
        ContainerEnergy("uid-a", "ns", "web", "app", kinds, {"package": 12.0, "dram": 0.5}),
        ContainerEnergy("uid-c", "ns", "gone", "app", {"package": 99.0}, {}, terminated=True),
    )
    zones = (NodeZone(ZoneKey("package", "0"), 5000.0, 3000.0, 2000.0, 50.0, 30.0, 20.0),)
    stats = SamplerStats(samples=3, last_sample_time=1.7e9)
    return PowerSnapshot(
        3, "", 1.0, 0.6, zones, ("package",), pods, containers, {"package": 7.0}, {"package": 0.7}, stats
    )


def parse(text: bytes) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


@pytest.mark.parametrize("containers", [True, False])
def test_direct_text_matches_prometheus_client(containers: bool) -> None:
    def scrape(generate: object) -> tuple[Samples, list[set[str]]]:
        source = Source(snapshot())
        registry = CollectorRegistry()
        registry.register(PowerCollector(source, containers=containers))
        assert callable(generate)
        return parse(generate(registry)), source.exported

    direct, direct_exported = scrape(exposition.generate)
    reference, reference_exported = scrape(generate_latest)
    assert direct.keys() == reference.keys()
    for key, value in reference.items():
        assert direct[key] == pytest.approx(value, abs=1e-6), key
    assert direct_exported == reference_exported == [{"uid-c"}]


def test_terminated_pods_appear_in_one_scrape_and_label_cache_follows_pods() -> None:
    source = Source(snapshot())
    registry = CollectorRegistry()
    registry.register(PowerCollector(source))
    first = parse(exposition.generate(registry))
    second = parse(exposition.generate(registry))
    assert any(dict(labels).get("uid") == "uid-c" for _, labels in first)
    assert not any(dict(labels).get("uid") == "uid-c" for _, labels in second)
    assert first.keys() - second.keys() == {k for k in first if dict(k[1]).get("uid") == "uid-c"}


def test_add_text_outside_generate_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        exposition.add_text(b"x")
