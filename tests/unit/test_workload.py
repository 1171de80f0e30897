import dataclasses
from typing import Any

import pytest

from rmd_agent.observe.resctrl import CacheInfo, MbaInfo
from rmd_agent.plan.inventory import NodeInventory, PoolConfig
from rmd_agent.plan.policy import Policy, PolicyBook
from rmd_agent.plan.workload import (
    Pool,
    RejectReason,
    Workload,
    WorkloadRejected,
    check_request,
    pool_for,
    resolve_workload,
    validate_workload,
)
from rmd_agent.server import convert
from rmd_api.agent.v1 import agent_pb2
from rmd_api.workload_spec import InvalidSpec, parse_spec

L3 = CacheInfo(
    cbm_mask=0x7FF, min_cbm_bits=1, num_closids=16, shareable_bits=0, sparse_masks=False, cdp=False
)
MBA = MbaInfo(min_bandwidth=10, bandwidth_gran=10, delay_linear=True, num_closids=16, mbps=False)


def make_node(**changes: Any) -> NodeInventory:
    """8 CPUs on two L3 domains, an 11-way cache (OS 1, guaranteed 5, best effort 4, shared 1), MBA in %."""
    node = NodeInventory(
        cpus=frozenset(range(8)),
        caches={0: frozenset(range(4)), 1: frozenset(range(4, 8))},
        l3=L3,
        mba=MBA,
        platform="skylake",
        policies=PolicyBook().for_platform("skylake"),
    )
    return dataclasses.replace(node, **changes)


def wl(name: str = "a", cores: set[int] | None = None, **fields: Any) -> Workload:
    fields.setdefault("core_ids", frozenset({1} if cores is None else cores))
    return Workload("default", name, **fields)


def rejected(call: Any) -> WorkloadRejected:
    with pytest.raises(WorkloadRejected) as err:
        call()
    return err.value


# -- from an RmdWorkload spec (its layouts: rmd_api.workload_spec, tests/unit/test_operator_spec.py) ---------


def test_v03_spec_is_normalised() -> None:
    spec = {
        "allCores": True,
        "reservedCoreIds": ["0-1", "6"],
        "rdt": {"cache": {"max": 2, "min": 2}, "mba": {"percentage": 50}},
        "plugins": {"pstate": {"ratio": "3.0", "monitoring": "on"}},
        "nodes": ["worker-1"],  # the operator's business; ignored here
    }
    # as the operator reads it and the agent receives it
    ref = agent_pb2.WorkloadRef(namespace="prod", name="db", uid="u-1")
    w = convert.workload_from_request(agent_pb2.ApplyWorkloadRequest(ref=ref, spec=parse_spec(spec)))
    assert (w.key, w.uid, w.all_cores, w.reserved_core_ids) == ("prod/db", "u-1", True, frozenset({0, 1, 6}))
    assert (w.cache_max, w.cache_min, w.mba_percentage, w.mba_mbps) == (2, 2, 50, None)
    assert (w.pstate_ratio, w.pstate_monitoring, w.policy) == (3.0, "on", None)
    assert w.pool is Pool.GUARANTEED


@pytest.mark.parametrize(
    ("spec", "fields"),
    [
        ({"rdt": {"cache": {"max": 33, "min": 33}}}, {"cache_max": 33, "cache_min": 33}),
        ({"cache": {"max": 2, "min": 40}}, {"cache_max": 2, "cache_min": 40}),
        ({"rdt": {"mba": {"percentage": 101}}}, {"cache_max": 1, "cache_min": 1, "mba_percentage": 101}),
        ({"rdt": {"mba": {"mbps": 0}}}, {"cache_max": 1, "cache_min": 1, "mba_mbps": 0}),
        ({"plugins": {"pstate": {"ratio": "100"}}}, {"pstate_ratio": 100.0}),
        ({"pstate": {"ratio": "9999.9999"}}, {"pstate_ratio": 9999.9999}),
    ],
)
def test_reader_and_agent_refuse_out_of_range_values_with_the_same_words(
    spec: dict[str, Any], fields: dict[str, Any]
) -> None:
    """The operator's reader refuses what the CRD would (an object from before its ranges); the agent refuses
    the same values (from any other client) in the same words, naming its own field."""
    with pytest.raises(InvalidSpec) as reader:
        parse_spec({"coreIds": ["1"], **spec})
    agent = rejected(lambda: check_request(wl(**fields)))
    assert agent.reason is RejectReason.INVALID

    def rule(message: str) -> str:
        return message.partition(" must ")[2].rpartition(", not ")[0]

    assert rule(str(reader.value)) == rule(agent.message) != ""


