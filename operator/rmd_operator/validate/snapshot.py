"""What `rmdctl validate` read from the cluster, as the API server returned it (plain JSON dicts), and small
readers of those objects. Built by collect.py; everything else only reads it."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from rmd_api.node_state import READY

Obj = dict[str, Any]

# Labels the chart puts on what it deploys (charts/rmd/templates/_helpers.tpl): the agent DaemonSet and the
# operator Deployment carry both; their pods carry the component label.
PART_OF_LABEL = "app.kubernetes.io/part-of"
PART_OF = "rmd-k8s"
COMPONENT_LABEL = "app.kubernetes.io/component"
AGENT_COMPONENT = "agent"
OPERATOR_COMPONENT = "operator"
# The operator's environment names the identity it expects from each agent ({node} stands for the node).
AGENT_SERVER_NAME_ENV = "RMD_OPERATOR_AGENT_SERVER_NAME"


@dataclass(frozen=True)
class PeerCertificate:
    """An agent's serving certificate as read from its endpoint (or the chart's shared Secret)."""

    der: bytes | None  # None: could not be read
    source: str  # where it came from, e.g. "10.0.3.17:50051" or "Secret rmd-system/rmd-agent-tls"
    problem: str = ""  # why it could not be read


@dataclass(frozen=True)
class Snapshot:
    namespace: str  # the release namespace: RmdNodeStates, Leases, the operator and the agents
    now: datetime  # the API server's clock when it answered (its Date header), else this machine's
    nodes: Mapping[str, Obj] = field(default_factory=dict)  # Node by name
    node_states: Mapping[str, Obj] = field(default_factory=dict)  # RmdNodeState by spec.node
    leases: Mapping[str, Obj] = field(default_factory=dict)  # agent heartbeat Lease by node
    nrts: Mapping[str, Obj] = field(default_factory=dict)  # NodeResourceTopology by name (= node)
    crds: Mapping[str, Obj | None] = field(default_factory=dict)  # each CRD this release needs -> installed
    deployments: Sequence[Obj] = ()  # in the release namespace and the scheduler namespaces
    daemonsets: Sequence[Obj] = ()  # in the release namespace
    pods: Sequence[Obj] = ()  # pods with a component label in the release namespace
    configmaps: Sequence[Obj] = ()  # in the release namespace and the scheduler namespaces
    certificates: Mapping[str, PeerCertificate] = field(default_factory=dict)  # by node
    unreadable: Mapping[str, str] = field(default_factory=dict)  # what could not be read -> why
    scheduler_name: str | None = None  # the NUMA-aware scheduler profile expected (--scheduler-name)
    scheduler_namespaces: Sequence[str] = ()  # where else its configuration was looked for


# --- readers of API objects ---


def meta(obj: Mapping[str, Any]) -> Obj:
    return obj.get("metadata") or {}


def name_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("name") or "")


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("labels") or {}


def condition(obj: Mapping[str, Any], kind: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(cond, dict) and cond.get("type") == kind:
            return cond
    return None


def ready_condition(node_state: Mapping[str, Any]) -> Obj | None:
    return condition(node_state, READY)


def capability(node_state: Mapping[str, Any], key: str) -> tuple[bool, str] | None:
    """(supported, detail) of one of the agent's capabilities; None when it does not report it."""
    value = ((node_state.get("status") or {}).get("capabilities") or {}).get(key)
    if not isinstance(value, dict):
        return None
    return bool(value.get("supported")), str(value.get("detail") or "")


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 time of the API (Time or MicroTime); None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def ago(now: datetime, then: datetime) -> str:
    """`then` relative to `now`, for people: "12s ago", "3m ago", "in 2h", "in 5d"."""
    seconds = (now - then).total_seconds()
    text = span(abs(seconds))
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([a-zA-Z]*)$")
_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(1000),
    "M": Decimal(1000) ** 2,
    "G": Decimal(1000) ** 3,
    "T": Decimal(1000) ** 4,
    "Ki": Decimal(1024),
    "Mi": Decimal(1024) ** 2,
    "Gi": Decimal(1024) ** 3,
    "Ti": Decimal(1024) ** 4,
}


def quantity(value: object) -> Decimal | None:
    """A Kubernetes quantity ("31", "500m", "4Gi"); None when it is not one this reader knows."""
    match = _QUANTITY.match(str(value).strip()) if value is not None else None
    if match is None or match.group(2) not in _SUFFIXES:
        return None
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation:
        return None


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether `labels` match a LabelSelector's matchLabels and matchExpressions (an empty one matches)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or ()
        present = key in labels
        if (
            (op == "In" and (not present or labels[key] not in values))
            or (op == "NotIn" and present and labels[key] in values)
            or (op == "Exists" and not present)
            or (op == "DoesNotExist" and present)
        ):
            return False
    return True


def is_rmd(obj: Mapping[str, Any], component: str) -> bool:
    """A Deployment or DaemonSet the chart made for `component`."""
    labels = labels_of(obj)
    return labels.get(PART_OF_LABEL) == PART_OF and labels.get(COMPONENT_LABEL) == component


def pods_of(workload: Mapping[str, Any], pods: Sequence[Obj]) -> list[Obj]:
    """The pods a Deployment or DaemonSet selects, in its namespace."""
    namespace = meta(workload).get("namespace")
    selector = (workload.get("spec") or {}).get("selector")
    return [
        p
        for p in pods
        if meta(p).get("namespace") == namespace and selector and selector_matches(selector, labels_of(p))
    ]


def pod_ready(pod: Mapping[str, Any]) -> bool:
    cond = condition(pod, "Ready")
    return cond is not None and cond.get("status") == "True"


def pod_problem(pod: Mapping[str, Any]) -> str:
    """Why a pod is not ready, in the kubelet's words: a waiting container's reason, else its phase."""
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or ():
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            reason = waiting.get("reason") or "waiting"
            message = waiting.get("message")
            return f"{container.get('name')}: {reason}" + (f" ({message})" if message else "")
    return str(status.get("phase") or "no status")
