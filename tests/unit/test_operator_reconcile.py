"""The reconcile passes with fake agents, a fake status sink and a controlled clock (no network, no kopf)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from rmd_api.agent.v1 import agent_pb2
from rmd_operator import status as st
from rmd_operator.agent_client import CallFailure
from rmd_operator.errors import RetryLater
from rmd_operator.reconcile import Reconciler
from rmd_operator.settings import OperatorSettings
from rmd_operator.targets import Capability, Cluster, NodeAgent

RDT = {"rdtL3Cat": Capability(True, "11 ways"), "mba": Capability(True)}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeAgents:
    """Agents by node: what each holds, which are down, and every call made."""

    def __init__(self) -> None:
        self.held: dict[str, dict[tuple[str, str], agent_pb2.Workload]] = {}
        self.down: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self.mba: dict[str, agent_pb2.MbaApplied] = {}  # node -> the MBA value it reports holding

    def _check(self, method: str, node: str) -> dict[tuple[str, str], agent_pb2.Workload]:
        self.calls.append((method, node))
        if node in self.down:
            raise CallFailure("UNAVAILABLE", "failed to connect to all addresses")
        return self.held.setdefault(node, {})

    async def apply(
        self, node: str, endpoint: str, ref: agent_pb2.WorkloadRef, spec: agent_pb2.WorkloadSpec
    ) -> tuple[agent_pb2.Workload, bool]:
        held = self._check("apply", node)
        w = agent_pb2.Workload(ref=ref, spec=spec, id="1", cos_name="COS2", status="Successful", cpus=[1])
        if node in self.mba:
            w.mba_applied.CopyFrom(self.mba[node])
        changed = held.get((ref.namespace, ref.name)) != w
        held[(ref.namespace, ref.name)] = w
        return w, changed

    async def remove(self, node: str, endpoint: str, ref: agent_pb2.WorkloadRef) -> bool:
        held = self._check("remove", node)
        w = held.get((ref.namespace, ref.name))
        if w is None or (ref.uid and w.ref.uid != ref.uid):
            return False
        del held[(ref.namespace, ref.name)]
        return True

    async def list_workloads(self, node: str, endpoint: str) -> Sequence[agent_pb2.Workload]:
        return list(self._check("list", node).values())

    def forget(self, node: str) -> None:
        pass

    async def refresh_credentials(self) -> bool:
        return False

    def count(self, method: str, node: str) -> int:
        return self.calls.count((method, node))


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = value


class Sink:
    """Applies status patches to the objects (by name), as the API server would."""

    def __init__(self, *bodies: dict[str, Any]) -> None:
        self.bodies = {b["metadata"]["name"]: b for b in bodies}
        self.patches: list[Mapping[str, Any]] = []

    async def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        self.patches.append(patch)
        merge(self.bodies[name].setdefault("status", {}), patch["status"])
        return True


def body(nodes: list[str], generation: int = 1, uid: str = "uid-1", name: str = "w") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid, "generation": generation},
        "spec": {"coreIds": ["1"], "rdt": {"cache": {"max": 2, "min": 2}}, "nodes": nodes},
    }


def cluster(*nodes: str, **overrides: NodeAgent) -> Cluster:
    agents = {n: NodeAgent(n, f"10.0.0.{i}:50051", RDT, True) for i, n in enumerate(nodes)}
    agents.update(overrides)
    return Cluster({n: {} for n in nodes}, agents)


@pytest.fixture
def world() -> tuple[Clock, FakeAgents, list[st.EventText]]:
    return Clock(), FakeAgents(), []


def reconciler(
    world: tuple[Clock, FakeAgents, list[st.EventText]], sink: Sink, **settings: Any
) -> Reconciler:
    clock, agents, events = world
    s = OperatorSettings(
        retry_initial_seconds=1.0, retry_max_seconds=8.0, drift_interval_seconds=30.0, **settings
    )
    return Reconciler(s, agents=agents, status_sink=sink, events=lambda _b, e: events.append(e), clock=clock)


def states(obj: Mapping[str, Any]) -> dict[str, str]:
    return {n: e["status"] for n, e in obj["status"]["workloadStates"].items()}


async def test_applies_on_targets_and_writes_status_once(world: Any) -> None:
    _, agents, events = world
    obj = body(["a", "b"])
    sink = Sink(obj)
    r = reconciler(world, sink)
    delay = await r.reconcile(obj, cluster("a", "b"))
    assert states(obj) == {"a": "Successful", "b": "Successful"}
    assert obj["status"]["summary"] == "2/2 Successful"
    assert [e.reason for e in events] == ["Applied", "Applied"]
    assert delay == pytest.approx(30.0)  # the next drift check
    await r.reconcile(obj, cluster("a", "b"))
    assert len(sink.patches) == 1  # nothing changed: nothing written
    assert agents.count("apply", "a") == 1


async def test_unreachable_node_waits_for_its_backoff_without_holding_others(world: Any) -> None:
    clock, agents, events = world
    agents.down.add("a")
    obj = body(["a", "b"])
    r = reconciler(world, Sink(obj))
    delay = await r.reconcile(obj, cluster("a", "b"))
    assert states(obj) == {"a": "Pending", "b": "Successful"}
    assert delay == pytest.approx(1.0)
    clock.now += 0.5
    await r.reconcile(obj, cluster("a", "b"))
    assert agents.count("apply", "a") == 1  # still backing off
    clock.now += 0.5
    await r.reconcile(obj, cluster("a", "b"))
    assert agents.count("apply", "a") == 2
    assert r.backoff.failures("a") == 2
    agents.down.clear()
    clock.now += 2.0
    await r.reconcile(obj, cluster("a", "b"))
    assert states(obj) == {"a": "Successful", "b": "Successful"}
    assert [e.reason for e in events if "node a" in e.message] == ["AgentUnreachable", "Recovered"]


async def test_node_leaving_the_spec_is_removed_and_its_entry_dropped(world: Any) -> None:
    _, agents, events = world
    obj = body(["a", "b"])
    sink = Sink(obj)
    r = reconciler(world, sink)
    await r.reconcile(obj, cluster("a", "b"))
    obj["spec"]["nodes"] = ["a"]
    obj["metadata"]["generation"] = 2
    await r.reconcile(obj, cluster("a", "b"))
    assert states(obj) == {"a": "Successful"}
    assert agents.held["b"] == {}
    assert sink.patches[-1]["status"]["workloadStates"]["b"] is None
    assert events[-1].reason == "Removed"


async def test_removal_from_an_unreachable_node_keeps_a_pending_entry(world: Any) -> None:
    clock, agents, _ = world
    obj = body(["a", "b"])
    r = reconciler(world, Sink(obj))
    await r.reconcile(obj, cluster("a", "b"))
    obj["spec"]["nodes"] = ["a"]
    agents.down.add("b")
    await r.reconcile(obj, cluster("a", "b"))
    assert states(obj) == {"a": "Successful", "b": "Pending"}
    assert "no longer a target" in obj["status"]["workloadStates"]["b"]["response"]
    agents.down.clear()
    clock.now += 1.0
    await r.reconcile(obj, cluster("a", "b"))
    assert states(obj) == {"a": "Successful"}


async def test_drift_checks_share_one_list_per_node_and_reapply_what_is_missing(world: Any) -> None:
    clock, agents, events = world
    one, two = body(["a"], uid="u1", name="one"), body(["a"], uid="u2", name="two")
    r = reconciler(world, Sink(one, two))
    await r.reconcile(one, cluster("a"))
    await r.reconcile(two, cluster("a"))
    clock.now += 30.0
    del agents.held["a"][("ns", "two")]
    await r.reconcile(two, cluster("a"))
    await r.reconcile(one, cluster("a"))
    assert agents.count("list", "a") == 1  # the second check used the same answer
    assert agents.count("apply", "a") == 3  # one, two, and two again
    assert ("ns", "two") in agents.held["a"]
    assert [e.reason for e in events].count("DriftRepaired") == 1


async def test_a_rounded_mba_value_is_in_the_status_and_in_one_event_per_node(world: Any) -> None:
    """#13 item 5: 15% on a node with a 10% step holds 20%; the status and a Normal Event say so."""
    clock, agents, events = world
    rounded = "MBA 15% rounded up to 20%: the node's MBA step (bandwidth_gran) is 10%"
    agents.mba["a"] = agent_pb2.MbaApplied(value=20, rounded=True, detail=rounded)
    agents.mba["b"] = agent_pb2.MbaApplied(value=15)  # a node whose step divides 15
    obj = body(["a", "b"])
    obj["spec"]["rdt"]["mba"] = {"percentage": 15}
    r = reconciler(world, Sink(obj))
    await r.reconcile(obj, cluster("a", "b"))
    mba = {node: e["rdt"]["mba"] for node, e in obj["status"]["workloadStates"].items()}
    assert mba["a"] == {"percentage": 15, "applied": 20, "rounded": True, "message": rounded}
    assert mba["b"] == {"percentage": 15, "applied": 15, "rounded": False}
    assert sorted(e.reason for e in events) == ["Applied", "Applied", "MbaRounded"]
    assert all(e.type == "Normal" for e in events)
    first = next(e for e in events if e.reason == "MbaRounded")
    assert first.message == f"node a: {rounded}" and first.once
    clock.now += 30.0
    del agents.held["a"][("ns", "w")]
    await r.reconcile(obj, cluster("a", "b"))  # re-applied: the same Event again, kept once by its name
    assert [e.reason for e in events[3:]] == ["DriftRepaired", "MbaRounded"]
    assert events[-1].once == first.once


