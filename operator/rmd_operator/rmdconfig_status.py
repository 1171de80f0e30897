"""An RmdConfig's status and Events from its plan and what the cluster shows (pure).

Conditions: Ready (every agent the DaemonSet should run is updated and ready), Progressing (a rollout is
under way), Degraded (a write failed, or agentSettings were left out) and, only when a ServiceMonitor is
asked for, ServiceMonitorReady (CRDMissing until prometheus-operator's CRDs exist). Each keeps its
lastTransitionTime while its status stays. Per node: the agents' pods (`nodes`) and the matching nodes whose
agent's probe found no RDT L3 cache allocation (`unsupportedNodes`, with the probe's reason). Events: one
Warning when Degraded or ServiceMonitorReady turns bad or changes its message, one Normal when the
ServiceMonitor is created after all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rmd_api.node_state import RDT_L3_CAT
from rmd_operator.rmdconfig_plan import (
    AGENT_CONTAINER,
    SERVICE_MONITOR_CRD,
    ObjectRef,
    Plan,
    ignored_message,
    matching_nodes,
    ref_entry,
)
from rmd_operator.status import MESSAGE_LIMIT, EventText

READY, PROGRESSING, DEGRADED, SERVICE_MONITOR_READY = (
    "Ready",
    "Progressing",
    "Degraded",
    "ServiceMonitorReady",
)
CRD_MISSING = "CRDMissing"
MAX_LISTED = 500  # nodes listed in status.nodes / unsupportedNodes


@dataclass(frozen=True)
class Observed:
    """What one pass read and did. `daemonset`: the stored DaemonSet (None: not there); `pods`: the
    DaemonSet's pods; `nodes`: node name -> labels; `node_states`: the agents' RmdNodeStates; `failures`:
    the writes refused in this pass (or why nothing could be planned); `unapplied`: of those, the objects
    whose apply was refused, with the failure; `kept`: objects of an earlier pass that the plan no longer has
    but this pass did not delete (refused, or held back by an invalid spec), still listed in managedObjects
    so that a later pass deletes them; `previous`: the stored status."""

    generation: int
    daemonset: Mapping[str, Any] | None
    pods: Sequence[Mapping[str, Any]] = ()
    nodes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    node_states: Sequence[Mapping[str, Any]] = ()
    failures: Sequence[str] = ()
    unapplied: Mapping[ObjectRef, str] = field(default_factory=dict)
    kept: Sequence[ObjectRef] = ()
    previous: Mapping[str, Any] = field(default_factory=dict)


def _condition(kind: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "observedGeneration": generation,
    }


def _counts(ds: Mapping[str, Any]) -> tuple[int, int, int, int]:
    status = ds.get("status") or {}
    return (
        int(status.get("desiredNumberScheduled") or 0),
        int(status.get("numberReady") or 0),
        int(status.get("updatedNumberScheduled") or 0),
        int(status.get("numberAvailable") or 0),
    )


def _current(ds: Mapping[str, Any]) -> bool:
    """The DaemonSet controller has seen the latest template."""
    generation = (ds.get("metadata") or {}).get("generation") or 0
    return int((ds.get("status") or {}).get("observedGeneration") or 0) >= int(generation)


def conditions(plan: Plan | None, seen: Observed) -> list[dict[str, Any]]:
    """The conditions (without lastTransitionTime). `plan` None: nothing could be planned (seen.failures says
    why)."""
    g = seen.generation
    ds = seen.daemonset
    failures = list(seen.failures)
    if plan is not None and plan.ignored_settings:
        degraded = _condition(
            DEGRADED, True, "AgentSettingsIgnored", ignored_message(plan.ignored_settings), g
        )
    else:
        degraded = _condition(DEGRADED, False, "AsExpected", "every object applied as planned", g)
    if plan is not None and plan.spec_error:
        more = f"; {degraded['message']}" if degraded["status"] == "True" else ""
        degraded = _condition(DEGRADED, True, "InvalidSpec", plan.spec_error + more, g)
    if failures:
        more = f"; {degraded['message']}" if degraded["status"] == "True" else ""
        degraded = _condition(DEGRADED, True, "ApplyFailed", "; ".join(failures) + more, g)
    if ds is None:
        progressing = _condition(
            PROGRESSING, plan is not None, "Creating", "the agents' DaemonSet is not there yet", g
        )
        ready = _condition(READY, False, "ApplyFailed" if failures else "Creating", "no DaemonSet yet", g)
    else:
        desired, ready_n, updated, available = _counts(ds)
        rolling = not _current(ds) or updated < desired or available < desired
        progressing = (
            _condition(
                PROGRESSING,
                True,
                "RollingOut",
                f"{updated} of {desired} agent(s) updated, {available} available",
                g,
            )
            if rolling
            else _condition(PROGRESSING, False, "RolledOut", f"{desired} agent(s) at the current template", g)
        )
        if desired == 0 and _current(ds):  # before its controller counted the nodes, 0 says nothing
            selector = plan.node_selector if plan is not None else {}
            ready = _condition(
                READY, False, "NoMatchingNodes", f"no node matches the node selector {selector}", g
            )
        elif ready_n >= desired and updated >= desired and _current(ds):
            ready = _condition(READY, True, "AgentsReady", f"{ready_n} of {desired} agent(s) ready", g)
        else:
            ready = _condition(
                READY, False, "AgentsNotReady", f"{ready_n} of {desired} agent(s) ready, {updated} updated", g
            )
    result = [ready, progressing, degraded]
    if plan is not None and plan.service_monitor == "Planned":
        # Only the ServiceMonitor's own write counts: another object's failure is Degraded's to report.
        refused = next((why for ref, why in seen.unapplied.items() if ref.kind == "ServiceMonitor"), "")
        result.append(
            _condition(
                SERVICE_MONITOR_READY,
                not refused,
                "ApplyFailed" if refused else "Created",
                refused or "the agents' ServiceMonitor is applied",
                g,
            )
        )
    elif plan is not None and plan.service_monitor == CRD_MISSING:
        result.append(
            _condition(
                SERVICE_MONITOR_READY,
                False,
                CRD_MISSING,
                f"serviceMonitor.enabled, but the CRD {SERVICE_MONITOR_CRD} is not installed: install the "
                "prometheus-operator CRDs; the ServiceMonitor is created once it is",
                g,
            )
        )
    return result


def agent_nodes(pods: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per agent pod bound to a node: its node, name, readiness and image."""
    out = []
    for pod in pods:
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if not node:
            continue
        containers = spec.get("containers") or [{}]
        agent = next((c for c in containers if c.get("name") == AGENT_CONTAINER), containers[0])
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or ()
        )
        entry = {"name": node, "pod": (pod.get("metadata") or {}).get("name", ""), "ready": ready}
        if agent.get("image"):
            entry["image"] = agent["image"]
        out.append(entry)
    return sorted(out, key=lambda e: (e["name"], e["pod"]))[:MAX_LISTED]


