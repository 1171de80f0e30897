"""The checks of one node: its agent, what the node supports, its kubelet's settings, its
NodeResourceTopology, its device plugin and its agent's certificate (docs/validate.md, "Per node")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from rmd_api.names import CACHE_WAYS_RESOURCE
from rmd_api.node_state import (
    AGENT_STOPPED,
    CPU_MANAGER_POLICY,
    ENGINE_NOT_READY,
    ENGINE_UNAVAILABLE,
    HEARTBEAT_EXPIRED,
    MBA,
    POD_RESOURCES,
    POD_RESOURCES_GET,
    RAPL,
    RDT_L3_CAT,
    RESCTRL_MOUNTED,
    TOPOLOGY_MANAGER_POLICY,
    node_state_name,
    parse_topology_manager_detail,
)
from rmd_operator.validate.certs import (
    CertificateUnreadable,
    expected_name,
    issued_by,
    name_matches,
    read_certificate,
)
from rmd_operator.validate.context import Context, liveness
from rmd_operator.validate.findings import Finding, error, info, ok, warning
from rmd_operator.validate.snapshot import (
    Obj,
    Snapshot,
    ago,
    capability,
    meta,
    name_of,
    parse_time,
    pod_problem,
    pod_ready,
    quantity,
    ready_condition,
    span,
)

NRT_ATTR_POLICY = "topologyManagerPolicy"
NRT_ATTR_SCOPE = "topologyManagerScope"
NRT_ATTR_METHOD = "nodeTopologyPodsFingerprintMethod"
AGENT_FIELD_MANAGER = "rmd-agent"

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


def _capability_check(
    check: str,
    key: str,
    missing: Callable[[str, str], Finding],
    found: Callable[[str, str], Finding] | None = None,
) -> Callable[[Snapshot, str], Finding]:
    """A check that reports one capability: ok with its detail, or `missing(node, detail)`."""

    def run(snap: Snapshot, node: str) -> Finding:
        cap = capability(snap.node_states[node], key)
        if cap is None:
            return info(node, check, f"not reported: the agent's RmdNodeState has no {key} (an older agent?)")
        supported, detail = cap
        if supported:
            return found(node, detail) if found else ok(node, check, detail)
        return missing(node, detail)

    return run


def _no_rdt(node: str, detail: str) -> Finding:
    return warning(
        node,
        "rdt",
        f"no RDT L3 cache allocation: {detail}",
        "workloads asking for cache are not placed here. If the CPU has RDT (rdt_a, cat_l3 in "
        "/proc/cpuinfo), mount resctrl (mount -t resctrl resctrl /sys/fs/resctrl) or enable RDT in the "
        "firmware; otherwise keep the agent off this node (the chart's default nodeSelector is "
        "node-feature-discovery's feature.node.kubernetes.io/cpu-rdt.RDTL3CA label)",
    )


def check_rdt(snap: Snapshot, node: str) -> Finding:
    state = snap.node_states[node]
    mounted = capability(state, RESCTRL_MOUNTED)
    l3 = capability(state, RDT_L3_CAT)
    if l3 is not None and not l3[0] and mounted is not None and not mounted[0] and mounted[1] != l3[1]:
        return _no_rdt(node, f"{l3[1]} (resctrl: {mounted[1]})")
    return _capability_check("rdt", RDT_L3_CAT, _no_rdt, lambda n, d: ok(n, "rdt", f"L3 CAT: {d}"))(
        snap, node
    )


check_mba = _capability_check(
    "mba",
    MBA,
    lambda node, detail: info(
        node,
        "mba",
        f"no memory bandwidth allocation: {detail}",
        "workloads asking for MBA are not placed on this node; nothing to do if none need it",
    ),
    lambda node, detail: ok(node, "mba", f"MBA: {detail}"),
)

check_rapl = _capability_check(
    "rapl",
    RAPL,
    lambda node, detail: info(
        node,
        "rapl",
        f"no RAPL energy counters: {detail}",
        "the power metrics of this node stay empty (usual in VMs); on bare metal run the agent as root "
        "with the host's /sys",
    ),
    lambda node, detail: ok(node, "rapl", f"RAPL: {detail}"),
)

check_cpu_manager = _capability_check(
    "cpu-manager",
    CPU_MANAGER_POLICY,
    lambda node, detail: warning(
        node,
        "cpu-manager",
        f"the kubelet's CPU manager is not static: {detail}",
        "pods asking for intel.com/l3_cache_ways get no exclusive CPUs, so no cache: set cpuManagerPolicy: "
        "static (with a CPU reservation such as reservedSystemCPUs) in the kubelet config, drain the node, "
        "remove /var/lib/kubelet/cpu_manager_state and restart the kubelet",
    ),
    lambda node, detail: ok(node, "cpu-manager", "cpuManagerPolicy: static"),
)


def topology_manager(snap: Snapshot, node: str) -> tuple[str, str] | None:
    """(policy, scope) the node's agent read from the kubelet config."""
    cap = capability(snap.node_states[node], TOPOLOGY_MANAGER_POLICY)
    if cap is None or not cap[0]:
        return None
    return parse_topology_manager_detail(cap[1])


