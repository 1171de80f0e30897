"""Per-node outcomes -> RmdWorkload status (workloadStates, summary, conditions) and Event texts. Pure.

Every node the workload targets (or still has to be removed from) has one entry in status.workloadStates:

    Successful   the agent applied the workload; id, cosName, coreIds, ... are what the agent enforces
    Failed       the agent refused it (its message), or the node cannot support it; fixed by a spec change,
                 a node change, or (for capacity and conflicts) retried at the drift interval
    Pending      not applied yet, with the reason (agent unreachable, no agent, agent not ready, ...);
                 retried with backoff and whenever the node's agent or labels change

A Failed or Pending entry also has a CamelCase `reason`, so readers (the pod flow) can tell a request the node
can never take (Unsatisfiable, Unsupported) from one that may pass later (Rejected) without parsing messages.

Status writes are merge patches of what differs from the object's current status (nothing when nothing does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rmd_api.agent.v1 import agent_pb2
from rmd_api.cpuset import format_cpu_list
from rmd_api.workload_spec import resource_fields

SUCCESSFUL = "Successful"
FAILED = "Failed"
PENDING = "Pending"

# Agent answers (gRPC status code names) that reject the workload: Failed, with the agent's message.
REJECTION_CODES = frozenset({"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION"})
# Rejections that may pass later without a spec change (another workload frees ways, CPUs, CLOSIDs).
TRANSIENT_REJECTION_CODES = frozenset({"RESOURCE_EXHAUSTED", "FAILED_PRECONDITION"})
# Reasons of Failed entries. UNSATISFIABLE: the agent says the node can never take the request as it is
# (INVALID_ARGUMENT: larger than the node's pool per L3 cache, MBA the node lacks, ...); REJECTED: not now
# (capacity, conflicts), retried. UNSUPPORTED (targets.py): the node lacks the feature altogether.
UNSATISFIABLE = "Unsatisfiable"
REJECTED = "Rejected"
UNSUPPORTED = "Unsupported"
# Anything else is Pending and retried with backoff; the reason says what kind of trouble it is.
_PENDING_REASONS = {
    "UNAVAILABLE": "AgentUnreachable",
    "DEADLINE_EXCEEDED": "AgentUnreachable",
    "PERMISSION_DENIED": "AgentRefusedOperator",
    "UNAUTHENTICATED": "AgentRefusedOperator",
}

MANAGED_FIELDS = ("workloadStates", "summary", "observedGeneration", "conditions")


@dataclass(frozen=True)
class Outcome:
    """The workload's state on one node after the last attempt."""

    status: str  # SUCCESSFUL, FAILED or PENDING
    reason: str  # CamelCase; "" when unknown (an entry read back from the object's status)
    message: str
    workload: agent_pb2.Workload | None = None
    retry: bool = False  # for FAILED: may pass when retried later without a change
    # for SUCCESSFUL: why the node's agent cannot confirm it right now (resctrl keeps enforcing without it)
    unconfirmed: str = ""

    def same_state(self, other: Outcome | None) -> bool:
        """Whether nothing worth an Event changed: same status and (when both are known) same reason."""
        if other is None or other.status != self.status:
            return False
        return not (self.reason and other.reason) or self.reason == other.reason


def applied(workload: agent_pb2.Workload) -> Outcome:
    return Outcome(SUCCESSFUL, "Applied", "", workload)


def call_failed(code: str, message: str) -> Outcome:
    """The outcome of an agent call that failed with gRPC status `code` (its name) and `message`."""
    if code in TRANSIENT_REJECTION_CODES:
        return Outcome(FAILED, REJECTED, message, retry=True)
    if code in REJECTION_CODES:
        return Outcome(FAILED, UNSATISFIABLE, message)
    reason = _PENDING_REASONS.get(code, "AgentError")
    return Outcome(PENDING, reason, f"{code}: {message}" if message else code)


def blocked(status: str, reason: str, message: str) -> Outcome:
    return Outcome(status, reason, message)


def outcome_from_entry(entry: Mapping[str, Any]) -> Outcome:
    """An entry of a stored status as an outcome (after an operator restart); its reason when it has one."""
    status = str(entry.get("status") or PENDING)
    response = str(entry.get("response") or "")
    _, _, message = response.partition(": ")
    status = status if status in (SUCCESSFUL, FAILED, PENDING) else PENDING
    reason = str(entry.get("reason") or "") if status != SUCCESSFUL else ""
    return Outcome(status, reason, message, retry=status == FAILED and reason == REJECTED)


