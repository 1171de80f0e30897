"""The checks of the cluster as a whole: what could not be read, the CRDs, the operator, the agents'
DaemonSet, the NUMA-aware scheduler, and whether the nodes' topology managers agree (docs/validate.md,
"Cluster")."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from rmd_api.names import (
    NODE_RESOURCE_TOPOLOGY,
    NRT_REQUEUE_SECONDS_ANNOTATION,
    RMD_NODE_STATE,
    RMD_WORKLOAD,
)
from rmd_operator.validate import scheduler
from rmd_operator.validate.capability_checks import topology_manager
from rmd_operator.validate.context import Context
from rmd_operator.validate.crd_schema import storage_version, version_digests
from rmd_operator.validate.expected_crds import EXPECTED_CRDS
from rmd_operator.validate.findings import Finding, error, info, ok, warning
from rmd_operator.validate.resource_checks import NRT_ATTR_METHOD
from rmd_operator.validate.snapshot import (
    AGENT_COMPONENT,
    COMPONENT_LABEL,
    OPERATOR_COMPONENT,
    PART_OF,
    PART_OF_LABEL,
    Obj,
    Snapshot,
    condition,
    name_of,
    pod_problem,
    pod_ready,
    pods_of,
)

# The version of each CRD the agent and the operator read and write (rmd_api.names).
USED_VERSIONS = {r.crd_name: r.version for r in (RMD_WORKLOAD, RMD_NODE_STATE, NODE_RESOURCE_TOPOLOGY)}
APPLY_CRDS = (
    "kubectl apply --server-side -f charts/rmd/crds (Helm installs CRDs once and never upgrades them)"
)


def check_access(snap: Snapshot) -> list[Finding]:
    return [
        error(
            None,
            "access",
            f"cannot read {what}: {why}",
            "rmdctl needs read access to what it checks; docs/validate.md lists the rules (a ClusterRole)",
        )
        for what, why in sorted(snap.unreadable.items())
    ]


# wao-core's API (docs/telemetry.md): left out with nodeTelemetry.installCRDs=false, or wao-core's own CRDs in
# their place. Only node telemetry needs them, so their absence or another schema is worth knowing, no more.
OPTIONAL_CRD_GROUPS = ("wao.bitmedia.co.jp",)


def check_crds(snap: Snapshot) -> list[Finding]:
    findings = []
    for name, (storage, digests) in sorted(EXPECTED_CRDS.items()):
        if name not in snap.crds:
            continue  # not read (see the access check)
        crd = snap.crds[name]
        optional = name.partition(".")[2] in OPTIONAL_CRD_GROUPS
        if crd is None and optional:
            findings.append(info(None, "crd", f"{name} is not installed: no node telemetry", APPLY_CRDS))
            continue
        if crd is None:
            findings.append(error(None, "crd", f"{name} is not installed", APPLY_CRDS))
            continue
        established = condition(crd, "Established")
        if established is not None and established.get("status") != "True":
            findings.append(
                error(None, "crd", f"{name} is not established: {established.get('message')}", APPLY_CRDS)
            )
            continue
        installed = version_digests(crd)
        used = USED_VERSIONS.get(name, storage)
        if used not in installed:
            findings.append(
                error(
                    None,
                    "crd",
                    f"{name} does not serve {used}, which the agents and the operator use (it serves "
                    f"{', '.join(sorted(installed)) or 'nothing'})",
                    APPLY_CRDS,
                )
            )
            continue
        differ = sorted(v for v in digests if v in installed and installed[v] != digests[v])
        if differ and optional:
            findings.append(
                info(
                    None,
                    "crd",
                    f"{name}: not this release's schema (wao-core's own?): node telemetry works with "
                    "the fields both have",
                    APPLY_CRDS,
                )
            )
            continue
        if differ:
            findings.append(
                warning(
                    None,
                    "crd",
                    f"{name}: the schema of {', '.join(differ)} is not this release's (an older or newer "
                    "CRD): the API server drops fields it does not know and refuses what it does not allow",
                    APPLY_CRDS,
                )
            )
            continue
        stored = storage_version(crd)
        findings.append(ok(None, "crd", f"{name}: {used} served, stored as {stored}, schema of this release"))
    return findings


def _deployment_state(deployment: Obj, snap: Snapshot) -> tuple[bool, str]:
    """(available, description) of a Deployment, with the reason of a pod that is not ready."""
    got, wanted = scheduler.available(deployment)
    text = f"Deployment {name_of(deployment)}: {got}/{wanted} available"
    if wanted == 0:
        return False, f"{text}: scaled to 0 replicas"
    if got >= 1:
        return True, text
    problems = [
        f"pod {name_of(p)}: {pod_problem(p)}" for p in pods_of(deployment, snap.pods) if not pod_ready(p)
    ]
    return False, text + (f" ({'; '.join(problems)})" if problems else "")


def check_operator(snap: Snapshot, ctx: Context) -> Finding:
    ns = snap.namespace
    if ctx.operator is None:
        return error(
            None,
            "operator",
            f"no operator Deployment in {ns} (labels {PART_OF_LABEL}={PART_OF}, "
            f"{COMPONENT_LABEL}={OPERATOR_COMPONENT}): nobody applies RmdWorkloads or pods' cache ways",
            "install the chart (docs/install.md), or pass the release namespace with -n",
        )
    up, text = _deployment_state(ctx.operator, snap)
    if not up:
        return error(
            None,
            "operator",
            f"the operator is down: {text}",
            f"kubectl -n {ns} describe deployment {name_of(ctx.operator)}; kubectl -n {ns} logs "
            f"deployment/{name_of(ctx.operator)} (scale it back to 1 replica if someone scaled it down)",
        )
    return ok(None, "operator", text)


def check_agents(snap: Snapshot, ctx: Context) -> Finding:
    ns = snap.namespace
    ds = ctx.agent_daemonset
    if ds is None:
        if not snap.node_states:
            return error(
                None,
                "agents",
                f"no agent in {ns}: no RmdNodeState and no agent DaemonSet",
                "pass the release namespace with -n (the agents write their RmdNodeStates there), or install "
                "the chart (docs/install.md)",
            )
        return info(
            None,
            "agents",
            f"no agent DaemonSet in {ns} (labels {PART_OF_LABEL}={PART_OF}, "
            f"{COMPONENT_LABEL}={AGENT_COMPONENT}): {len(snap.node_states)} agent(s) judged by their "
            "RmdNodeState and heartbeat only",
        )
    status = ds.get("status") or {}
    desired = int(status.get("desiredNumberScheduled") or 0)
    ready = int(status.get("numberReady") or 0)
    text = f"DaemonSet {name_of(ds)}: {ready}/{desired} agent pod(s) ready"
    if desired == 0:
        template = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
        selector = template.get("nodeSelector") or {}
        return warning(
            None,
            "agents",
            f"{text}: it selects no node (nodeSelector {dict(selector)})",
            "label the nodes with RDT (node-feature-discovery does) or set agent.nodeSelector in the chart",
        )
    if ready < desired:
        return error(
            None,
            "agents",
            text,
            f"kubectl -n {ns} get pods -l {COMPONENT_LABEL}={AGENT_COMPONENT} -o wide, then describe the "
            "ones not ready",
        )
    return ok(None, "agents", text)


def _fingerprint_methods(snap: Snapshot) -> dict[str, list[str]]:
    """Pod fingerprint method -> nodes whose NodeResourceTopology says it."""
    methods: dict[str, list[str]] = defaultdict(list)
    for name, nrt in sorted(snap.nrts.items()):
        attrs = {a.get("name"): a.get("value") for a in nrt.get("attributes") or ()}
        methods[str(attrs.get(NRT_ATTR_METHOD) or "none")].append(name)
    return methods


def _requeue_delays(snap: Snapshot) -> dict[str, float]:
    """Node -> its agent's requeue echo delay (nrt_requeue_seconds), as its NodeResourceTopology says; nodes
    whose object does not say (agents before the annotation, other exporters) are left out."""
    delays: dict[str, float] = {}
    for name, nrt in snap.nrts.items():
        value = ((nrt.get("metadata") or {}).get("annotations") or {}).get(NRT_REQUEUE_SECONDS_ANNOTATION)
        if not isinstance(value, str):
            continue
        try:
            delays[name] = float(value)
        except ValueError:  # not a number: not judged either
            continue
    return delays


def _early_echo(where: str, profile: scheduler.SchedulerProfile, snap: Snapshot) -> Finding | None:
    """The agents' requeue echo must come after the scheduler's cache resync, or a pod rejected from the stale
    cache is retried against it again and then waits for the scheduler's own retry (docs/topology.md)."""
    period = profile.resync_seconds
    if period <= 0:  # no reserve cache: no stale view to retry from
        return None
    early = {n: d for n, d in sorted(_requeue_delays(snap).items()) if d <= period}
    if not early:
        return None
    delays = ", ".join(sorted({f"{d:g}s" for d in early.values()}))
    return warning(
        None,
        "scheduler",
        f"{where} resyncs its cache every {period}s, but the agents of {', '.join(early)} write their "
        f"requeue echo {delays} after a change (nrt_requeue_seconds; 0s: none), not after that resync: a pod "
        "this scheduler rejected from its stale cache then waits for the scheduler's own retry, up to 5 "
        "minutes",
        f"set the agents' nrt_requeue_seconds above {period}, e.g. {period + 1} (docs/topology.md, Choosing "
        "the delay)",
    )


