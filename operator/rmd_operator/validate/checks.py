"""Every check over one Snapshot: the cluster's findings first, then each node's, in a fixed order."""

from __future__ import annotations

from rmd_operator.validate.cluster_checks import cluster_findings
from rmd_operator.validate.context import build_context
from rmd_operator.validate.findings import Finding
from rmd_operator.validate.node_checks import node_findings
from rmd_operator.validate.snapshot import Snapshot


def checked_nodes(snap: Snapshot, agent_pod_nodes: set[str]) -> list[str]:
    """The nodes with an agent: those with an RmdNodeState, and those where the agent DaemonSet put a pod."""
    return sorted(set(snap.node_states) | agent_pod_nodes)


def validate(snap: Snapshot, skip: frozenset[str] = frozenset()) -> list[Finding]:
    """The findings, without those of the checks named in `skip`."""
    ctx = build_context(snap)
    findings = cluster_findings(snap, ctx)
    for node in checked_nodes(snap, set(ctx.agent_pods)):
        findings += node_findings(snap, ctx, node)
    return [f for f in findings if f.check not in skip]