async def test_capacity_rejection_is_retried_at_the_drift_interval_invalid_is_not(world: Any) -> None:
    clock, agents, _ = world
    obj = body(["a"])
    r = reconciler(world, Sink(obj))
    failures = [CallFailure("RESOURCE_EXHAUSTED", "no ways left")]

    async def apply(*args: Any) -> tuple[agent_pb2.Workload, bool]:
        agents.calls.append(("apply", args[0]))
        raise failures[0]

    agents.apply = apply
    await r.reconcile(obj, cluster("a"))
    assert obj["status"]["workloadStates"]["a"] == {
        "status": "Failed",
        "response": "Fail: no ways left",
        "reason": "Rejected",
    }
    clock.now += 10
    await r.reconcile(obj, cluster("a"))
    assert agents.count("apply", "a") == 1
    clock.now += 20
    failures[0] = CallFailure("INVALID_ARGUMENT", "cpu 1 offline")
    await r.reconcile(obj, cluster("a"))
    assert agents.count("apply", "a") == 2
    # The status says which of the two it is (the pod flow deletes pods for the retried kind only).
    assert obj["status"]["workloadStates"]["a"]["reason"] == "Unsatisfiable"
    clock.now += 300
    await r.reconcile(obj, cluster("a"))
    assert agents.count("apply", "a") == 2  # an invalid request waits for a change