# -- workloadStates entries ----------------------------------------------------------------------------------


def entry(outcome: Outcome) -> dict[str, Any]:
    """The workloadStates entry for an outcome (every field rmd-operator's status had, where known)."""
    if outcome.status != SUCCESSFUL or outcome.workload is None:
        prefix = "Fail" if outcome.status == FAILED else PENDING
        failed = {"status": outcome.status, "response": f"{prefix}: {outcome.message}"}
        if outcome.status != SUCCESSFUL and outcome.reason:
            failed["reason"] = outcome.reason
        return failed
    w = outcome.workload
    response = "Success: OK"
    if outcome.unconfirmed:
        response += f"; the agent cannot confirm it now: {outcome.unconfirmed}"
    return {
        "status": SUCCESSFUL,
        "response": response,
        "id": w.id,
        "cosName": w.cos_name,
        "coreIds": [format_cpu_list(w.cpus)] if w.cpus else [],
        **_with_mba_applied(resource_fields(w.spec), w),
    }


def _with_mba_applied(fields: dict[str, Any], w: agent_pb2.Workload) -> dict[str, Any]:
    """rdt.mba keeps the request (percentage or mbps, as before) and gains what the node holds: `applied`,
    `rounded` and, when rounded, the agent's `message`. Agents that do not say leave it as it was."""
    mba = fields.get("rdt", {}).get("mba")
    if mba is not None and w.HasField("mba_applied"):
        mba["applied"] = w.mba_applied.value
        mba["rounded"] = w.mba_applied.rounded
        if w.mba_applied.detail:
            mba["message"] = w.mba_applied.detail
    return fields


def removal_pending(message: str) -> Outcome:
    """A node the workload must leave but could not be removed from yet."""
    return Outcome(PENDING, "RemovalPending", f"to be removed (no longer a target): {message}")


# -- summary and conditions ----------------------------------------------------------------------------------


def summary(entries: Mapping[str, Mapping[str, Any]], spec_error: str | None = None) -> str:
    """ "2/3 Successful, 1 Pending": the printer column's one line across the nodes."""
    if spec_error is not None:
        return "Invalid spec"
    if not entries:
        return "No target nodes"
    counts = {s: 0 for s in (SUCCESSFUL, FAILED, PENDING)}
    for e in entries.values():
        counts[str(e.get("status"))] = counts.get(str(e.get("status")), 0) + 1
    text = f"{counts[SUCCESSFUL]}/{len(entries)} {SUCCESSFUL}"
    extra = [f"{counts[s]} {s}" for s in (FAILED, PENDING) if counts[s]]
    return ", ".join([text, *extra])


def ready_condition(
    entries: Mapping[str, Mapping[str, Any]], generation: int, spec_error: str | None = None
) -> dict[str, Any]:
    """The Ready condition (without lastTransitionTime): True when every target node is Successful."""
    if spec_error is not None:
        status, reason, message = "False", "InvalidSpec", spec_error
    elif not entries:
        status, reason, message = "False", "NoTargets", "no node matches spec.nodes or spec.nodeSelector"
    else:
        failing = {n: e for n, e in sorted(entries.items()) if e.get("status") != SUCCESSFUL}
        if not failing:
            status, reason, message = "True", "Applied", f"applied on {len(entries)} node(s)"
        else:
            status = "False"
            reason = FAILED if any(e.get("status") == FAILED for e in failing.values()) else PENDING
            shown = [f"{n}: {e.get('response', '')}" for n, e in list(failing.items())[:3]]
            more = f"; and {len(failing) - 3} more" if len(failing) > 3 else ""
            message = "; ".join(shown) + more
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def _with_transition_time(
    condition: dict[str, Any], previous: Iterable[Mapping[str, Any]], now: str
) -> dict[str, Any]:
    for old in previous:
        same = old.get("type") == condition["type"] and old.get("status") == condition["status"]
        if same and old.get("lastTransitionTime"):
            return {**condition, "lastTransitionTime": old["lastTransitionTime"]}
    return {**condition, "lastTransitionTime": now}


def desired_status(
    entries: Mapping[str, Mapping[str, Any]],
    generation: int,
    current: Mapping[str, Any],
    now: str,
    spec_error: str | None = None,
) -> dict[str, Any]:
    """The managed part of the status for these entries; `current` supplies unchanged transition times."""
    previous = [c for c in current.get("conditions") or () if isinstance(c, Mapping)]
    condition = _with_transition_time(ready_condition(entries, generation, spec_error), previous, now)
    others = [dict(c) for c in previous if c.get("type") != "Ready"]
    return {
        "workloadStates": {node: dict(e) for node, e in entries.items()},
        "summary": summary(entries, spec_error),
        "observedGeneration": generation,
        "conditions": [*others, condition],
    }


