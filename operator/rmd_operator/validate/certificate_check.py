"""The `certificate` check: the agent's serving certificate as the operator will judge it (certs.py)."""

from __future__ import annotations

from rmd_operator.validate.certs import (
    CertificateUnreadable,
    expected_name,
    issued_by,
    name_matches,
    read_certificate,
)
from rmd_operator.validate.context import Context
from rmd_operator.validate.findings import Finding, error, info, ok, warning
from rmd_operator.validate.snapshot import Snapshot, span


def check_certificate(snap: Snapshot, ctx: Context, node: str) -> Finding | None:
    """The agent's serving certificate: dates, the name the operator expects, the CA it trusts."""
    peer = snap.certificates.get(node)
    if peer is None:
        return None
    if peer.der is None:
        return info(
            node,
            "certificate",
            f"not checked: {peer.problem}",
            "rmdctl reads the certificate the agent presents at its endpoint: run it where the agents' pod "
            "IPs are reachable (e.g. in a pod of the cluster)",
        )
    try:
        cert, facts = read_certificate(peer.der)
    except CertificateUnreadable as exc:
        return error(node, "certificate", f"{peer.source}: {exc}", "see the agent's log")
    until = f"{facts.not_after:%Y-%m-%dT%H:%M:%SZ}"
    names = ", ".join(facts.dns_names) or "no DNS name"
    shared = peer.source.startswith("Secret") or any(n.startswith("*.") for n in facts.dns_names)
    renew = (
        "rotate the shared certificate: helm upgrade <release> charts/rmd -n "
        f"{snap.namespace} --reuse-values --set tls.reissue=$(date +%Y%m%d)"
        if shared
        else "an agent renews a certificate from the CSR API at two thirds of its life: look for CSR errors "
        "in the agent's log and in kubectl get csr (the operator signs them), or issue it a new one"
    )
    if snap.now >= facts.not_after:
        return error(
            node,
            "certificate",
            f"expired at {until} ({peer.source}): the operator refuses this agent, its workloads go Pending",
            renew,
        )
    if snap.now < facts.not_before:
        return error(
            node,
            "certificate",
            f"not valid before {facts.not_before:%Y-%m-%dT%H:%M:%SZ} ({peer.source}): a clock is wrong",
            "check the clocks of the node that issued it and of the operator's node (NTP)",
        )
    wanted = expected_name(ctx.server_name_pattern, node)
    if wanted is not None and not any(name_matches(n, wanted) for n in facts.dns_names):
        return error(
            node,
            "certificate",
            f"names {names}, not {wanted}, which the operator expects of this node's agent ({peer.source})",
            "the agent's certificate must be for <node>.<tls.agentDomain>; node names with dots need "
            "tls.agentCertificates: csr (docs/install.md, Certificates)",
        )
    if ctx.ca_bundle is not None and issued_by(cert, ctx.ca_bundle) is False:
        return error(
            node,
            "certificate",
            f"issued by {facts.issuer}, not by a CA of {ctx.ca_bundle_source}, which the operator trusts "
            f"({peer.source})",
            "issue the agent's certificate from the release's CA (tls.reissue, or restart the agent to ask "
            "the CSR API again)",
        )
    left = facts.not_after - snap.now
    if left < facts.warning_window():
        return warning(
            node,
            "certificate",
            f"expires in {span(left.total_seconds())}, at {until} ({peer.source}, issued by {facts.issuer})",
            renew,
        )
    return ok(
        node,
        "certificate",
        f"valid until {until} ({span(left.total_seconds())} left) for {names}, issued by {facts.issuer}",
    )
