"""The checks of what the scheduler and the kubelet see of a node: its NodeResourceTopology (present,
fresh), the CPUs its kubelet reserves, and the agent's device plugin in the Node."""

from __future__ import annotations

from datetime import datetime

from rmd_api.names import CACHE_WAYS_RESOURCE
from rmd_api.node_state import CPU_MANAGER_POLICY, RDT_L3_CAT
from rmd_operator.validate.capability_checks import topology_manager
from rmd_operator.validate.context import Context, liveness
from rmd_operator.validate.findings import Finding, error, info, ok, warning
from rmd_operator.validate.snapshot import Obj, Snapshot, ago, capability, meta, parse_time, quantity

NRT_ATTR_POLICY = "topologyManagerPolicy"
NRT_ATTR_SCOPE = "topologyManagerScope"
NRT_ATTR_METHOD = "nodeTopologyPodsFingerprintMethod"
AGENT_FIELD_MANAGER = "rmd-agent"


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
