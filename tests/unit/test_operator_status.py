"""Per-node outcomes -> RmdWorkload status entries, summary, conditions, merge patches and Events."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from rmd_api.agent.v1 import agent_pb2
from rmd_operator import status as st

ROOT = Path(__file__).resolve().parents[2]
ROUNDED = "MBA 15% rounded up to 20%: the node's MBA step (bandwidth_gran) is 10%"


def workload(**overrides: Any) -> agent_pb2.Workload:
    w = agent_pb2.Workload(
        ref=agent_pb2.WorkloadRef(namespace="ns", name="w", uid="u"),
        id="7",
        cos_name="COS3",
        status="Successful",
        cpus=[3, 0, 1, 2, 8],
        pool="guaranteed",
    )
    w.spec.core_ids.append("0-3,8")
    w.spec.cache.max = 2
    w.spec.cache.min = 2
    w.spec.mba.percentage = 50
    w.spec.pstate.ratio = 1.5
    w.spec.pstate.monitoring = True
    for key, value in overrides.items():
        setattr(w, key, value)
    return w


def test_success_entry_has_what_the_agent_enforces() -> None:
    assert st.entry(st.applied(workload())) == {
        "status": "Successful",
        "response": "Success: OK",
        "id": "7",
        "cosName": "COS3",
        "coreIds": ["0-3,8"],
        "rdt": {"cache": {"max": 2, "min": 2}, "mba": {"percentage": 50}},
        # monitoring has its own field (rmd-operator wrote it into ratio)
        "plugins": {"pstate": {"monitoring": "on", "ratio": "1.5"}},
    }


def test_policy_is_reported_and_absent_parts_are_left_out() -> None:
    w = agent_pb2.Workload(id="1", cos_name="COS1", cpus=[4])
    w.spec.policy = "gold"
    assert st.entry(st.applied(w)) == {
        "status": "Successful",
        "response": "Success: OK",
        "id": "1",
        "cosName": "COS1",
        "coreIds": ["4"],
        "policy": "gold",
    }


def rounded_workload() -> agent_pb2.Workload:
    """15% asked on a node with a 10% MBA step: the agent holds (and says it holds) 20%."""
    w = workload()
    w.spec.mba.percentage = 15
    w.mba_applied.CopyFrom(agent_pb2.MbaApplied(value=20, rounded=True, detail=ROUNDED))
    return w


def test_success_entry_says_the_mba_value_the_node_holds_and_that_it_was_rounded() -> None:
    """#13 item 5: the requested percentage keeps its field; what the kernel holds and why sit beside it."""
    assert st.entry(st.applied(rounded_workload()))["rdt"]["mba"] == {
        "percentage": 15,
        "applied": 20,
        "rounded": True,
        "message": ROUNDED,
    }
    exact = workload()
    exact.mba_applied.CopyFrom(agent_pb2.MbaApplied(value=50))
    assert st.entry(st.applied(exact))["rdt"]["mba"] == {"percentage": 50, "applied": 50, "rounded": False}
    mbps = workload()
    mbps.spec.mba.mbps = 2500  # MBps are never rounded: the kernel takes them as given
    mbps.mba_applied.CopyFrom(agent_pb2.MbaApplied(value=2500))
    assert st.entry(st.applied(mbps))["rdt"]["mba"] == {"mbps": 2500, "applied": 2500, "rounded": False}


def test_an_agent_that_does_not_report_the_applied_value_leaves_the_entry_as_before() -> None:
    assert st.entry(st.applied(workload()))["rdt"]["mba"] == {"percentage": 50}


def _undeclared(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    """Paths of `value` the structural schema does not declare (the API server would prune them)."""
    if not isinstance(value, Mapping):
        return []
    found = []
    for key, item in value.items():
        if "additionalProperties" in schema:
            found += _undeclared(item, schema["additionalProperties"], f"{path}.{key}")
        elif key in schema.get("properties", {}):
            found += _undeclared(item, schema["properties"][key], f"{path}.{key}")
        else:
            found.append(f"{path}.{key}")
    return found


def test_every_field_of_an_entry_is_declared_by_the_crd() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "rmdworkloads.intel.com.yaml").read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    states = {"n1": st.entry(st.applied(rounded_workload())), "n2": st.entry(st.call_failed("INTERNAL", "x"))}
    assert _undeclared({"workloadStates": states}, status, "status") == []


