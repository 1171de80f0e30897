"""The checks of what a node supports and how its kubelet is set, from the capabilities its agent
publishes in its RmdNodeState (the probe's findings; docs/probe.md)."""

from __future__ import annotations

from collections.abc import Callable

from rmd_api.node_state import (
    CPU_MANAGER_POLICY,
    MBA,
    POD_RESOURCES,
    POD_RESOURCES_GET,
    RAPL,
    RDT_L3_CAT,
    RESCTRL_MOUNTED,
    TOPOLOGY_MANAGER_POLICY,
    parse_topology_manager_detail,
)
from rmd_operator.validate.findings import Finding, error, info, ok, warning
from rmd_operator.validate.snapshot import Snapshot, capability


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
