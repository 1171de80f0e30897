"""What the per-node checks need to know about the cluster as a whole, worked out once from a Snapshot."""

from __future__ import annotations

import base64
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from rmd_api.node_state import lease_name
from rmd_operator.validate import scheduler
from rmd_operator.validate.snapshot import (
    AGENT_COMPONENT,
    AGENT_SERVER_NAME_ENV,
    OPERATOR_COMPONENT,
    PART_OF,
    PART_OF_LABEL,
    Obj,
    Snapshot,
    is_rmd,
    labels_of,
    meta,
    name_of,
    parse_time,
    pods_of,
    ready_condition,
)

# Slack before a Lease counts as expired: the API server's Date header has whole seconds, and the agents'
# clocks (which write renewTime) may be a little off the API server's.
LEASE_SLACK = timedelta(seconds=2)


@dataclass(frozen=True)
class Liveness:
    alive: bool
    expired_for: timedelta | None = None  # how long ago the heartbeat Lease expired, when it did
    renewed: str = ""  # the last renewal, for people


@dataclass(frozen=True)
class Context:
    agent_daemonset: Obj | None
    operator: Obj | None
    agent_pods: dict[str, list[Obj]] = field(default_factory=dict)  # node -> pods of the agent DaemonSet
    scheduler_deployed: bool = False  # a NUMA-aware scheduler profile runs: NRT problems are errors
    server_name_pattern: str | None = None  # the operator's agent_server_name ({node} placeholder)
    ca_bundle: bytes | None = None  # the CA the operator trusts for agents (the chart's ca-bundle ConfigMap)
    ca_bundle_source: str = ""


def _first_rmd(objects: list[Obj], component: str) -> Obj | None:
    found = sorted((o for o in objects if is_rmd(o, component)), key=name_of)
    return found[0] if found else None


def _env(deployment: Obj | None, name: str) -> str | None:
    template = (((deployment or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in template.get("containers") or ():
        for env in container.get("env") or ():
            if env.get("name") == name and isinstance(env.get("value"), str):
                return str(env["value"])
    return None


def _ca_bundle(snap: Snapshot) -> tuple[bytes | None, str]:
    """The chart's `<fullname>-ca-bundle` ConfigMap (key ca.crt) in the release namespace."""
    for cm in sorted(snap.configmaps, key=name_of):
        if (
            meta(cm).get("namespace") == snap.namespace
            and labels_of(cm).get(PART_OF_LABEL) == PART_OF
            and name_of(cm).endswith("-ca-bundle")
        ):
            data = cm.get("data") or {}
            if isinstance(data.get("ca.crt"), str):
                return data["ca.crt"].encode(), f"ConfigMap {snap.namespace}/{name_of(cm)}"
            binary = (cm.get("binaryData") or {}).get("ca.crt")
            if isinstance(binary, str):
                return base64.b64decode(binary), f"ConfigMap {snap.namespace}/{name_of(cm)}"
    return None, ""


def build_context(snap: Snapshot) -> Context:
    daemonset = _first_rmd(list(snap.daemonsets), AGENT_COMPONENT)
    operator = _first_rmd(
        [d for d in snap.deployments if meta(d).get("namespace") == snap.namespace], OPERATOR_COMPONENT
    )
    agent_pods: dict[str, list[Obj]] = defaultdict(list)
    if daemonset is not None:
        for pod in pods_of(daemonset, snap.pods):
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                agent_pods[str(node)].append(pod)
    profiles, _ = scheduler.all_profiles(snap.configmaps)
    deployed = any(
        p.numa_aware
        and (snap.scheduler_name is None or p.scheduler_name == snap.scheduler_name)
        and scheduler.deployment_of(p, snap.deployments) is not None
        for p in profiles
    )
    bundle, source = _ca_bundle(snap)
    return Context(
        agent_daemonset=daemonset,
        operator=operator,
        agent_pods=dict(agent_pods),
        scheduler_deployed=deployed,
        server_name_pattern=_env(operator, AGENT_SERVER_NAME_ENV),
        ca_bundle=bundle,
        ca_bundle_source=source,
    )


def liveness(snap: Snapshot, node: str) -> Liveness:
    """Whether the node's agent runs: Ready=True in its RmdNodeState and its heartbeat Lease (if it has one)
    renewed within the Lease's duration, on the API server's clock."""
    state = snap.node_states.get(node)
    ready = ready_condition(state) if state is not None else None
    is_ready = ready is not None and ready.get("status") == "True"
    lease = snap.leases.get(node)
    if lease is None:
        return Liveness(is_ready)
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int):
        return Liveness(is_ready, renewed=f"Lease {lease_name(node)} has no renewTime")
    expired_for = snap.now - (renewed + timedelta(seconds=duration))
    text = renewed.strftime("%Y-%m-%dT%H:%M:%SZ")
    if expired_for > LEASE_SLACK:
        return Liveness(False, expired_for=expired_for, renewed=text)
    return Liveness(is_ready, renewed=text)
