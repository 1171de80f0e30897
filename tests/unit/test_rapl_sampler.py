"""RAPL sampling: wraparound at any point of an interval, zones never double counted, per-socket zones,
MMIO duplicates ignored, and a node without RAPL reported rather than crashing."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from rmd_agent.hostfs import HostFS
from rmd_agent.power.attribution import ZoneKey
from rmd_agent.power.rapl_sampler import (
    ZONE_KINDS,
    EnergyCounters,
    RaplSampler,
    counter_delta,
    host_zone_kinds,
    overlaps,
    zone_kind,
)
from rmd_agent.power.sampler import PowerSampler
from rmd_sim.hosttree import MAX_ENERGY_RANGE_UJ, write_host_tree
from rmd_sim.load import SimLoad
from rmd_sim.spec import NodeSpec

ranges = st.integers(min_value=1000, max_value=2**63)


@given(ranges, st.data())
def test_wraparound_at_any_point_of_an_interval(max_range: int, data: st.DataObject) -> None:
    """A counter modulo max_range, read before and after an interval in which it advanced by less than
    the range in any number of steps, wrapping (or not) at any of them."""
    start = data.draw(st.integers(0, max_range - 1), label="start")
    steps = data.draw(st.lists(st.integers(0, max_range // 4), min_size=1, max_size=4), label="steps")
    assume(sum(steps) < max_range)
    value = start
    for step in steps:
        value = (value + step) % max_range
    assert counter_delta(start, value, max_range) == sum(steps)


@given(ranges, st.data())
def test_counters_over_many_intervals_sum_to_the_energy(max_range: int, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, max_range - 1))
    increments = data.draw(st.lists(st.integers(0, max_range - 1), min_size=1, max_size=30))
    counters = EnergyCounters(max_range_uj={"z": max_range})
    assert counters.update({"z": start}) == {}  # the first reading is a baseline
    value, seen = start, 0
    for inc in increments:
        value = (value + inc) % max_range
        seen += counters.update({"z": value})["z"]
    assert seen == sum(increments)


def test_an_unreadable_zone_keeps_its_energy_for_the_next_interval() -> None:
    counters = EnergyCounters(max_range_uj={"a": 100, "b": 100})
    counters.update({"a": 10, "b": 10})
    assert counters.update({"a": 20}) == {"a": 10}  # b unreadable this time
    assert counters.update({"a": 30, "b": 5}) == {"a": 10, "b": 95}  # b: 10 -> (wrapped) 5 over both


def test_a_decrease_without_a_usable_range_counts_nothing() -> None:
    assert counter_delta(500, 100, 0) == 0
    assert counter_delta(500, 100, 400) == 0  # a reading beyond the range: not a wrap we can correct
    assert counter_delta(100, 100, 1000) == 0
    assert counter_delta(MAX_ENERGY_RANGE_UJ - 1, 4, MAX_ENERGY_RANGE_UJ) == 5


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("package-0", "package"),
        ("package-12", "package"),
        ("core", "core"),
        ("PP0", "core"),
        ("pp1", "uncore"),
    ],
)
def test_zone_kind(name: str, kind: str) -> None:
    assert zone_kind(name) == kind


kind_sets = st.sets(st.sampled_from(ZONE_KINDS), min_size=1)


@given(kind_sets)
def test_host_zones_never_double_count(kinds: set[str]) -> None:
    chosen = host_zone_kinds(kinds)
    assert set(chosen) <= kinds
    for a, b in itertools.combinations(chosen, 2):
        assert not overlaps(a, b), (a, b)
    # and nothing present is left out: every zone is inside (or is) a chosen one
    for kind in kinds:
        assert any(overlaps(kind, c) for c in chosen), kind


def test_host_zones_prefer_psys_then_package_and_dram() -> None:
    assert host_zone_kinds(ZONE_KINDS) == ("psys",)
    assert host_zone_kinds(["package", "core", "uncore", "dram"]) == ("package", "dram")
    assert host_zone_kinds(["core", "dram"]) == ("core", "dram")  # no package: its parts are all there is


def write_tree(root: Path, **changes: object) -> NodeSpec:
    spec = NodeSpec(**{"cores_per_socket": 4, **changes})  # type: ignore[arg-type]
    write_host_tree(spec, root)
    return spec


def test_zones_per_socket_and_mmio_duplicate_ignored(tmp_path: Path) -> None:
    write_tree(tmp_path, rapl_zones=("package", "core", "uncore", "dram", "psys"), rapl_mmio_duplicate=True)
    sampler = RaplSampler(HostFS(tmp_path))
    assert sampler.discover() is None
    keys = {z.key for z in sampler.zones}
    expected = {ZoneKey(k, s) for k in ("package", "core", "uncore", "dram") for s in ("0", "1")}
    assert keys == expected | {ZoneKey("psys", "")}
    assert all("mmio" not in z.zone_id for z in sampler.zones)


def test_sampler_corrects_a_wrap_on_one_socket(tmp_path: Path) -> None:
    """Socket 0's package counter starts 1 J below the wrap; its delta and the node total stay right."""
    write_tree(tmp_path, rapl_zones=("package", "dram"))
    load = SimLoad(tmp_path, start_energy_uj={"intel-rapl:0": MAX_ENERGY_RANGE_UJ - 1_000_000})
    sampler = RaplSampler(HostFS(tmp_path))
    sampler.discover()
    sampler.sample()
    load.advance(10.0)
    deltas, reading = sampler.sample()
    assert load.wraps["intel-rapl:0"] == 1
    assert reading.errors == ()
    expected_package = load.model.zone_watts("package", load.busy_cpus / 2) * 10.0 * 1e6
    assert deltas[ZoneKey("package", "0")] == pytest.approx(expected_package, abs=2)
    assert deltas[ZoneKey("package", "1")] == pytest.approx(expected_package, abs=2)


