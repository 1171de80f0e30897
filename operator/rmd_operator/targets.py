"""Which nodes a workload targets and which of them can take it. Pure: no I/O.

Candidates come from spec.nodeSelector when it is set (it takes precedence, as in rmd-operator) and from
spec.nodes otherwise. A candidate is a target only if its agent has published an RmdNodeState that says it is
ready, where to reach it, and that the node supports what the workload asks for; every other candidate gets a
status entry saying why not (rmd-operator skipped such nodes silently). Nodes that are not candidates at all
are the ones a workload must be removed from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rmd_api.node_state import MBA, RDT_L3_CAT, READY, node_state_name
from rmd_operator.spec import Requirements

PENDING = "Pending"
FAILED = "Failed"


@dataclass(frozen=True)
class Capability:
    supported: bool
    detail: str = ""


@dataclass(frozen=True)
class NodeAgent:
    """What a node's agent says about itself in its RmdNodeState."""

    node: str
    endpoint: str = ""  # host:port; empty until the agent publishes it
    capabilities: Mapping[str, Capability] = field(default_factory=dict)
    ready: bool | None = None  # the Ready condition; None when the agent reports no such condition
    ready_reason: str = ""
    ready_message: str = ""


@dataclass(frozen=True)
class Blocked:
    """A candidate node that cannot take the workload now, and why."""

    status: str  # PENDING (may resolve by itself: no agent yet, agent not ready) or FAILED (node unsuitable)
    reason: str  # CamelCase, for Events and comparisons
    message: str
    # Only the agent cannot be asked now (restarting, not ready): the node still enforces whatever it was
    # given, so a workload already applied there stays applied meanwhile.
    agent_only: bool = False


@dataclass(frozen=True)
class TargetPlan:
    targets: Mapping[str, str]  # node -> agent endpoint
    blocked: Mapping[str, Blocked]

    @property
    def candidates(self) -> frozenset[str]:
        return frozenset(self.targets) | frozenset(self.blocked)


@dataclass(frozen=True)
class Cluster:
    """What the operator knows of the nodes: labels of every Node, and each node's agent (RmdNodeState)."""

    node_labels: Mapping[str, Mapping[str, str]]
    agents: Mapping[str, NodeAgent]


def reachable_agent(node: str, cluster: Cluster) -> NodeAgent | None:
    """The node's agent if there is one to call; None when the node or its agent is gone (then there is
    nobody to remove anything from, and nothing to wait for)."""
    agent = cluster.agents.get(node)
    if node not in cluster.node_labels or agent is None or not agent.endpoint:
        return None
    return agent


def node_agent(body: Mapping[str, Any]) -> NodeAgent | None:
    """Parse an RmdNodeState; None when it names no node (not a valid object: the CRD requires spec.node)."""
    node = (body.get("spec") or {}).get("node")
    if not isinstance(node, str) or not node:
        return None
    status = body.get("status") or {}
    capabilities: dict[str, Capability] = {}
    for feature, finding in (status.get("capabilities") or {}).items():
        if isinstance(finding, Mapping):
            detail = finding.get("detail") or finding.get("reason") or ""
            capabilities[str(feature)] = Capability(bool(finding.get("supported")), str(detail))
    ready: bool | None = None
    reason = message = ""
    for condition in status.get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == READY:
            ready = {"True": True, "False": False}.get(str(condition.get("status")))
            reason = str(condition.get("reason") or "")
            message = str(condition.get("message") or "")
    endpoint = status.get("endpoint")
    return NodeAgent(
        node=node,
        endpoint=endpoint if isinstance(endpoint, str) else "",
        capabilities=capabilities,
        ready=ready,
        ready_reason=reason,
        ready_message=message,
    )


def _string_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def _string_list(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, str) and v]


def uses_selector(spec: Mapping[str, Any]) -> bool:
    return bool(_string_map(spec.get("nodeSelector")))


def candidate_nodes(spec: Mapping[str, Any], node_labels: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Nodes the spec names: those matching every nodeSelector label when a selector is set, else spec.nodes
    (including names of nodes that do not exist, so that their status can say so)."""
    selector = _string_map(spec.get("nodeSelector"))
    if selector:
        return sorted(
            node
            for node, labels in node_labels.items()
            if all(labels.get(key) == value for key, value in selector.items())
        )
    return sorted(set(_string_list(spec.get("nodes"))))


def _unsupported(agent: NodeAgent, feature: str, what: str) -> Blocked | None:
    capability = agent.capabilities.get(feature)
    if capability is None:
        return Blocked(
            PENDING,
            "CapabilitiesUnknown",
            f"the agent has not reported whether the node supports {what} ({feature}) yet",
            agent_only=True,
        )
    if not capability.supported:
        detail = f": {capability.detail}" if capability.detail else ""
        return Blocked(FAILED, "Unsupported", f"the node does not support {what} ({feature}){detail}")
    return None


def assess(node: str, exists: bool, agent: NodeAgent | None, needs: Requirements) -> Blocked | None:
    """Why `node` cannot take a workload with `needs` now, or None if its agent should be called."""
    if not exists:
        return Blocked(PENDING, "NodeNotFound", f"node {node} does not exist")
    if agent is None:
        return Blocked(
            PENDING,
            "NoAgent",
            f"no agent has reported for node {node} (no RmdNodeState {node_state_name(node)})",
        )
    if agent.ready is False:
        why = ": ".join(part for part in (agent.ready_reason, agent.ready_message) if part)
        return Blocked(
            PENDING,
            "AgentNotReady",
            f"the node's agent is not ready{': ' + why if why else ''}",
            agent_only=True,
        )
    if not agent.endpoint:
        return Blocked(
            PENDING, "NoEndpoint", "the node's agent has not published its endpoint yet", agent_only=True
        )
    if needs.rdt_l3_cat and (blocked := _unsupported(agent, RDT_L3_CAT, "RDT L3 cache allocation")):
        return blocked
    if needs.mba and (blocked := _unsupported(agent, MBA, "memory bandwidth allocation")):
        return blocked
    return None


def plan_targets(
    spec: Mapping[str, Any],
    needs: Requirements,
    node_labels: Mapping[str, Mapping[str, str]],
    agents: Mapping[str, NodeAgent],
) -> TargetPlan:
    """Split the spec's candidate nodes into targets (node -> endpoint) and blocked nodes (with reasons)."""
    targets: dict[str, str] = {}
    blocked: dict[str, Blocked] = {}
    for node in candidate_nodes(spec, node_labels):
        agent = agents.get(node)
        verdict = assess(node, node in node_labels, agent, needs)
        if verdict is not None:
            blocked[node] = verdict
        elif agent is not None:
            targets[node] = agent.endpoint
    return TargetPlan(targets, blocked)


def may_target(spec: Mapping[str, Any], node: str, current_nodes: Iterable[str]) -> bool:
    """Whether a change to `node` (labels, agent) can change this workload's targets or entries: the node is
    named in spec.nodes, may match a selector, or already has a status entry."""
    return uses_selector(spec) or node in _string_list(spec.get("nodes")) or node in set(current_nodes)