def test_rounding_posts_one_normal_event_per_node_and_value() -> None:
    event = st.mba_rounded_event("n1", rounded_workload())
    assert event is not None
    assert (event.type, event.reason, event.message) == ("Normal", "MbaRounded", f"node n1: {ROUNDED}")
    assert event.once and event.once != st.mba_rounded_event("n2", rounded_workload()).once  # type: ignore[union-attr]
    exact = workload()
    exact.mba_applied.CopyFrom(agent_pb2.MbaApplied(value=50))
    assert st.mba_rounded_event("n1", exact) is None
    assert st.mba_rounded_event("n1", workload()) is None


@pytest.mark.parametrize(
    ("code", "status", "reason", "retry"),
    [
        ("INVALID_ARGUMENT", st.FAILED, "Unsatisfiable", False),
        ("RESOURCE_EXHAUSTED", st.FAILED, "Rejected", True),
        ("FAILED_PRECONDITION", st.FAILED, "Rejected", True),
        ("UNAVAILABLE", st.PENDING, "AgentUnreachable", False),
        ("DEADLINE_EXCEEDED", st.PENDING, "AgentUnreachable", False),
        ("PERMISSION_DENIED", st.PENDING, "AgentRefusedOperator", False),
        ("INTERNAL", st.PENDING, "AgentError", False),
    ],
)
def test_agent_errors(code: str, status: str, reason: str, retry: bool) -> None:
    outcome = st.call_failed(code, "not enough cache left on cache_id 0")
    assert (outcome.status, outcome.reason, outcome.retry) == (status, reason, retry)
    response = st.entry(outcome)["response"]
    assert "not enough cache left on cache_id 0" in response
    assert response.startswith("Fail: " if status == st.FAILED else "Pending: ")
    assert st.entry(outcome)["reason"] == reason


def test_failed_entry_has_the_agents_message_and_the_kind_of_failure() -> None:
    assert st.entry(st.call_failed("FAILED_PRECONDITION", "CPU 6 is held by ns/other")) == {
        "status": "Failed",
        "response": "Fail: CPU 6 is held by ns/other",
        "reason": "Rejected",
    }
    assert st.entry(st.call_failed("INVALID_ARGUMENT", "cache max=6 exceeds ...")) == {
        "status": "Failed",
        "response": "Fail: cache max=6 exceeds ...",
        "reason": "Unsatisfiable",
    }


def test_entry_read_back_keeps_status_message_and_reason() -> None:
    back = st.outcome_from_entry({"status": "Pending", "response": "Pending: UNAVAILABLE: refused"})
    assert (back.status, back.reason, back.message) == ("Pending", "", "UNAVAILABLE: refused")
    assert st.outcome_from_entry({"status": "Weird"}).status == st.PENDING
    for code in ("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"):
        outcome = st.call_failed(code, "why")
        back = st.outcome_from_entry(st.entry(outcome))
        assert (back.status, back.reason, back.message, back.retry) == (
            outcome.status,
            outcome.reason,
            outcome.message,
            outcome.retry,
        )


@pytest.mark.parametrize(
    ("statuses", "text"),
    [
        (["Successful", "Successful"], "2/2 Successful"),
        (["Successful", "Failed", "Pending"], "1/3 Successful, 1 Failed, 1 Pending"),
        (["Pending"], "0/1 Successful, 1 Pending"),
        ([], "No target nodes"),
    ],
)
def test_summary(statuses: list[str], text: str) -> None:
    entries = {f"n{i}": {"status": s} for i, s in enumerate(statuses)}
    assert st.summary(entries) == text


def test_ready_condition() -> None:
    ok = st.ready_condition({"a": {"status": "Successful"}}, 3)
    assert (ok["status"], ok["reason"], ok["observedGeneration"]) == ("True", "Applied", 3)
    bad = st.ready_condition(
        {"a": {"status": "Successful"}, "b": {"status": "Pending", "response": "Pending: x"}}, 3
    )
    assert (bad["status"], bad["reason"]) == ("False", "Pending")
    assert "b: Pending: x" in bad["message"]
    failed = st.ready_condition({"a": {"status": "Failed"}, "b": {"status": "Pending"}}, 1)
    assert failed["reason"] == "Failed"
    assert st.ready_condition({}, 1)["reason"] == "NoTargets"
    assert st.ready_condition({}, 1, spec_error="bad")["reason"] == "InvalidSpec"


