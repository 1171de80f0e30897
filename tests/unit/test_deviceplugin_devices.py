"""The device plugin's pure parts: device ids, the device list, preferred allocations, Allocate's
environment, and the pool sizes derived from the engine's summary."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmd_agent.cache_ways import device_id, parse_device_id
from rmd_agent.deviceplugin.devices import (
    ENV_CACHE_IDS,
    ENV_DEVICES,
    ENV_WAYS,
    UnknownDevices,
    WayPool,
    allocation_envs,
    numa_nodes_of,
    plan_devices,
    preferred_ways,
)
from rmd_agent.deviceplugin.pools import guaranteed_pools
from rmd_agent.engine_api import AppliedWorkload, CacheDomainSummary
from rmd_agent.plan.workload import Workload


@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_device_ids_round_trip(cache_id: int, way: int) -> None:
    text = device_id(cache_id, way)
    assert parse_device_id(text) == (cache_id, way)
    assert len(text) <= 63  # the device plugin API's limit on ids


@pytest.mark.parametrize("text", ["l3-1-way-", "l3-a-way-1", "gpu0", "l3-1-way-1x", " l3-1-way-1"])
def test_foreign_ids_do_not_parse(text: str) -> None:
    assert parse_device_id(text) is None


def test_one_device_per_way_sorted_by_cache_then_way() -> None:
    devices = plan_devices(
        [WayPool(1, frozenset({1}), 2), WayPool(0, frozenset({0, 2}), 3), WayPool(2, frozenset(), 0)]
    )
    assert [d.id for d in devices] == ["l3-0-way-0", "l3-0-way-1", "l3-0-way-2", "l3-1-way-0", "l3-1-way-1"]
    assert [d.numa_nodes for d in devices] == [frozenset({0, 2})] * 3 + [frozenset({1})] * 2


def test_a_repeated_cache_is_an_error() -> None:
    with pytest.raises(ValueError, match="cache id 3 is listed twice"):
        plan_devices([WayPool(3, frozenset(), 1), WayPool(3, frozenset(), 2)])


def test_numa_nodes_of_a_cache() -> None:
    numa = {0: frozenset({0, 1}), 1: frozenset({2, 3}), 2: frozenset({4, 5})}
    assert numa_nodes_of({1, 2}, numa) == {0, 1}
    assert numa_nodes_of({7}, numa) == frozenset()


def test_allocate_environment() -> None:
    known = [device_id(c, w) for c in (0, 1) for w in range(4)]
    envs = allocation_envs(["l3-1-way-3", "l3-0-way-1", "l3-1-way-0"], known)
    assert envs == {
        ENV_WAYS: "3",
        ENV_DEVICES: "l3-0-way-1,l3-1-way-0,l3-1-way-3",
        ENV_CACHE_IDS: "0,1",
    }
    with pytest.raises(UnknownDevices, match="l3-2-way-0"):
        allocation_envs(["l3-0-way-0", "l3-2-way-0"], known)


def test_preferred_keeps_required_devices_and_fills_from_their_cache() -> None:
    available = ["l3-0-way-0", "l3-0-way-1", "l3-1-way-0", "l3-1-way-1", "l3-1-way-2"]
    assert preferred_ways(available, ["l3-0-way-1"], 2) == ["l3-0-way-1", "l3-0-way-0"]
    # Without requirements: the cache with the most offered ways, lowest ways first.
    assert preferred_ways(available, [], 2) == ["l3-1-way-0", "l3-1-way-1"]
    # Spills into the next cache only when one is not enough.
    assert preferred_ways(available, [], 4) == ["l3-1-way-0", "l3-1-way-1", "l3-1-way-2", "l3-0-way-0"]


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), unique=True, max_size=20),
    st.integers(0, 25),
    st.data(),
)
def test_preferred_is_a_subset_of_the_right_size(
    offered: list[tuple[int, int]], size: int, data: st.DataObject
) -> None:
    available = [device_id(c, w) for c, w in offered]
    must = data.draw(st.lists(st.sampled_from(available), unique=True) if available else st.just([]))
    chosen = preferred_ways(available, must, size)
    assert len(chosen) == len(set(chosen)) == max(len(must), min(size, len(available)))
    assert set(must) <= set(chosen) <= set(available)
    caches_used = {parse_device_id(i)[0] for i in chosen if i not in must}  # type: ignore[index]
    if must == [] and size and len(available) >= size:
        largest = max(sum(1 for c, _ in offered if c == cache) for cache in {c for c, _ in offered})
        if size <= largest:
            assert len(caches_used) == 1  # fits in one cache, so it stays in one


def _summary(cache_id: int, cpus: set[int], free: dict[str, int]) -> CacheDomainSummary:
    return CacheDomainSummary(cache_id, frozenset(cpus), 11, free)


def test_pool_size_is_free_plus_what_guaranteed_workloads_hold() -> None:
    caches = [
        _summary(0, {0, 1}, {"guaranteed": 2, "besteffort": 4, "shared": 1}),
        _summary(1, {2, 3}, {"guaranteed": 5, "besteffort": 4, "shared": 1}),
        _summary(2, {4}, {}),  # no L3 CAT on this one: no pool, no devices
    ]
    workloads = [
        AppliedWorkload(Workload("ns", "g"), "1", "COS1", "guaranteed", cache={0: 0b0000111000}),
        AppliedWorkload(Workload("ns", "g2"), "2", "COS2", "guaranteed", cache={0: 0b1, 1: 0b10}),
        AppliedWorkload(Workload("ns", "be"), "3", "COS3", "besteffort", cache={0: 0b11110000000}),
    ]
    numa = {0: frozenset({0, 1}), 1: frozenset({2, 3, 4})}

    pools = guaranteed_pools(caches, workloads, numa)

    assert pools == [
        WayPool(0, frozenset({0}), 2 + 3 + 1),
        WayPool(1, frozenset({1}), 5 + 1),
    ]
