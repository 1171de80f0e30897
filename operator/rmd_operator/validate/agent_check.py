"""The `agent` check: is the node's agent running and Ready (docs/validate.md, "Per node")."""

from __future__ import annotations

from rmd_api.node_state import (
    AGENT_STOPPED,
    ENGINE_NOT_READY,
    ENGINE_UNAVAILABLE,
    HEARTBEAT_EXPIRED,
    node_state_name,
)
from rmd_operator.validate.context import Context, liveness
from rmd_operator.validate.findings import Finding, error, info, ok
from rmd_operator.validate.snapshot import (
    Obj,
    Snapshot,
    ago,
    name_of,
    parse_time,
    pod_problem,
    pod_ready,
    ready_condition,
    span,
)

_NOT_READY_FIXES = {
    AGENT_STOPPED: "the agent shut down and has not started again: check its pod on this node "
    "(kubectl -n {ns} get pods -l app.kubernetes.io/component=agent -o wide) and its log",
    HEARTBEAT_EXPIRED: "the agent stopped renewing its heartbeat (killed, node down, or cut off from the API "
    "server): check the node and the agent pod on it; the agent sets Ready=True again when it runs",
    ENGINE_NOT_READY: "the agent runs but cannot enforce allocations yet; its message says why (resctrl not "
    "mounted, still reconciling); see its log",
    ENGINE_UNAVAILABLE: "the agent's engine does not answer; see the agent's log and restart its pod if it "
    "stays so",
}


def _pod_names(pods: list[Obj]) -> str:
    return ", ".join(name_of(p) for p in pods)


def check_agent(snap: Snapshot, ctx: Context, node: str) -> Finding:
    """Running and Ready: the RmdNodeState's Ready condition, the heartbeat Lease, and the DaemonSet's pod."""
    ns = snap.namespace
    state = snap.node_states.get(node)
    pods = ctx.agent_pods.get(node, [])
    unready = [p for p in pods if not pod_ready(p)]
    pod_note = ""
    if ctx.agent_daemonset is not None:
        if not pods:
            pod_note = f"; no pod of DaemonSet {name_of(ctx.agent_daemonset)} on this node"
        elif unready:
            pod_note = "; agent pod " + "; ".join(
                f"{name_of(p)} not ready: {pod_problem(p)}" for p in unready
            )
    first = name_of(unready[0]) if unready else ""
    pod_fix = f"kubectl -n {ns} describe pod {first}; kubectl -n {ns} logs {first}"

    if state is None:
        fix = (
            pod_fix
            if unready
            else f"the agent publishes {node_state_name(node)} in its own namespace when it starts "
            f"(node_state_enabled): check that it runs on this node and writes to namespace {ns} (-n)"
        )
        return error(node, "agent", f"no RmdNodeState {node_state_name(node)} in {ns}{pod_note}", fix)
    ready = ready_condition(state)
    if ready is None:
        return error(
            node, "agent", f"its RmdNodeState has no Ready condition{pod_note}", "see the agent's log"
        )
    since = parse_time(ready.get("lastTransitionTime"))
    since_text = f" since {since:%Y-%m-%dT%H:%M:%SZ} ({ago(snap.now, since)})" if since else ""
    if ready.get("status") != "True":
        reason = str(ready.get("reason") or "")
        message = str(ready.get("message") or "")
        fix = _NOT_READY_FIXES.get(reason, "see the agent's log").format(ns=ns)
        return error(
            node,
            "agent",
            f"not Ready ({reason}{': ' + message if message else ''}){since_text}{pod_note}",
            pod_fix if unready else fix,
        )
    live = liveness(snap, node)
    if live.expired_for is not None:
        return error(
            node,
            "agent",
            f"says Ready, but its heartbeat Lease expired {span(live.expired_for.total_seconds())} ago "
            f"(last renewal {live.renewed}): the agent is not running, and the operator has not marked it "
            f"not ready (is the operator running?){pod_note}",
            pod_fix if unready else _NOT_READY_FIXES[HEARTBEAT_EXPIRED],
        )
    if unready:
        return error(node, "agent", f"Ready{since_text}, but{pod_note[1:]}", pod_fix)
    if node not in snap.leases:
        return info(
            node,
            "agent",
            f"Ready{since_text}; no heartbeat Lease, so an agent killed now would look Ready{pod_note}",
            "set the agent's heartbeat_seconds above 0 (default 5) unless it is off on purpose",
        )
    where = f"; pod {_pod_names(pods)}" if pods else pod_note
    return ok(node, "agent", f"Ready{since_text}; heartbeat renewed at {live.renewed}{where}")