def test_merge_diff() -> None:
    assert st.merge_diff({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 2, "d": 3}}) is None
    assert st.merge_diff({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 5}}) == {
        "b": {"c": 5, "d": None}
    }
    assert st.merge_diff({"l": [1, 2]}, {"l": [1]}) == {"l": [1]}
    assert st.merge_diff({"gone": {"x": 1}}, {}) == {"gone": None}


def test_status_patch_drops_departed_nodes_and_is_none_when_nothing_changed() -> None:
    entries = {"n1": st.entry(st.applied(workload()))}
    current = st.desired_status(
        {**entries, "n2": {"status": "Pending", "response": "Pending: x"}}, 1, {}, "2026-01-01T00:00:00Z"
    )
    current["unmanaged"] = "kept"
    desired = st.desired_status(entries, 1, current, "2026-02-02T00:00:00Z")
    patch = st.status_patch(current, desired)
    assert patch is not None
    assert patch["status"]["workloadStates"] == {"n2": None}
    assert patch["status"]["summary"] == "1/1 Successful"
    assert "unmanaged" not in patch["status"]
    settled = {**current, **desired}
    assert st.status_patch(settled, st.desired_status(entries, 1, settled, "2026-03-03T00:00:00Z")) is None


def test_condition_transition_time_kept_while_status_holds() -> None:
    entries = {"n1": {"status": "Successful"}}
    first = st.desired_status(entries, 1, {}, "T1")
    again = st.desired_status(entries, 2, first, "T2")
    assert again["conditions"][0]["lastTransitionTime"] == "T1"
    failing = st.desired_status({"n1": {"status": "Failed"}}, 2, again, "T3")
    assert failing["conditions"][0]["lastTransitionTime"] == "T3"


def test_other_conditions_are_kept() -> None:
    current = {"conditions": [{"type": "Custom", "status": "True"}]}
    desired = st.desired_status({}, 1, current, "T")
    assert [c["type"] for c in desired["conditions"]] == ["Custom", "Ready"]


def test_events_on_every_change_of_state_only() -> None:
    ok = st.applied(workload())
    unreachable = st.call_failed("UNAVAILABLE", "connection refused")
    first = st.transition_event("n1", None, ok)
    assert first is not None
    assert (first.type, first.reason) == ("Normal", "Applied")
    assert "group COS3" in first.message
    assert "cpus 0-3,8" in first.message
    down = st.transition_event("n1", ok, unreachable)
    assert down is not None
    assert (down.type, down.reason) == ("Warning", "AgentUnreachable")
    assert st.transition_event("n1", unreachable, st.call_failed("UNAVAILABLE", "other text")) is None
    recovered = st.transition_event("n1", unreachable, ok)
    assert recovered is not None
    assert recovered.reason == "Recovered"
    assert "connection refused" in recovered.message
    assert st.transition_event("n1", ok, st.applied(workload(id="8"))) is None
    rejected = st.transition_event("n1", unreachable, st.call_failed("RESOURCE_EXHAUSTED", "full"))
    assert rejected is not None
    assert (rejected.type, rejected.reason) == ("Warning", "Rejected")


def test_after_restart_the_same_status_posts_nothing_but_a_new_one_does() -> None:
    restored = st.outcome_from_entry({"status": "Pending", "response": "Pending: UNAVAILABLE: x"})
    assert st.transition_event("n1", restored, st.call_failed("UNAVAILABLE", "y")) is None
    assert st.transition_event("n1", restored, st.applied(workload())) is not None


def test_an_unconfirmed_success_says_so_with_events_both_ways() -> None:
    """While a node's agent is unreachable its entry stays Successful (resctrl keeps enforcing without the
    agent), but its response says the agent cannot confirm it; a Warning, then a recovery Event."""
    confirmed = st.applied(workload())
    unconfirmed = st.Outcome(
        st.SUCCESSFUL, "Applied", "", workload(), unconfirmed="UNAVAILABLE: connect failed"
    )
    entry = st.entry(unconfirmed)
    assert entry["status"] == "Successful"
    assert entry["response"] == "Success: OK; the agent cannot confirm it now: UNAVAILABLE: connect failed"
    assert st.entry(confirmed)["response"] == "Success: OK"
    lost = st.transition_event("n1", confirmed, unconfirmed)
    assert lost is not None and (lost.type, lost.reason) == ("Warning", "AgentUnreachable")
    assert st.transition_event("n1", unconfirmed, unconfirmed) is None  # retries post nothing
    back = st.transition_event("n1", unconfirmed, confirmed)
    assert back is not None and (back.type, back.reason) == ("Normal", "AgentReachable")
