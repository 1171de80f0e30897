"""The checks of one node: its agent, what the node supports, its kubelet's settings, its
NodeResourceTopology, its device plugin and its agent's certificate (docs/validate.md, "Per node")."""

from __future__ import annotations

from rmd_operator.validate.agent_check import check_agent
from rmd_operator.validate.capability_checks import (
    check_cpu_manager,
    check_mba,
    check_pod_resources,
    check_pod_resources_get,
    check_rapl,
    check_rdt,
    check_topology_manager,
)
from rmd_operator.validate.certificate_check import check_certificate
from rmd_operator.validate.context import Context
from rmd_operator.validate.findings import Finding
from rmd_operator.validate.resource_checks import check_device_plugin, check_nrt, check_reserved_cpus
from rmd_operator.validate.snapshot import Snapshot


def node_findings(snap: Snapshot, ctx: Context, node: str) -> list[Finding]:
    findings = [check_agent(snap, ctx, node)]
    if node not in snap.node_states:
        return findings  # nothing else is known of a node whose agent never reported
    findings += [
        check_rdt(snap, node),
        check_mba(snap, node),
        check_rapl(snap, node),
        check_cpu_manager(snap, node),
        check_topology_manager(snap, node),
        check_reserved_cpus(snap, node),
        check_pod_resources(snap, node),
        check_pod_resources_get(snap, node),
        check_nrt(snap, ctx, node),
        check_device_plugin(snap, node),
    ]
    cert = check_certificate(snap, ctx, node)
    return findings + ([cert] if cert is not None else [])