def test_node_energy_counts_each_zone_once(tmp_path: Path) -> None:
    """Through the whole sampler: the host total is package + dram, not package + core + uncore + dram."""
    write_tree(tmp_path, rapl_zones=("package", "core", "uncore", "dram"))
    load = SimLoad(tmp_path)
    sampler = PowerSampler(HostFS(tmp_path), clock=lambda: load.now)
    sampler.sample()
    load.advance(5.0)
    sampler.sample()
    snap = sampler.snapshot()
    assert snap.host_kinds == ("package", "dram")
    assert snap.host_energy_j() == pytest.approx(
        load.zone_joules("package") + load.zone_joules("dram"), rel=1e-9
    )
    total_all = sum(z.energy_j for z in snap.zones)
    assert total_all > snap.host_energy_j()  # summing every zone would count core and uncore twice


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("no_powercap", "no powercap in sysfs"),
        ("unreadable", "not readable"),
    ],
)
def test_missing_rapl_is_reported_not_raised(tmp_path: Path, setup: str, reason: str) -> None:
    if setup == "no_powercap":
        write_tree(tmp_path, rapl_zones=())
    else:
        write_tree(tmp_path, rapl_zones=("package",))
        # a counter that cannot be read as a file (what EACCES looks like to a non-root agent)
        energy = tmp_path / "sys/devices/virtual/powercap/intel-rapl/intel-rapl:0/energy_uj"
        energy.unlink()
        energy.mkdir()
    load = SimLoad(tmp_path) if setup == "no_powercap" else None
    sampler = PowerSampler(HostFS(tmp_path), clock=lambda: load.now if load else 0.0)
    for _ in range(3):
        sampler.sample()
        snap = sampler.snapshot()
    assert not snap.rapl_available
    assert reason in snap.rapl_reason
    assert snap.zones == ()
    assert snap.stats.samples == 3


def test_rapl_is_found_when_it_appears_later(tmp_path: Path) -> None:
    write_tree(tmp_path, rapl_zones=("package",))
    powercap = tmp_path / "sys/class/powercap"
    hidden = tmp_path / "powercap-hidden"
    powercap.rename(hidden)
    now = [0.0]
    sampler = PowerSampler(HostFS(tmp_path), clock=lambda: now[0], rediscover_seconds=60)
    sampler.sample()
    assert not sampler.snapshot().rapl_available
    hidden.rename(powercap)
    now[0] = 30.0
    sampler.sample()
    assert not sampler.snapshot().rapl_available  # not looked for again yet
    now[0] = 61.0
    sampler.sample()
    assert sampler.snapshot().rapl_available


def powercap_files(zones: dict[str, tuple[str, int]]) -> dict[str, str]:
    files = {"sys/class/powercap/intel-rapl/enabled": "1\n"}
    for zone_id, (name, energy) in zones.items():
        base = f"sys/class/powercap/{zone_id}"
        files |= {
            f"{base}/name": f"{name}\n",
            f"{base}/energy_uj": f"{energy}\n",
            f"{base}/max_energy_range_uj": "262143328850\n",
        }
    return files


def test_keplers_fixture_layout(make_tree: Callable[[Mapping[str, str]], Path]) -> None:
    """Kepler's unit-test powercap tree: a control type without a name, an MMIO duplicate of package-0 and
    a malformed zone index. Only the real package and its core subzone are read."""
    root = make_tree(
        powercap_files(
            {
                "intel-rapl:0": ("package-0", 240422366267),
                "intel-rapl:0:0": ("core", 118821284256),
                "intel-rapl-mmio:0": ("package-0", 240422366267),
                "intel-rapl:a": ("package-10", 1),
            }
        )
    )
    sampler = RaplSampler(HostFS(root))
    assert sampler.discover() is None
    assert [(z.zone_id, z.key) for z in sampler.zones] == [
        ("intel-rapl:0", ZoneKey("package", "0")),
        ("intel-rapl:0:0", ZoneKey("core", "0")),
    ]


def test_amd_layout(make_tree: Callable[[Mapping[str, str]], Path]) -> None:
    """AMD Zen (kernel >= 5.11): the same intel-rapl control type, package and core zones, no dram."""
    root = make_tree(
        powercap_files(
            {
                "intel-rapl:0": ("package-0", 1000),
                "intel-rapl:0:0": ("core", 500),
                "intel-rapl:1": ("package-1", 2000),
                "intel-rapl:1:0": ("core", 700),
            }
        )
    )
    sampler = RaplSampler(HostFS(root))
    sampler.discover()
    sampler.sample()
    (root / "sys/class/powercap/intel-rapl:1/energy_uj").write_text("2500\n")
    deltas, _ = sampler.sample()
    assert deltas == {
        ZoneKey("package", "0"): 0,
        ZoneKey("core", "0"): 0,
        ZoneKey("package", "1"): 500,
        ZoneKey("core", "1"): 0,
    }
    assert host_zone_kinds(z.key.kind for z in sampler.zones) == ("package",)
