"""Protobuf <-> engine types of the agent's gRPC API (rmd_agent.server.convert)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmd_agent.engine_api import (
    AppliedWorkload,
    CacheDomainSummary,
    ContainerCpus,
    CpuState,
    NodeSummary,
    PstateOutcome,
)
from rmd_agent.plan.mba import MbaApplied
from rmd_agent.plan.pstate_request import pstate_request
from rmd_agent.plan.workload import RejectReason, Workload, WorkloadRejected
from rmd_agent.server import convert
from rmd_api.agent.v1 import agent_pb2
from rmd_api.workload_spec import parse_spec, resource_fields


def _request(
    spec: agent_pb2.WorkloadSpec, namespace: str = "ns", name: str = "w", uid: str = "u1"
) -> agent_pb2.ApplyWorkloadRequest:
    return agent_pb2.ApplyWorkloadRequest(
        ref=agent_pb2.WorkloadRef(namespace=namespace, name=name, uid=uid), spec=spec
    )


def test_cache_request_with_core_lists() -> None:
    spec = agent_pb2.WorkloadSpec(core_ids=["0-2", "6"], cache=agent_pb2.CacheRequest(max=2, min=2))
    w = convert.workload_from_request(_request(spec))
    assert (w.namespace, w.name, w.uid) == ("ns", "w", "u1")
    assert w.core_ids == {0, 1, 2, 6}
    assert (w.cache_max, w.cache_min) == (2, 2)
    assert w.mba is None and w.policy is None and w.pstate_ratio is None and w.pstate_monitoring is None


def test_absent_cache_differs_from_zero_cache() -> None:
    absent = convert.workload_from_request(_request(agent_pb2.WorkloadSpec(core_ids=["1"])))
    zero = convert.workload_from_request(
        _request(agent_pb2.WorkloadSpec(core_ids=["1"], cache=agent_pb2.CacheRequest()))
    )
    assert (absent.cache_max, absent.cache_min) == (None, None)
    assert (zero.cache_max, zero.cache_min) == (0, 0)


def test_all_cores_with_reserved_cores_policy_and_pstate() -> None:
    spec = agent_pb2.WorkloadSpec(
        all_cores=True,
        reserved_core_ids=["0-1"],
        policy="gold",
        pstate=agent_pb2.PstateRequest(ratio=3.5, monitoring=True),
    )
    w = convert.workload_from_request(_request(spec))
    assert w.all_cores and w.reserved_core_ids == {0, 1} and not w.core_ids
    assert w.policy == "gold"
    assert (w.pstate_ratio, w.pstate_monitoring) == (3.5, "on")


def test_pstate_without_ratio_is_monitoring_only() -> None:
    spec = agent_pb2.WorkloadSpec(core_ids=["3"], pstate=agent_pb2.PstateRequest(monitoring=False))
    w = convert.workload_from_request(_request(spec))
    assert (w.pstate_ratio, w.pstate_monitoring) == (None, "off")


def test_a_ratio_alone_is_monitored_as_the_docs_say() -> None:
    """A spec with only a ratio, through the operator's codec to the agent: monitoring is left to the agent's
    default (on), not sent as "off" (a plain proto3 bool could not tell unset from false)."""
    spec = parse_spec({"coreIds": ["3"], "plugins": {"pstate": {"ratio": "3.0"}}})
    w = convert.workload_from_request(_request(agent_pb2.WorkloadSpec.FromString(spec.SerializeToString())))
    assert (w.pstate_ratio, w.pstate_monitoring) == (3.0, None)
    assert pstate_request(w) == (3.0, True)
    assert resource_fields(spec)["plugins"]["pstate"]["monitoring"] == "on"


@pytest.mark.parametrize(
    ("mba", "expected"),
    [
        (agent_pb2.MbaRequest(percentage=50), (50, None)),
        (agent_pb2.MbaRequest(mbps=2000), (None, 2000)),
        (agent_pb2.MbaRequest(), (None, None)),  # the oneof unset: no MBA request
    ],
)
def test_mba_oneof(mba: agent_pb2.MbaRequest, expected: tuple[int | None, int | None]) -> None:
    spec = agent_pb2.WorkloadSpec(core_ids=["1"], cache=agent_pb2.CacheRequest(max=2, min=2), mba=mba)
    w = convert.workload_from_request(_request(spec))
    assert (w.mba_percentage, w.mba_mbps) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (agent_pb2.WorkloadSpec(), "no CPUs"),
        (agent_pb2.WorkloadSpec(core_ids=["x"]), "spec.coreIds[0]"),
        (agent_pb2.WorkloadSpec(core_ids=["1"], cache=agent_pb2.CacheRequest(max=3, min=0)), "min=0"),
        (
            agent_pb2.WorkloadSpec(
                core_ids=["1"],
                cache=agent_pb2.CacheRequest(max=2, min=2),
                mba=agent_pb2.MbaRequest(percentage=0),
            ),
            "within 1..100",
        ),
        (
            agent_pb2.WorkloadSpec(core_ids=["1"], policy="gold", cache=agent_pb2.CacheRequest(max=2, min=2)),
            "policy",
        ),
        (
            agent_pb2.WorkloadSpec(core_ids=["1"], pstate=agent_pb2.PstateRequest(ratio=9999.9999)),
            "P-state ratio must be a decimal number greater than 0 and less than 100",
        ),
        (
            agent_pb2.WorkloadSpec(core_ids=["1"], cache=agent_pb2.CacheRequest(max=64, min=64)),
            "cache max must be an integer within 0..32, not 64",
        ),
    ],
)
def test_malformed_spec_is_invalid_and_names_the_workload(spec: agent_pb2.WorkloadSpec, message: str) -> None:
    with pytest.raises(WorkloadRejected) as caught:
        convert.workload_from_request(_request(spec, "team", "db"))
    assert caught.value.reason is RejectReason.INVALID
    assert message in caught.value.message
    assert caught.value.workload == "team/db"


@pytest.mark.parametrize(
    ("namespace", "name", "missing"), [("", "w", "ref.namespace"), ("ns", "", "ref.name")]
)
def test_request_without_ref_is_invalid(namespace: str, name: str, missing: str) -> None:
    with pytest.raises(WorkloadRejected, match=re.escape(missing)) as caught:
        convert.workload_from_request(_request(agent_pb2.WorkloadSpec(core_ids=["1"]), namespace, name))
    assert caught.value.reason is RejectReason.INVALID


def test_remove_ref_allows_an_empty_uid_but_not_an_empty_name() -> None:
    req = agent_pb2.RemoveWorkloadRequest(ref=agent_pb2.WorkloadRef(namespace="ns", name="w"))
    assert convert.remove_ref(req) == ("ns", "w", "")
    with pytest.raises(convert.InvalidRequest, match=r"ref\.name"):
        convert.remove_ref(agent_pb2.RemoveWorkloadRequest(ref=agent_pb2.WorkloadRef(namespace="ns")))


def test_container_ref_requires_pod_and_container() -> None:
    req = agent_pb2.GetContainerCpusRequest(pod_namespace="ns", pod_name="p", pod_uid="u", container="c")
    assert convert.container_ref(req) == ("ns", "p", "u", "c")
    with pytest.raises(convert.InvalidRequest, match="pod_name, container"):
        convert.container_ref(agent_pb2.GetContainerCpusRequest(pod_namespace="ns"))


# -- round trip: what the agent answers with can be sent back and means the same ---------------------------

_cpu_sets = st.frozensets(st.integers(0, 63), min_size=1, max_size=8)


@st.composite
def _workloads(draw: st.DrawFn) -> Workload:
    all_cores = draw(st.booleans())
    policy = draw(st.sampled_from([None, "gold", "silver"]))
    cache = None if policy else draw(st.sampled_from([None, (0, 0), (2, 2), (4, 1)]))
    mba_pct, mba_mbps = None, None
    if cache == (2, 2):
        mba_pct, mba_mbps = draw(st.sampled_from([(None, None), (40, None), (None, 3000)]))
    pstate = draw(st.sampled_from([(None, None), (2.5, "on"), (None, "off"), (1.0, "off"), (3.0, None)]))
    return Workload(
        namespace="ns",
        name=draw(st.text("abcdef-", min_size=1, max_size=8)),
        uid=draw(st.sampled_from(["", "uid-1"])),
        core_ids=frozenset() if all_cores else draw(_cpu_sets),
        all_cores=all_cores,
        reserved_core_ids=draw(st.frozensets(st.integers(0, 63), max_size=3)) if all_cores else frozenset(),
        cache_max=cache[0] if cache else None,
        cache_min=cache[1] if cache else None,
        mba_percentage=mba_pct,
        mba_mbps=mba_mbps,
        policy=policy,
        pstate_ratio=pstate[0],
        pstate_monitoring=pstate[1],
    )


@given(_workloads())
def test_spec_message_round_trips(w: Workload) -> None:
    request = agent_pb2.ApplyWorkloadRequest(
        ref=agent_pb2.WorkloadRef(namespace=w.namespace, name=w.name, uid=w.uid), spec=convert.spec_message(w)
    )
    assert convert.workload_from_request(request) == w


# -- responses -----------------------------------------------------------------------------------------------


def test_workload_message() -> None:
    w = Workload("ns", "w", "u1", core_ids=frozenset({7, 2, 3}), cache_max=2, cache_min=2, mba_percentage=50)
    applied = AppliedWorkload(
        workload=w,
        id="w-1",
        cos_name="rmd-ns-w",
        pool="guaranteed",
        cache={1: 0x0C0, 0: 0x3},
        mba={0: 50, 1: 50},
        pstate=PstateOutcome(False, "no cpufreq"),
    )
    m = convert.workload_message(applied)
    assert (m.ref.namespace, m.ref.name, m.ref.uid) == ("ns", "w", "u1")
    assert list(m.cpus) == [2, 3, 7]
    assert list(m.spec.core_ids) == ["2-3,7"]
    assert (m.id, m.cos_name, m.pool, m.status) == ("w-1", "rmd-ns-w", "guaranteed", "Successful")
    assert [(c.cache_id, c.mask, c.ways) for c in m.cache] == [(0, "3", 2), (1, "c0", 2)]
    assert dict(m.mba) == {0: 50, 1: 50}
    assert m.HasField("pstate") and not m.pstate.supported and m.pstate.detail == "no cpufreq"


def test_workload_message_carries_the_mba_value_the_node_holds() -> None:
    """#13 item 5: the applied (rounded) value travels with the requested one."""
    w = Workload("ns", "w", core_ids=frozenset({1}), cache_max=2, cache_min=2, mba_percentage=15)
    held = MbaApplied(requested=15, value=20, mbps=False, step=10)
    m = convert.workload_message(AppliedWorkload(w, "id", "g", "guaranteed", mba={0: 20}, mba_applied=held))
    assert m.spec.mba.percentage == 15
    assert (m.mba_applied.value, m.mba_applied.rounded) == (20, True)
    assert m.mba_applied.detail == "MBA 15% rounded up to 20%: the node's MBA step (bandwidth_gran) is 10%"
    shared = AppliedWorkload(Workload("ns", "p", core_ids=frozenset({1})), "id", "", "shared")
    assert not convert.workload_message(shared).HasField("mba_applied")