def test_no_cache_and_no_policy_is_a_shared_request() -> None:
    # rmd-operator sends max=0/min=0 when rdt.cache is absent, which RMD reads as the shared pool.
    w = wl(cores={3}, pstate_ratio=2.0)
    assert (w.cache_max, w.wants_cache, w.pool) == (None, False, Pool.SHARED)


# -- pools ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cache_max", "cache_min", "pool"),
    [(2, 2, Pool.GUARANTEED), (1, 1, Pool.GUARANTEED), (3, 1, Pool.BEST_EFFORT), (0, 0, Pool.SHARED)],
)
def test_pool_from_max_and_min(cache_max: int, cache_min: int, pool: Pool) -> None:
    assert pool_for(cache_max, cache_min) is pool
    assert wl(cache_max=cache_max, cache_min=cache_min).pool is pool


@pytest.mark.parametrize(
    ("cache_max", "cache_min", "message"),
    [
        (4, 0, "cache max=4 with min=0 selects no pool"),
        (1, 2, "cache min=2 exceeds max=1"),
        (0, 3, "cache min=3 exceeds max=0"),
        (-1, 0, "cannot be negative (max=-1, min=0)"),
    ],
)
def test_combinations_that_select_no_pool_are_rejected(cache_max: int, cache_min: int, message: str) -> None:
    err = rejected(lambda: pool_for(cache_max, cache_min))
    assert err.reason is RejectReason.INVALID
    assert message in err.message


def test_pool_of_a_policy_workload_needs_resolution() -> None:
    w = wl(policy="gold")
    with pytest.raises(ValueError, match="must be resolved"):
        _ = w.pool
    assert resolve_workload(w, make_node()).pool is Pool.GUARANTEED


# -- request checks ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"all_cores": True}, "spec.coreIds and spec.allCores are mutually exclusive"),
        (
            {"core_ids": frozenset(), "reserved_core_ids": frozenset({1})},
            "reservedCoreIds needs spec.allCores",
        ),
        ({"core_ids": frozenset()}, "the workload has no CPUs"),
        ({"policy": "gold", "cache_max": 2, "cache_min": 2}, "policy 'gold' sets the cache ways"),
        (
            {"cache_max": 2, "cache_min": 2, "mba_percentage": 50, "mba_mbps": 100},
            "not both (percentage=50, mbps=100)",
        ),
        ({"cache_max": 33, "cache_min": 33}, "cache max must be an integer within 0..32, not 33"),
        ({"cache_max": 2, "cache_min": 2, "mba_percentage": 101}, "within 1..100, not 101"),
        ({"cache_max": 2, "cache_min": 2, "mba_mbps": 0}, "within 1..4294967290, not 0"),
        ({"cache_max": 2, "cache_min": 2, "mba_mbps": 4294967291}, "within 1..4294967290, not 4294967291"),
        (
            {"cache_max": 3, "cache_min": 1, "mba_percentage": 50},
            "MBA 50% needs guaranteed cache (max == min > 0); this workload asks for besteffort cache "
            "(max=3, min=1)",
        ),
        ({"mba_mbps": 500}, "MBA 500 MBps needs guaranteed cache"),
        ({"pstate_ratio": 0.0}, "P-state ratio must be a decimal number greater than 0 and less than 100"),
        ({"pstate_ratio": float("nan")}, "P-state ratio must be a decimal number greater than 0"),
        (
            {"pstate_ratio": 100.0},
            'less than 100 (a branch-miss threshold in per cent), such as "3.0", not 100.0',
        ),
        (
            {"pstate_ratio": 9999.9999},
            "P-state ratio must be a decimal number greater than 0 and less than 100",
        ),
    ],
)
def test_requests_no_node_can_meet_are_invalid(fields: dict[str, Any], message: str) -> None:
    err = rejected(lambda: resolve_workload(wl(**fields), make_node()))
    assert err.reason is RejectReason.INVALID
    assert message in err.message
    assert err.workload == "default/a"