def merge_diff(current: Any, desired: Any) -> Any:
    """A JSON merge patch (RFC 7386) turning `current` into `desired`; None when they are equal. Objects are
    diffed key by key (keys only in `current` become null); anything else is replaced whole."""
    if isinstance(current, Mapping) and isinstance(desired, Mapping):
        patch: dict[str, Any] = {}
        for key in current:
            if key not in desired:
                patch[key] = None
        for key, value in desired.items():
            if key not in current:
                patch[key] = value
            else:
                sub = merge_diff(current[key], value)
                if sub is not None:
                    patch[key] = sub
        return patch or None
    return None if current == desired else desired


def status_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch for the status subresource ({"status": ...}), None if nothing managed differs."""
    managed = {key: current[key] for key in MANAGED_FIELDS if key in current}
    diff = merge_diff(managed, desired)
    return {"status": diff} if diff is not None else None


# -- Events --------------------------------------------------------------------------------------------------

MESSAGE_LIMIT = 1000  # below the API server's 1 KiB cap on an Event's message (events.py cuts longer ones)


@dataclass(frozen=True)
class EventText:
    type: str  # Normal or Warning
    reason: str
    message: str
    # Set: the Event is posted at most once per object and key, even across operator restarts (its name is
    # derived from the object's uid and the key, so the API server refuses a second one).
    once: str = ""


def _describe(workload: agent_pb2.Workload | None) -> str:
    if workload is None:
        return ""
    parts = []
    if workload.cos_name:
        parts.append(f"group {workload.cos_name}")
    if workload.cpus:
        parts.append(f"cpus {format_cpu_list(workload.cpus)}")
    return f" ({', '.join(parts)})" if parts else ""


def transition_event(node: str, old: Outcome | None, new: Outcome) -> EventText | None:
    """The Event for a node's change of state (first success, recovery, failure, new kind of trouble), or
    None when the state is the same kind as before (retries of the same trouble post nothing)."""
    if new.status == SUCCESSFUL and old is not None and old.status == SUCCESSFUL:
        if new.unconfirmed and not old.unconfirmed:
            return EventText(
                "Warning",
                "AgentUnreachable",
                f"node {node}: still enforced, but its agent cannot be reached: {new.unconfirmed}",
            )
        if old.unconfirmed and not new.unconfirmed:
            return EventText(
                "Normal", "AgentReachable", f"node {node}: its agent answers again, workload in place"
            )
    if new.same_state(old):
        return None
    if new.status == SUCCESSFUL:
        if old is None or old.status == SUCCESSFUL:
            return EventText("Normal", "Applied", f"applied on node {node}{_describe(new.workload)}")
        return EventText(
            "Normal",
            "Recovered",
            f"applied on node {node}{_describe(new.workload)} after being {old.status}"
            + (f": {old.message}" if old.message else ""),
        )
    if new.status == FAILED:
        return EventText("Warning", new.reason or FAILED, f"node {node}: {new.message}")
    return EventText("Warning", new.reason or PENDING, f"node {node}: {new.message}; retrying")


def updated_event(node: str, generation: int, workload: agent_pb2.Workload | None) -> EventText:
    return EventText(
        "Normal", "Updated", f"generation {generation} applied on node {node}{_describe(workload)}"
    )


def drift_event(node: str, workload: agent_pb2.Workload | None) -> EventText:
    return EventText(
        "Normal",
        "DriftRepaired",
        f"node {node} no longer had the workload; re-applied{_describe(workload)}",
    )


def mba_rounded_event(node: str, workload: agent_pb2.Workload) -> EventText | None:
    """The Event for an MBA request the node holds rounded up (None when it holds it as asked), once per node
    and value: a re-apply or an operator restart does not repeat it."""
    held = workload.mba_applied
    if not workload.HasField("mba_applied") or not held.rounded:
        return None
    asked = workload.spec.mba.WhichOneof("value") or ""
    requested = getattr(workload.spec.mba, asked) if asked else 0
    return EventText(
        "Normal",
        "MbaRounded",
        f"node {node}: {held.detail}",
        once=f"mba-rounded/{node}/{requested}/{held.value}",
    )


def removed_event(node: str, why: str) -> EventText:
    return EventText("Normal", "Removed", f"removed from node {node}: {why}")