async def test_applied_workload_stays_successful_while_its_agent_is_not_ready(world: Any) -> None:
    _, agents, events = world
    obj = body(["a"])
    r = reconciler(world, Sink(obj))
    await r.reconcile(obj, cluster("a"))
    stopped = NodeAgent("a", "10.0.0.0:50051", RDT, False, "AgentStopped")
    await r.reconcile(obj, cluster("a", a=stopped))
    assert states(obj) == {"a": "Successful"}
    obj["metadata"]["generation"] = 2
    await r.reconcile(obj, cluster("a", a=stopped))
    assert states(obj) == {"a": "Pending"}
    assert events[-1].reason == "AgentNotReady"
    assert agents.count("apply", "a") == 1


async def test_finalize_removes_from_status_nodes_and_from_agents_that_list_it(world: Any) -> None:
    _, agents, _ = world
    obj = body(["a"])
    r = reconciler(world, Sink(obj))
    await r.reconcile(obj, cluster("a", "b", "c"))
    agents.held["c"] = {
        ("ns", "w"): agent_pb2.Workload(ref=agent_pb2.WorkloadRef(namespace="ns", name="w", uid="uid-1"))
    }
    agents.held["b"] = {
        ("ns", "w"): agent_pb2.Workload(ref=agent_pb2.WorkloadRef(namespace="ns", name="w", uid="older"))
    }
    fresh = reconciler(world, Sink(obj))  # after a restart: it knows only what the object says
    await fresh.finalize(obj, cluster("a", "b", "c"))
    assert agents.held["a"] == {}
    assert agents.held["c"] == {}
    assert ("ns", "w") in agents.held["b"]  # another object's (same name, other uid): not this one's


async def test_finalize_retries_later_while_a_node_is_unreachable(world: Any) -> None:
    _, agents, events = world
    obj = body(["a", "b"])
    r = reconciler(world, Sink(obj))
    await r.reconcile(obj, cluster("a", "b"))
    agents.down.add("b")
    with pytest.raises(RetryLater) as info:
        await r.finalize(obj, cluster("a", "b"))
    assert info.value.delay >= 1.0
    assert "b" in str(info.value)
    assert states(obj) == {"b": "Pending"}
    assert events[-1].reason == "RemoveFailed"
    agents.down.clear()
    await r.finalize(obj, cluster("a", "b"))
    assert agents.held["b"] == {}


async def test_finalize_does_not_wait_for_a_node_that_is_gone(world: Any) -> None:
    _, agents, _ = world
    obj = body(["a", "b"])
    r = reconciler(world, Sink(obj))
    await r.reconcile(obj, cluster("a", "b"))
    agents.down.add("b")
    await r.finalize(obj, cluster("a"))  # node b deleted (and its RmdNodeState with it)
    assert agents.held["a"] == {}