def test_all_cores_minus_reserved() -> None:
    w = Workload("default", "all", all_cores=True, reserved_core_ids=frozenset({0, 1, 9}))
    r = resolve_workload(w, make_node())
    assert (r.core_ids, r.all_cores, r.resolved) == (frozenset({2, 3, 4, 5, 6, 7}), False, True)
    err = rejected(
        lambda: resolve_workload(dataclasses.replace(w, reserved_core_ids=frozenset(range(8))), make_node())
    )
    assert err.message == "allCores minus reservedCoreIds (0-7) leaves no CPUs (online: 0-7)"


def test_cpus_the_node_does_not_have_are_named() -> None:
    err = rejected(lambda: resolve_workload(wl(cores={6, 8, 9}), make_node()))
    assert (err.reason, err.message) == (
        RejectReason.INVALID,
        "CPUs 8-9 are not online on this node (online: 0-7)",
    )


# -- policies ------------------------------------------------------------------------------------------------


def test_policy_values_come_from_the_node_platform() -> None:
    assert (resolve_workload(wl(policy="gold"), make_node()).cache_max,) == (4,)
    broadwell = make_node(platform="broadwell", policies=PolicyBook().for_platform("broadwell"))
    r = resolve_workload(wl(policy="silver"), broadwell)
    assert (r.cache_max, r.cache_min, r.policy, r.pool) == (2, 1, "silver", Pool.BEST_EFFORT)


def test_unknown_policy_is_an_error_naming_the_known_ones() -> None:
    err = rejected(lambda: resolve_workload(wl(policy="platinum"), make_node()))
    assert err.reason is RejectReason.INVALID
    assert err.message == "unknown policy 'platinum': policies for platform skylake are bronze, gold, silver"


def test_policy_supplies_mba_and_pstate_unless_the_workload_sets_them() -> None:
    gold = Policy("gold", 2, 2, mba_percentage=60, pstate_ratio=2.0, pstate_monitoring="on")
    node = make_node(policies={"gold": gold})
    r = resolve_workload(wl(policy="gold"), node)
    assert (r.mba_percentage, r.pstate_ratio, r.pstate_monitoring) == (60, 2.0, "on")
    r = resolve_workload(wl(policy="gold", mba_percentage=30, pstate_ratio=1.0), node)
    assert (r.mba_percentage, r.pstate_ratio, r.pstate_monitoring) == (30, 1.0, "on")


def test_mba_with_a_non_guaranteed_policy_is_rejected_after_resolution() -> None:
    err = rejected(lambda: resolve_workload(wl(policy="silver", mba_percentage=50), make_node()))
    assert "needs guaranteed cache" in err.message and "max=3, min=1" in err.message


def test_resolution_is_idempotent() -> None:
    node = make_node()
    once = resolve_workload(wl(policy="gold", cores={1, 2}), node)
    assert resolve_workload(once, node) == once