def check_topology_manager(snap: Snapshot, node: str) -> Finding:
    cap = capability(snap.node_states[node], TOPOLOGY_MANAGER_POLICY)
    if cap is None or not cap[0]:
        why = cap[1] if cap else "the agent's RmdNodeState does not report it"
        return info(node, "topology-manager", f"unknown: {why}", "the agent reads the kubelet config file")
    parsed = parse_topology_manager_detail(cap[1])
    if parsed is None:
        return info(node, "topology-manager", f"reported as {cap[1]!r}, which rmdctl cannot read")
    policy, scope = parsed
    if policy == "none":
        return info(
            node,
            "topology-manager",
            f"topologyManagerPolicy: none (scope {scope}): the kubelet does not keep a pod's CPUs, devices "
            "and memory on one NUMA node, so a NUMA-aware scheduler's placement is not kept",
            "for NUMA-aligned pods set topologyManagerPolicy: single-numa-node (or restricted) on every "
            "node one scheduler profile covers",
        )
    return ok(node, "topology-manager", f"topologyManagerPolicy: {policy}, scope {scope}")


def check_reserved_cpus(snap: Snapshot, node: str) -> Finding:
    """CPUs the kubelet keeps from pods' exclusive use: per NUMA zone, capacity minus allocatable cpu in the
    NodeResourceTopology (what the kubelet's GetAllocatableResources leaves out)."""
    nrt = snap.nrts.get(node)
    if nrt is None:
        return info(node, "reserved-cpus", "unknown: no NodeResourceTopology to read them from")
    per_zone = []
    for zone in nrt.get("zones") or ():
        for res in zone.get("resources") or ():
            if res.get("name") == "cpu":
                cap, alloc = quantity(res.get("capacity")), quantity(res.get("allocatable"))
                if cap is not None and alloc is not None:
                    per_zone.append((str(zone.get("name")), int(cap - alloc), int(alloc)))
    if not per_zone:
        return info(node, "reserved-cpus", "unknown: the NodeResourceTopology lists no cpu")
    reserved = sum(r for _, r, _ in per_zone)
    detail = ", ".join(f"{z}: {r}" for z, r, _ in per_zone)
    allocatable = sum(a for _, _, a in per_zone)
    static = capability(snap.node_states[node], CPU_MANAGER_POLICY)
    if reserved == 0 and static is not None and static[0]:
        return warning(
            node,
            "reserved-cpus",
            f"no CPU reserved ({detail}): with the static CPU manager exclusive pods may take every CPU "
            "from system daemons and the kubelet",
            'set reservedSystemCPUs (whole cores, e.g. "0,32") or a cpu systemReserved/kubeReserved in the '
            "kubelet config",
        )
    return ok(node, "reserved-cpus", f"{reserved} reserved ({detail}), {allocatable} for pods")


def _pod_resources_missing(node: str, detail: str) -> Finding:
    return error(
        node,
        "pod-resources",
        f"the agent cannot use the kubelet's PodResources API: {detail}",
        "without it the NodeResourceTopology has no allocations and pods get no cache ways: check that the "
        "kubelet runs and that the agent pod mounts /var/lib/kubelet/pod-resources (the chart does)",
    )


check_pod_resources = _capability_check("pod-resources", POD_RESOURCES, _pod_resources_missing)


def check_pod_resources_get(snap: Snapshot, node: str) -> Finding:
    cap = capability(snap.node_states[node], POD_RESOURCES_GET)
    if cap is None:
        return info(node, "pod-resources-get", f"not reported: the RmdNodeState has no {POD_RESOURCES_GET}")
    supported, detail = cap
    if supported:
        return ok(node, "pod-resources-get", detail)
    return info(
        node,
        "pod-resources-get",
        detail,
        "nothing breaks: pod lookups use List, which costs a listing of every pod per lookup. Enable the "
        "kubelet feature gate KubeletPodResourcesGet (on by default from Kubernetes 1.34) to use Get",
    )