def check_scheduler(snap: Snapshot) -> list[Finding]:
    profiles, problems = scheduler.all_profiles(snap.configmaps)
    findings = [
        warning(None, "scheduler", p, "fix the ConfigMap: the scheduler cannot read it either")
        for p in problems
    ]
    wanted = snap.scheduler_name
    chosen = [p for p in profiles if (p.scheduler_name == wanted if wanted else p.numa_aware)]
    namespaces = sorted({snap.namespace, *snap.scheduler_namespaces})
    if not chosen:
        if wanted:
            return [
                *findings,
                error(
                    None,
                    "scheduler",
                    f"scheduler {wanted} is not deployed: no KubeSchedulerConfiguration with profile "
                    f"{wanted} in the ConfigMaps of {', '.join(namespaces)}",
                    "deploy it (docs/validate.md, Scheduler), or name the namespace holding its "
                    "configuration with --scheduler-namespace",
                ),
            ]
        return [
            *findings,
            info(
                None,
                "scheduler",
                "no NUMA-aware scheduler deployed (no KubeSchedulerConfiguration enabling "
                f"{scheduler.NRT_PLUGIN} in the ConfigMaps of {', '.join(namespaces)})",
                "pods are placed by the default scheduler, which does not see NUMA zones or free cache ways "
                "per zone; the kubelet then refuses a pod that fits no single NUMA node "
                "(TopologyAffinityError)",
            ),
        ]
    methods = _fingerprint_methods(snap)
    for profile in chosen:
        findings.append(_profile_finding(snap, profile, methods))
    return findings