def test_workload_message_without_pstate_has_no_pstate() -> None:
    applied = AppliedWorkload(Workload("ns", "w", core_ids=frozenset({1})), "id", "", "shared")
    m = convert.workload_message(applied)
    assert not m.HasField("pstate") and not m.spec.HasField("cache") and not m.cache


def test_node_message() -> None:
    node = NodeSummary(
        node_name="n1",
        capabilities={"rdtL3Cat": (True, "11 ways"), "mba": (False, "no info/MB")},
        cpus=8,
        numa_nodes=2,
        caches=(
            CacheDomainSummary(1, frozenset({4, 5, 6, 7}), 11, {"guaranteed": 3, "shared": 2}),
            CacheDomainSummary(0, frozenset({0, 1, 2, 3}), 11, {"guaranteed": 5}),
        ),
        closids_total=16,
        closids_used=3,
        workloads=2,
    )
    m = convert.node_message(node)
    assert m.node_name == "n1" and (m.cpus, m.numa_nodes) == (8, 2)
    assert {k: (v.supported, v.detail) for k, v in m.capabilities.items()} == node.capabilities
    assert [(c.cache_id, c.cpus, c.ways, dict(c.free_ways)) for c in m.caches] == [
        (0, "0-3", 11, {"guaranteed": 5}),
        (1, "4-7", 11, {"guaranteed": 3, "shared": 2}),
    ]
    assert (m.closids_total, m.closids_used, m.workloads) == (16, 3, 2)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (CpuState.ALLOCATED, agent_pb2.GetContainerCpusResponse.ALLOCATED),
        (CpuState.NOT_YET_ALLOCATED, agent_pb2.GetContainerCpusResponse.NOT_YET_ALLOCATED),
        (CpuState.NOT_EXCLUSIVE, agent_pb2.GetContainerCpusResponse.NOT_EXCLUSIVE),
    ],
)
def test_container_cpus_message(state: CpuState, expected: int) -> None:
    m = convert.container_cpus_message(ContainerCpus(state, frozenset({5, 4}), "why"))
    assert (m.state, list(m.cpus), m.detail) == (expected, [4, 5], "why")