# -- what the node can do ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node_changes", "fields", "message"),
    [
        (
            {},
            {"cache_max": 6, "cache_min": 6},
            "cache max=6 exceeds this node's guaranteed pool of 5 ways per L3 cache (each L3 cache of the "
            "workload's CPUs must give all 6): ask for at most 5",
        ),
        (
            {},
            {"cache_max": 6, "cache_min": 5},
            "cache min=5 exceeds this node's best-effort pool of 4 ways per L3 cache: ask for at most 4",
        ),
        (
            {"l3": dataclasses.replace(L3, min_cbm_bits=2)},
            {"cache_max": 1, "cache_min": 1},
            "cache max=1 is below this CPU's minimum of 2 ways per mask (min_cbm_bits)",
        ),
        (
            {"l3": dataclasses.replace(L3, min_cbm_bits=2)},
            {"cache_max": 3, "cache_min": 1},
            "cache min=1 is below this CPU's minimum of 2 ways",
        ),
        ({"pools": PoolConfig(shared=0)}, {"cache_max": 0, "cache_min": 0}, "shared cache pool has 0 ways"),
        ({"l3": None}, {"cache_max": 2, "cache_min": 2}, "no L3 cache allocation (no resctrl info/L3)"),
        (
            {"mba": None},
            {"cache_max": 2, "cache_min": 2, "mba_percentage": 50},
            "no memory bandwidth allocation",
        ),
        (
            {"mba": dataclasses.replace(MBA, mbps=True)},
            {"cache_max": 2, "cache_min": 2, "mba_percentage": 50},
            "mounted with mba_MBps: give MBA in MBps (rdt.mba.mbps), not as 50%",
        ),
        (
            {},
            {"cache_max": 2, "cache_min": 2, "mba_mbps": 900},
            "takes a percentage (rdt.mba.percentage), not 900 MBps",
        ),
        (
            {},
            {"cache_max": 2, "cache_min": 2, "mba_percentage": 5},
            "MBA 5% is below this node's minimum of 10% (info/MB/min_bandwidth)",
        ),
    ],
)
def test_requests_this_node_cannot_meet(
    node_changes: dict[str, Any], fields: dict[str, Any], message: str
) -> None:
    err = rejected(lambda: resolve_workload(wl(**fields), make_node(**node_changes)))
    assert err.reason is RejectReason.INVALID
    assert message in err.message


def test_shared_request_without_ways_is_fine_on_a_node_without_cat() -> None:
    # A P-state-only workload must not be refused just because the node has no RDT.
    r = resolve_workload(wl(pstate_ratio=2.0), make_node(l3=None, mba=None))
    assert r.pool is Pool.SHARED


def test_mbps_is_accepted_on_an_mbps_node() -> None:
    node = make_node(mba=dataclasses.replace(MBA, mbps=True))
    assert resolve_workload(wl(cache_max=2, cache_min=2, mba_mbps=2000), node).mba == 2000


# -- conflicts with other workloads --------------------------------------------------------------------------


def test_cpu_conflicts_name_the_cpu_and_the_holder() -> None:
    node = make_node()
    a = wl("a", cores={5, 6, 7}, cache_max=2, cache_min=2)
    err = rejected(lambda: validate_workload(wl("b", cores={2, 6}), node, [a]))
    assert (err.reason, err.message, err.workload) == (
        RejectReason.CONFLICT,
        "CPU 6 is already assigned to workload default/a",
        "default/b",
    )
    err = rejected(lambda: validate_workload(wl("b", cores={6, 7}), node, [a]))
    assert err.message == err.detail == "CPUs 6-7 are already assigned to workload default/a"


def test_a_conflict_names_no_workload_of_another_namespace() -> None:
    """Whoever may read team-b's workload reads the message; only the detail (the agent's log) names the
    holder in another namespace."""
    node = make_node()
    held = Workload("default", "overlap-a", core_ids=frozenset({5, 6}))
    err = rejected(lambda: validate_workload(Workload("team-b", "b", core_ids=frozenset({6})), node, [held]))
    assert (err.reason, err.workload) == (RejectReason.CONFLICT, "team-b/b")
    assert str(err) == err.message
    assert err.message == (
        "CPU 6 is already assigned to a workload in another namespace (an administrator finds it in this "
        "node's RmdNodeState)"
    )
    assert "default" not in err.message and "overlap-a" not in err.message
    assert err.detail == "CPU 6 is already assigned to workload default/overlap-a"
    keyed = WorkloadRejected(RejectReason.CONFLICT, "shown", detail="logged").for_workload("team-b/b")
    assert (keyed.message, keyed.detail, keyed.workload) == ("shown", "logged", "team-b/b")


def test_conflicts_ignore_the_workload_itself_and_unresolvable_others() -> None:
    node = make_node()
    a = wl("a", cores={5, 6})
    assert validate_workload(dataclasses.replace(a, core_ids=frozenset({6, 7})), node, [a]).core_ids == {6, 7}
    broken = wl("broken", cores={2, 99})  # CPU 99 does not exist here: it holds nothing
    assert validate_workload(wl("b", cores={2}), node, [broken]).core_ids == {2}
    everything = Workload("default", "all", all_cores=True)
    err = rejected(lambda: validate_workload(wl("b", cores={3}), node, [everything]))
    assert err.message == "CPU 3 is already assigned to workload default/all"