async def test_orphan_sweep(world: Any) -> None:
    _, agents, _ = world
    r = reconciler(world, Sink(body([])))

    def ref(ns: str, name: str, uid: str) -> agent_pb2.Workload:
        return agent_pb2.Workload(ref=agent_pb2.WorkloadRef(namespace=ns, name=name, uid=uid))

    agents.held["a"] = {
        ("ns", "gone"): ref("ns", "gone", "u1"),
        ("ns", "recreated"): ref("ns", "recreated", "old"),
        ("ns", "alive"): ref("ns", "alive", "u3"),
        ("ns", "no-uid"): ref("ns", "no-uid", ""),
        ("other", "x"): ref("other", "x", "u5"),
    }
    existing = {("ns", "alive"): "u3", ("ns", "recreated"): "new"}
    removed = await r.orphans.sweep(
        "a", "10.0.0.0:1", lambda ns, name: existing.get((ns, name)), lambda ns: ns == "ns"
    )
    assert sorted(removed) == ["ns/gone", "ns/recreated"]
    assert set(agents.held["a"]) == {("ns", "alive"), ("ns", "no-uid"), ("other", "x")}
    assert not r.orphans.due("a")


async def test_a_restarted_agent_is_swept_at_once_and_a_failed_sweep_stays_owed(world: Any) -> None:
    """Issue #13: a workload deleted (finalizer removed) while its agent was down blocked its CPUs until the
    next interval; the restart makes the node due at once, and a sweep that cannot list keeps it due."""
    clock, agents, _ = world
    r = reconciler(world, Sink(body([])))
    gone = agent_pb2.Workload(ref=agent_pb2.WorkloadRef(namespace="ns", name="gone", uid="u1"))

    async def sweep() -> list[str]:
        clock.now += 1.0  # each sweep lists the agent anew
        return await r.orphans.sweep("a", "10.0.0.0:1", lambda ns, name: None, lambda ns: True)

    assert await sweep() == []
    assert not r.orphans.due("a")  # swept within the interval
    agents.held["a"] = {("ns", "gone"): gone}  # the agent restarted with a workload deleted meanwhile
    r.orphans.restarted("a")
    assert r.orphans.due("a")
    agents.down.add("a")
    assert await sweep() == []  # the agent does not answer yet
    assert r.orphans.due("a")
    agents.down.clear()
    assert await sweep() == ["ns/gone"]
    assert not r.orphans.due("a")


# "9999.9999": an object stored before the CRD bounded the ratio (issue #13) is refused, not applied.
@pytest.mark.parametrize("ratio", ["fast", "9999.9999"])
async def test_invalid_spec_is_reported_without_calls(world: Any, ratio: str) -> None:
    _, agents, events = world
    obj = body(["a"])
    obj["spec"]["pstate"] = {"ratio": ratio}
    r = reconciler(world, Sink(obj))
    await r.reconcile(obj, cluster("a"))
    assert obj["status"]["summary"] == "Invalid spec"
    (condition,) = obj["status"]["conditions"]
    assert condition["reason"] == "InvalidSpec"
    assert condition["message"].startswith(
        "spec.pstate.ratio must be a decimal number greater than 0 and less"
    )
    assert agents.calls == []
    assert events[-1].reason == "InvalidSpec"


async def test_nothing_happens_once_the_object_is_being_deleted(world: Any) -> None:
    _, agents, _ = world
    obj = body(["a"])
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    r = reconciler(world, Sink(obj))
    await r.reconcile(obj, cluster("a"))
    assert agents.calls == []


class LaggingSink(Sink):
    """Records patches without touching the object: the watch has not brought the written status back yet."""

    async def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        self.patches.append(patch)
        return True


async def test_a_pass_before_the_watch_caught_up_does_not_write_the_same_status_again(world: Any) -> None:
    obj = body(["a"])
    sink = LaggingSink(obj)
    r = reconciler(world, sink)
    await r.reconcile(obj, cluster("a"))
    await r.reconcile(obj, cluster("a"))  # obj still has no status: the write has not come back
    assert len(sink.patches) == 1
    # the write comes back, then somebody else empties the status: it is written again
    merge(obj.setdefault("status", {}), sink.patches[0]["status"])
    await r.reconcile(obj, cluster("a"))
    assert len(sink.patches) == 1
    obj["status"] = {}
    await r.reconcile(obj, cluster("a"))
    assert len(sink.patches) == 2
    assert sink.patches[1]["status"]["workloadStates"]["a"]["status"] == "Successful"