def _last_write(obj: Obj) -> datetime | None:
    times = [
        parse_time(entry.get("time"))
        for entry in meta(obj).get("managedFields") or ()
        if entry.get("manager") == AGENT_FIELD_MANAGER
    ]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def check_nrt(snap: Snapshot, ctx: Context, node: str) -> Finding:
    """Present, and fresh: the NodeResourceTopology carries no timestamp (it is written only on change), so
    fresh means kept by a live agent, owned by the Node that exists now and agreeing with what the agent
    reads from the kubelet config now."""
    report = error if ctx.scheduler_deployed else warning
    scheduler_note = (
        "the NUMA-aware scheduler cannot place pods on this node"
        if ctx.scheduler_deployed
        else "a NUMA-aware scheduler would not see this node's zones"
    )
    nrt = snap.nrts.get(node)
    if nrt is None:
        return report(
            node,
            "nrt",
            f"no NodeResourceTopology {node}: {scheduler_note}",
            "the agent exports it unless nrt_enabled is false; see the agent's log for 'NodeResourceTopology "
            "refresh failed' (it recreates a deleted object within nrt_resync_seconds, 60 s)",
        )
    stale = []
    if not liveness(snap, node).alive:
        stale.append("its agent is not running, so nothing keeps it current")
    node_uid = meta(snap.nodes.get(node) or {}).get("uid")
    owners = [r for r in meta(nrt).get("ownerReferences") or () if r.get("kind") == "Node"]
    if node_uid and owners and all(r.get("uid") != node_uid for r in owners):
        stale.append(f"it belongs to an earlier Node of this name (uid {owners[0].get('uid')})")
    attributes = {str(a.get("name")): str(a.get("value")) for a in nrt.get("attributes") or ()}
    published = (attributes.get(NRT_ATTR_POLICY), attributes.get(NRT_ATTR_SCOPE))
    now = topology_manager(snap, node)
    if now is not None and published != now:
        stale.append(
            f"it says topology manager policy {published[0]}, scope {published[1]}, while the agent reads "
            f"{now[0]}, scope {now[1]} from the kubelet config"
        )
    zones = nrt.get("zones") or []
    if not zones:
        stale.append("it has no zones")
    if stale:
        return report(
            node,
            "nrt",
            f"NodeResourceTopology {node} is stale: {'; '.join(stale)}",
            "a running agent rewrites it within nrt_resync_seconds (60 s) of a change; if it does not, see "
            "the agent's log ('NodeResourceTopology refresh failed') or restart the agent",
        )
    written = _last_write(nrt)
    when = f", last changed {ago(snap.now, written)}" if written else ""
    method = attributes.get(NRT_ATTR_METHOD, "none")
    return ok(node, "nrt", f"{len(zones)} zone(s), pod fingerprint method {method}{when}")


def check_device_plugin(snap: Snapshot, node: str) -> Finding:
    """The agent's intel.com/l3_cache_ways device plugin, as the kubelet reports it in the Node."""
    node_obj = snap.nodes.get(node)
    if node_obj is None:
        return info(node, "device-plugin", f"no Node named {node}")
    status = node_obj.get("status") or {}
    alloc = (status.get("allocatable") or {}).get(CACHE_WAYS_RESOURCE)
    cap = (status.get("capacity") or {}).get(CACHE_WAYS_RESOURCE)
    rdt = capability(snap.node_states[node], RDT_L3_CAT)
    if rdt is not None and not rdt[0] and not quantity(alloc):
        return info(
            node, "device-plugin", f"no {CACHE_WAYS_RESOURCE}: the node has no RDT L3 cache allocation"
        )
    fix = (
        "the agent registers the plugin with the kubelet unless device_plugin_enabled is false: check that "
        "the agent pod mounts /var/lib/kubelet/device-plugins and look for device-plugin errors in its log"
    )
    if alloc is None:
        return warning(
            node,
            "device-plugin",
            f"the Node has no {CACHE_WAYS_RESOURCE}: the agent's device plugin is not registered with the "
            "kubelet, so pods asking for cache ways are not scheduled here",
            fix,
        )
    allocatable = quantity(alloc) or 0
    if allocatable == 0:
        capacity = quantity(cap) or 0
        why = (
            f"its {capacity} device(s) are unhealthy: the plugin's connection to the kubelet ended (agent "
            "stopped or restarting)"
            if capacity
            else "the plugin offers no ways (the guaranteed pool is empty)"
        )
        return warning(node, "device-plugin", f"{CACHE_WAYS_RESOURCE}: 0 allocatable: {why}", fix)
    return ok(node, "device-plugin", f"{CACHE_WAYS_RESOURCE}: {alloc} allocatable (capacity {cap})")


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