def unsupported_nodes(
    selector: Mapping[str, str],
    nodes: Mapping[str, Mapping[str, str]],
    node_states: Sequence[Mapping[str, Any]],
) -> list[dict[str, str]]:
    """The nodes matching `selector` whose agent's probe reports no RDT L3 cache allocation."""
    by_node = {str((s.get("spec") or {}).get("node")): s for s in node_states}
    out = []
    for node in matching_nodes(selector, nodes):
        caps = ((by_node.get(node) or {}).get("status") or {}).get("capabilities") or {}
        cap = caps.get(RDT_L3_CAT)
        if isinstance(cap, Mapping) and cap.get("supported") is False:
            out.append(
                {
                    "name": node,
                    "reason": str(cap.get("reason") or "Unsupported"),
                    "message": str(cap.get("detail") or ""),
                }
            )
    return out[:MAX_LISTED]


def desired_status(plan: Plan | None, seen: Observed, now: str) -> dict[str, Any]:
    """The whole status after a pass."""
    old = {c.get("type"): c for c in seen.previous.get("conditions") or () if isinstance(c, Mapping)}
    conds = []
    for c in conditions(plan, seen):
        before = old.get(c["type"])
        keep = before is not None and before.get("status") == c["status"]
        conds.append({**c, "lastTransitionTime": (before or {}).get("lastTransitionTime") if keep else now})
    ds_status = (seen.daemonset or {}).get("status") or {}
    status: dict[str, Any] = {
        "observedGeneration": seen.generation,
        "desiredNumberScheduled": int(ds_status.get("desiredNumberScheduled") or 0),
        "numberReady": int(ds_status.get("numberReady") or 0),
        "nodes": agent_nodes(seen.pods),
        "unsupportedNodes": unsupported_nodes(
            plan.node_selector if plan else {}, seen.nodes, seen.node_states
        ),
        "settingsIgnored": sorted(plan.ignored_settings) if plan else [],
        # What this pass applied and what it could not delete yet, so a later pass deletes what its plan no
        # longer has (rmdconfig_plan.stale); kept as it was when nothing could be planned.
        "managedObjects": (
            [ref_entry(ObjectRef.of(o)) for o in plan.apply] + [ref_entry(ref) for ref in seen.kept]
            if plan is not None
            else list(seen.previous.get("managedObjects") or [])
        ),
        "conditions": conds,
    }
    return status


def events(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[EventText]:
    """Warnings for Degraded or ServiceMonitorReady turning bad (or saying something new), and a Normal
    event when the ServiceMonitor is made after all."""

    def key(s: Mapping[str, Any], kind: str) -> tuple[str, str, str] | None:
        for c in s.get("conditions") or ():
            if isinstance(c, Mapping) and c.get("type") == kind:
                return str(c.get("status")), str(c.get("reason")), str(c.get("message"))
        return None

    out = []
    for kind, bad in ((DEGRADED, "True"), (SERVICE_MONITOR_READY, "False")):
        now, before = key(status, kind), key(previous, kind)
        if now is None or now == before:
            continue
        if now[0] == bad:
            out.append(EventText("Warning", now[1], now[2]))
        elif kind == SERVICE_MONITOR_READY and before is not None and before[0] == bad:
            out.append(EventText("Normal", "ServiceMonitorCreated", now[2]))
    return out


def settled(status: Mapping[str, Any]) -> bool:
    """No rollout under way: the next check may wait for the long resync. (Agents not ready without a rollout,
    or no matching node, change through pods and labels, which a 5 s poll would only re-read.)"""
    return not any(
        isinstance(c, Mapping) and c.get("type") == PROGRESSING and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
