"""A NodeConfigTemplate's status and Events from its plan and what the API server did with it (pure).

status.matchingNodes, status.nodeConfigs (those as the template says), status.problems (one per node that has
no NodeConfig as the template says, with the reason) and the Ready condition. Events: one Warning per reason
for the problems that are new since the last pass (so a problem that stays posts nothing more), one Normal
per kind of write done.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rmd_api.node_config import (
    CONFLICT,
    INVALID,
    INVALID_SELECTOR,
    READY,
    SYNCED,
    TEMPLATE_ERROR,
    WRITE_FAILED,
)
from rmd_operator.node_config_plan import Delete, Problem, TemplatePlan
from rmd_operator.status import MESSAGE_LIMIT, EventText

MAX_PROBLEMS = 100  # the CRD's maxItems of status.problems
_SHOWN = 3  # problems quoted in the Ready condition's message
# The Ready reason when several kinds of problem are present: what most needs the user's hand first.
_SEVERITY = (TEMPLATE_ERROR, INVALID, CONFLICT, WRITE_FAILED)
CREATED, UPDATED, DELETED = "NodeConfigCreated", "NodeConfigUpdated", "NodeConfigDeleted"

ProblemKey = tuple[str, str, str]  # (node, reason, message); node "" for the selector


def ready_condition(plan: TemplatePlan, problems: Sequence[Problem]) -> dict[str, Any]:
    """The Ready condition (without lastTransitionTime)."""
    generation = plan.template.generation
    if plan.selector_error is not None:
        status, reason, message = "False", INVALID_SELECTOR, plan.selector_error
    elif problems:
        status = "False"
        reason = min((p.reason for p in problems), key=lambda r: _SEVERITY.index(r) if r in _SEVERITY else 99)
        shown = "; ".join(f"{p.node} ({p.reason}): {p.message}" for p in problems[:_SHOWN])
        more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        message = (
            f"{len(problems)} of {plan.matching} matching node(s) without their NodeConfig: {shown}{more}"
        )
    elif plan.matching:
        status, reason, message = "True", SYNCED, f"a NodeConfig for each of {plan.matching} matching node(s)"
    else:
        status, reason, message = "True", SYNCED, "no node matches the nodeSelector"
    return {
        "type": READY,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def desired_status(plan: TemplatePlan, failures: Sequence[Problem], written: int, now: str) -> dict[str, Any]:
    """The whole status after a pass: `failures` are the writes the API server refused, `written` the ones it
    took; the Ready condition keeps its lastTransitionTime while its status stays."""
    problems = sorted([*plan.problems, *failures], key=lambda p: (p.node, p.reason))
    condition = ready_condition(plan, problems)
    for old in plan.template.status.get("conditions") or ():
        if isinstance(old, Mapping) and old.get("type") == READY and old.get("status") == condition["status"]:
            condition["lastTransitionTime"] = old.get("lastTransitionTime") or now
    condition.setdefault("lastTransitionTime", now)
    return {
        "observedGeneration": plan.template.generation,
        "matchingNodes": plan.matching,
        "nodeConfigs": plan.in_sync + written,
        "problems": [
            {"node": p.node, "reason": p.reason, "message": p.message[:4096]} for p in problems[:MAX_PROBLEMS]
        ],
        "conditions": [condition],
    }


def problem_keys(plan: TemplatePlan, failures: Iterable[Problem] = ()) -> frozenset[ProblemKey]:
    keys = {(p.node, p.reason, p.message) for p in [*plan.problems, *failures]}
    if plan.selector_error is not None:
        keys.add(("", INVALID_SELECTOR, plan.selector_error))
    return frozenset(keys)


def stored_problem_keys(status: Mapping[str, Any]) -> frozenset[ProblemKey]:
    """The problems a status already reports (what an operator that restarts has told before)."""
    keys = {
        (str(p.get("node")), str(p.get("reason")), str(p.get("message")))
        for p in status.get("problems") or ()
        if isinstance(p, Mapping)
    }
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == READY and c.get("reason") == INVALID_SELECTOR:
            keys.add(("", INVALID_SELECTOR, str(c.get("message"))))
    return frozenset(keys)


def problem_events(before: frozenset[ProblemKey], now: frozenset[ProblemKey]) -> list[EventText]:
    """One Warning per reason with the problems that are new."""
    new = sorted(now - before)
    events = []
    for reason in sorted({r for _, r, _ in new}):
        messages = [f"{node}: {m}" if node else m for node, r, m in new if r == reason]
        events.append(EventText("Warning", reason, _joined(messages)))
    return events


def write_events(
    created: Sequence[tuple[str, str]], updated: Sequence[tuple[str, str]], deleted: Sequence[Delete]
) -> list[EventText]:
    """Normal Events for the writes done: (name, node) created or updated, and the deletions with why."""
    events = []
    if created:
        events.append(
            EventText("Normal", CREATED, _joined([f"NodeConfig {n} for node {node}" for n, node in created]))
        )
    if updated:
        events.append(
            EventText("Normal", UPDATED, _joined([f"NodeConfig {n} of node {node}" for n, node in updated]))
        )
    if deleted:
        events.append(
            EventText("Normal", DELETED, _joined([f"NodeConfig {d.name}: {d.why}" for d in deleted]))
        )
    return events


def _joined(parts: Sequence[str]) -> str:
    text = "; ".join(parts)
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."
