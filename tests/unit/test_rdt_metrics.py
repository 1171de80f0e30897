"""Per-workload RDT metrics: ways from the applied masks, resctrl monitoring where it exists, and an engine
that cannot answer counted rather than raised."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rmd_agent.engine_api import AppliedWorkload
from rmd_agent.hostfs import HostFS
from rmd_agent.metrics.rdt_collector import RdtCollector, read_group_monitoring
from rmd_agent.plan.workload import Workload


def applied(name: str, cos: str, cache: dict[int, int]) -> AppliedWorkload:
    return AppliedWorkload(Workload("ns", name), f"id-{name}", cos, "guaranteed", cache=cache)


def mon(root: Path, group: str, cache_id: int, **events: str) -> None:
    base = root / "sys/fs/resctrl" / group / "mon_data" / f"mon_L3_{cache_id:02d}"
    base.mkdir(parents=True, exist_ok=True)
    for event, value in events.items():
        (base / event).write_text(value + "\n")


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


async def test_ways_and_monitoring_per_workload(tmp_path: Path) -> None:
    mon(tmp_path, "gold", 0, llc_occupancy="1048576", mbm_total_bytes="5000", mbm_local_bytes="4000")
    mon(tmp_path, "gold", 1, llc_occupancy="2097152", mbm_total_bytes="Unavailable", mbm_local_bytes="10")

    async def workloads() -> Sequence[AppliedWorkload]:
        return [
            applied("a", "gold", {0: 0b1111, 1: 0b11110000}),
            applied("b", "", {}),  # no cache part: nothing to report
            applied("c", "silver", {0: 0b1}),  # a group without monitoring data
        ]

    collector = RdtCollector(HostFS(tmp_path), workloads)
    registry = CollectorRegistry()
    registry.register(collector)
    await collector.refresh()
    got = samples(registry)

    def key(
        name: str, workload: str, cos: str, cache_id: int, **extra: str
    ) -> tuple[str, tuple[tuple[str, str], ...]]:
        labels = {"namespace": "ns", "workload": workload, "cos": cos, "cache_id": str(cache_id), **extra}
        return name, tuple(sorted(labels.items()))

    assert got[key("rmd_workload_cache_ways", "a", "gold", 0)] == 4
    assert got[key("rmd_workload_cache_ways", "a", "gold", 1)] == 4
    assert got[key("rmd_workload_cache_ways", "c", "silver", 0)] == 1
    assert got[key("rmd_workload_llc_occupancy_bytes", "a", "gold", 1)] == 2097152
    assert got[key("rmd_workload_memory_bandwidth_bytes_total", "a", "gold", 0, scope="total")] == 5000
    assert got[key("rmd_workload_memory_bandwidth_bytes_total", "a", "gold", 1, scope="local")] == 10
    # "Unavailable" (an RMID not counting yet) is left out rather than exported as a number
    assert key("rmd_workload_memory_bandwidth_bytes_total", "a", "gold", 1, scope="total") not in got
    assert not any(labels and dict(labels).get("workload") == "b" for _, labels in got)
    assert not any(
        name == "rmd_workload_llc_occupancy_bytes" and dict(labels)["cos"] == "silver" for name, labels in got
    )
    assert got[("rmd_agent_rdt_refresh_errors_total", ())] == 0


async def test_engine_failure_keeps_the_last_figures(tmp_path: Path) -> None:
    calls = {"n": 0}

    def workloads() -> Sequence[AppliedWorkload]:  # a plain (not async) provider works too
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("engine restarting")
        return [applied("a", "gold", {0: 0b111})]

    collector = RdtCollector(HostFS(tmp_path), workloads)
    await collector.refresh()
    snap = await collector.refresh()
    assert snap.errors == 1
    assert [w.name for w in snap.workloads] == ["a"]


def test_root_group_monitoring_and_absent_mon_data(tmp_path: Path) -> None:
    fs = HostFS(tmp_path)
    assert read_group_monitoring(fs, "nothing") is None
    mon(tmp_path, "", 0, llc_occupancy="64")
    result = read_group_monitoring(fs, "")
    assert result is not None and result.llc_occupancy == {0: 64}