def _profile_finding(
    snap: Snapshot, profile: scheduler.SchedulerProfile, methods: Mapping[str, list[str]]
) -> Finding:
    where = f"profile {profile.scheduler_name} (ConfigMap {profile.configmap})"
    if not profile.numa_aware:
        return error(
            None,
            "scheduler",
            f"{where} does not enable {scheduler.NRT_PLUGIN} as a filter: it ignores NUMA zones",
            f"enable {scheduler.NRT_PLUGIN} in the profile's filter (or multiPoint) plugins",
        )
    deployment = scheduler.deployment_of(profile, snap.deployments)
    if deployment is None:
        return error(
            None,
            "scheduler",
            f"{where}: no Deployment in {profile.namespace} mounts this configuration, so nothing runs it",
            "deploy the scheduler with this ConfigMap (docs/validate.md, Scheduler)",
        )
    up, text = _deployment_state(deployment, snap)
    if not up:
        return error(
            None,
            "scheduler",
            f"{where} is down: {text}",
            f"kubectl -n {profile.namespace} describe deployment {name_of(deployment)}; pods naming "
            f"schedulerName {profile.scheduler_name} stay Pending meanwhile",
        )
    needs = scheduler.RESYNC_NEEDS.get(profile.resync_method)
    if profile.resync_seconds > 0 and needs is not None:
        wrong = sorted(n for method, nodes in methods.items() if method != needs for n in nodes)
        if wrong:
            published = ", ".join(f"{m} ({len(n)} node(s))" for m, n in sorted(methods.items()) if m != needs)
            return error(
                None,
                "scheduler",
                f"{where} resyncs its cache with method {profile.resync_method}, which needs the pod "
                f"fingerprint method {needs}, but the agents of {', '.join(wrong)} publish {published}: "
                "their fingerprints never match, so the scheduler never refreshes those nodes and pods stay "
                "Pending beside free CPUs",
                f"set cache.resyncMethod: {scheduler.AUTODETECT} in the {scheduler.NRT_PLUGIN} args (it "
                "follows each NRT's nodeTopologyPodsFingerprintMethod), or the agents' "
                f"nrt_pods_fingerprint_method to {needs}",
            )
    if (early := _early_echo(where, profile, snap)) is not None:
        return early
    cache = (
        f"cache resync every {profile.resync_seconds}s, method {profile.resync_method}"
        if profile.resync_seconds > 0
        else "no reserve cache (reads the NRTs as published)"
    )
    return ok(None, "scheduler", f"{where}: {text}; {cache}")


def check_topology_consistency(snap: Snapshot) -> Finding | None:
    """One scheduler profile covers every node (profiles do not partition nodes), so the nodes' topology
    manager policy and scope must agree, or the same pod is aligned on some nodes and refused on others."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for node in sorted(snap.node_states):
        found = topology_manager(snap, node)
        if found is not None:
            groups[found].append(node)
    if not groups:
        return None
    if len(groups) == 1:
        ((policy, scope), nodes) = next(iter(groups.items()))
        return ok(None, "topology-consistency", f"all {len(nodes)} node(s): policy {policy}, scope {scope}")
    listed = "; ".join(
        f"policy {p}, scope {s}: {', '.join(nodes)}" for (p, s), nodes in sorted(groups.items())
    )
    return warning(
        None,
        "topology-consistency",
        f"the nodes' topology managers differ ({listed}): one scheduler profile covers them all, and a pod "
        "fitting one NUMA node is admitted on some nodes and refused on others",
        "give every node the same topologyManagerPolicy and topologyManagerScope in its kubelet config "
        "(single-numa-node and container for NUMA-aligned pods)",
    )


def cluster_findings(snap: Snapshot, ctx: Context) -> list[Finding]:
    findings = [*check_access(snap), *check_crds(snap), check_operator(snap, ctx), check_agents(snap, ctx)]
    findings += check_scheduler(snap)
    consistency = check_topology_consistency(snap)
    return findings + ([consistency] if consistency is not None else [])
