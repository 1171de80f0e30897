"""Agent heartbeats (issue #13 item 1): the Lease the agent writes (rmd_agent.heartbeat.renewed_lease) and the
operator's side (rmd_operator.heartbeats): which renewals count, when one is overdue on the operator's clock,
and how an expired heartbeat marks the RmdNodeState, through a fake API. The real API server and real agent
processes are in tests/e2e/test_system.py (kill -9 of an agent) and tests/e2e/test_node_state.py."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from rmd_agent.heartbeat import micro_time, renewed_lease
from rmd_api.node_state import HEARTBEAT_EXPIRED, LEASE_LABEL, lease_duration_seconds, lease_name
from rmd_operator.heartbeats import (
    AgentLiveness,
    HeartbeatMonitor,
    Renewal,
    Seen,
    not_ready_patch,
    read_renewal,
)

Obj = dict[str, Any]
NS = "rmd-system"
NOW = datetime(2026, 11, 25, 21, 0, 0, 123456, tzinfo=UTC)


def lease(
    node: str, holder: str = "pod_1", renew: str = "t1", duration: Any = 13, namespace: str = NS
) -> Obj:
    spec = {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": duration}
    return {"metadata": {"name": lease_name(node), "namespace": namespace}, "spec": spec}


def node_state(ready: str = "True", version: str = "7") -> Obj:
    conditions = [
        {"type": "Other", "status": "True", "reason": "X", "message": "kept"},
        {"type": "Ready", "status": ready, "reason": "AgentReady", "message": "fine"},
    ]
    return {"metadata": {"resourceVersion": version}, "status": {"conditions": conditions}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the agent's Lease -------------------------------------------------------------------------------------


def test_the_agent_creates_renews_and_takes_over_its_lease() -> None:
    args = {"node": "n1", "namespace": NS, "identity": "pod_a", "duration": 13}
    first = renewed_lease(None, **args, now="t0")
    assert first["metadata"] == {
        "name": "rmd-agent-n1",
        "namespace": NS,
        "labels": {LEASE_LABEL: "rmd-agent"},
    }
    assert first["spec"] == {
        "holderIdentity": "pod_a",
        "leaseDurationSeconds": 13,
        "acquireTime": "t0",
        "renewTime": "t0",
        "leaseTransitions": 0,
    }
    stored = {**first, "metadata": {**first["metadata"], "resourceVersion": "5"}}
    renewed = renewed_lease(copy.deepcopy(stored), **args, now="t1")
    assert renewed["metadata"]["resourceVersion"] == "5"  # the write is conditional on what was read
    assert renewed["spec"]["renewTime"] == "t1" and renewed["spec"]["acquireTime"] == "t0"
    assert renewed["spec"]["leaseTransitions"] == 0
    restarted = renewed_lease(renewed, **{**args, "identity": "pod_b"}, now="t2")
    assert restarted["spec"]["holderIdentity"] == "pod_b"
    assert restarted["spec"]["acquireTime"] == "t2" and restarted["spec"]["leaseTransitions"] == 1


def test_lease_time_is_microtime_in_utc() -> None:
    assert micro_time(NOW) == "2026-11-25T21:00:00.123456Z"


@pytest.mark.parametrize(("renew", "duration"), [(5.0, 13), (10.0, 25), (1.0, 3), (0.2, 1)])
def test_a_lease_lasts_two_and_a_half_renewals(renew: float, duration: int) -> None:
    assert lease_duration_seconds(renew) == duration


# -- the operator's bookkeeping ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"holderIdentity": "", "renewTime": "t", "leaseDurationSeconds": 13},
        {"holderIdentity": "h", "renewTime": None, "leaseDurationSeconds": 13},
        {"holderIdentity": "h", "renewTime": "t", "leaseDurationSeconds": 0},
        {"holderIdentity": "h", "renewTime": "t", "leaseDurationSeconds": -5},
        {"holderIdentity": "h", "renewTime": "t", "leaseDurationSeconds": True},
        {"holderIdentity": "h", "renewTime": "t", "leaseDurationSeconds": "13"},
        {"holderIdentity": "h", "renewTime": "t", "leaseDurationSeconds": 86400},
    ],
)
def test_malformed_leases_are_not_heartbeats(spec: Obj) -> None:
    assert read_renewal({"spec": spec}) is None


def test_renewals_restarts_and_expiry_on_the_operators_clock() -> None:
    clock = Clock()
    monitor = HeartbeatMonitor(clock)
    assert monitor.observe("n1", Renewal("a", "t1", 13)) is Seen.NEW
    assert monitor.observe("n1", Renewal("a", "t1", 13)) is Seen.SAME
    assert monitor.next_deadline() == 113.0
    clock.now = 110.0
    assert monitor.observe("n1", Renewal("a", "t2", 13)) is Seen.RENEWED
    clock.now = 122.9
    assert monitor.expired() == []
    clock.now = 123.0
    assert monitor.expired() == ["n1"]
    monitor.handled("n1")
    assert monitor.expired() == [] and monitor.next_deadline() is None
    assert monitor.observe("n1", Renewal("b", "t3", 13)) is Seen.RESTARTED
    assert monitor.expired() == []  # a new start counts as a renewal
    monitor.forget("n1")
    assert monitor.observe("n1", Renewal("b", "t3", 13)) is Seen.NEW


def test_the_ready_condition_is_replaced_only_when_true() -> None:
    patch = not_ready_patch(node_state(), "gone quiet", NOW)
    assert patch is not None
    assert patch["metadata"] == {"resourceVersion": "7"}
    other, ready = patch["status"]["conditions"]
    assert other["type"] == "Other" and other["message"] == "kept"
    assert ready == {
        "type": "Ready",
        "status": "False",
        "reason": HEARTBEAT_EXPIRED,
        "message": "gone quiet",
        "lastTransitionTime": "2026-11-25T21:00:00Z",
    }
    assert not_ready_patch(node_state("False"), "gone quiet", NOW) is None  # AgentStopped etc. stand
    assert not_ready_patch({"status": {}}, "gone quiet", NOW) is None


# -- the operator's marking, through a fake API --------------------------------------------------------------


class FakeApi:
    def __init__(self) -> None:
        self.leases: dict[str, Obj] = {}
        self.states: dict[str, Obj] = {}
        self.patches: list[tuple[str, Obj]] = []
        self.conflicts = 0
        self.failures = 0

    async def read_lease(self, name: str) -> Obj | None:
        if self.failures:
            self.failures -= 1
            raise OSError("connection refused")
        return copy.deepcopy(self.leases.get(name))

    async def read_node_state(self, node: str) -> Obj | None:
        return copy.deepcopy(self.states.get(node))

    async def patch_node_state_status(self, node: str, patch: Obj) -> bool:
        if self.conflicts:
            self.conflicts -= 1
            return False
        self.patches.append((node, patch))
        self.states[node]["status"] = patch["status"]
        return True


def liveness(api: FakeApi, clock: Clock) -> AgentLiveness:
    return AgentLiveness(api, NS, clock=clock, wall_clock=lambda: NOW)


async def test_an_expired_heartbeat_marks_the_node_not_ready_once() -> None:
    api, clock = FakeApi(), Clock()
    live = liveness(api, clock)
    api.leases["rmd-agent-n1"] = lease("n1")
    api.states["n1"] = node_state()
    assert live.lease_changed("ADDED", lease("n1")) == ("n1", Seen.NEW)
    clock.now += 12.9
    await live.check()
    assert api.patches == []
    clock.now += 0.1
    await live.check()
    ((node, patch),) = api.patches
    ready = patch["status"]["conditions"][-1]
    assert node == "n1" and ready["reason"] == HEARTBEAT_EXPIRED
    assert "rmd-system/rmd-agent-n1" in ready["message"] and "13s" in ready["message"]
    await live.check()
    assert len(api.patches) == 1 and live.marked == 1


async def test_a_renewal_the_watch_missed_is_found_before_marking() -> None:
    api, clock = FakeApi(), Clock()
    live = liveness(api, clock)
    api.states["n1"] = node_state()
    live.lease_changed("ADDED", lease("n1", renew="t1"))
    api.leases["rmd-agent-n1"] = lease("n1", renew="t2")  # renewed; the event has not arrived
    clock.now += 20
    await live.check()
    assert api.patches == []
    clock.now += 12
    await live.check()
    assert api.patches == []  # the deadline moved with the renewal found
    clock.now += 1
    await live.check()
    assert len(api.patches) == 1


async def test_failures_and_conflicts_are_retried_and_a_not_ready_node_is_left_alone() -> None:
    api, clock = FakeApi(), Clock()
    live = liveness(api, clock)
    api.leases["rmd-agent-n1"] = lease("n1")
    api.states["n1"] = node_state()
    live.lease_changed("ADDED", lease("n1"))
    clock.now += 13
    api.failures, api.conflicts = 1, 1
    await live.check()  # the API is down
    assert api.patches == []
    await live.check()  # too soon to try again
    assert api.patches == [] and api.failures == 0
    clock.now += 1
    await live.check()  # the object changed meanwhile
    assert api.patches == [] and api.conflicts == 0
    clock.now += 1
    await live.check()
    assert len(api.patches) == 1

    api.leases["rmd-agent-n2"] = lease("n2")
    api.states["n2"] = node_state("False")  # the agent stopped cleanly: its own reason stands
    live.lease_changed("ADDED", lease("n2"))
    clock.now += 13
    await live.check()
    assert [n for n, _ in api.patches] == ["n1"]
    assert live.monitor.expired() == []


def test_other_leases_and_deletions_are_not_tracked() -> None:
    live = liveness(FakeApi(), Clock())
    assert live.lease_changed("ADDED", {"metadata": {"name": "kube-scheduler", "namespace": NS}}) is None
    assert live.lease_changed("ADDED", lease("n1", namespace="elsewhere")) is None
    assert live.lease_changed("ADDED", lease("n1", duration=0)) is None
    assert live.lease_changed("ADDED", lease("n1")) == ("n1", Seen.NEW)
    assert live.lease_changed("DELETED", lease("n1")) is None
    assert live.monitor.beat("n1") is None
