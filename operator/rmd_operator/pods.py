"""The pod flow's decisions: which pods get cache ways, what they asked for, the RmdWorkload for each
container, and what a failure means. Pure: no I/O (pod_flow.py does the calls).

A container gets an RmdWorkload `<pod>-rmd-workload-<container>` when it has a limit on
`intel.com/l3_cache_ways`, its pod's QoS class is Guaranteed, its CPU request is a whole number (so the
kubelet's static CPU manager gives it exclusive CPUs) and its annotations (pod_annotations.py) are valid.
Every annotation problem of a pod goes into one Event.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils import parse_quantity

from rmd_api.cpuset import format_cpu_list
from rmd_api.names import CACHE_WAYS_RESOURCE as CACHE_WAYS
from rmd_api.names import RMD_WORKLOAD
from rmd_api.node_state import POD_RESOURCES, POD_RESOURCES_GET, node_state_name
from rmd_operator import pod_annotations
from rmd_operator.status import (
    FAILED,
    MESSAGE_LIMIT,
    PENDING,
    SUCCESSFUL,
    UNSATISFIABLE,
    UNSUPPORTED,
    EventText,
    merge_diff,
)

WORKLOAD_INFIX = "-rmd-workload-"
LABEL_PREFIX = "rmd-operator.intel.com"
POD_LABEL = f"{LABEL_PREFIX}/pod"
POD_UID_LABEL = f"{LABEL_PREFIX}/pod-uid"
CONTAINER_LABEL = f"{LABEL_PREFIX}/container"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "rmd-operator"
GUARANTEED = "Guaranteed"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

_MAX_NAME = 253  # an object name is a DNS subdomain
_MAX_LABEL_VALUE = 63
_MAX_CPU_LIST_ITEM = 128  # the CRD's limit on one coreIds entry
_MAX_WAYS = Decimal(2**63 - 1)  # the largest whole quantity the API machinery computes with (int64)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")

# Event reasons (on the pod).
NOT_GUARANTEED = "CacheWaysNotGuaranteed"
FRACTIONAL_CPUS = "CacheWaysFractionalCpus"
INVALID_REQUEST = "InvalidCacheRequest"
IGNORED_ANNOTATION = "CacheAnnotationIgnored"
APPLIED = "CacheWaysApplied"
WORKLOAD_FAILED = "CacheWorkloadFailed"
CPUS_UNKNOWN = "CacheWaysCpusUnknown"  # Warning: the container's CPUs cannot be had from the agent (yet)
CPUS_FOUND = "CacheWaysCpusFound"  # Normal: they could after all, after such a Warning
POD_REJECTED = "CacheWaysPodRejected"  # Warning: the node's kubelet refused the pod at admission


# -- what a pod asks for -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerRequest:
    """One container's cache request, from its limit and its annotations (None: not set)."""

    container: str
    ways: int
    cache_min: int | None = None
    policy: str | None = None
    mba_percentage: int | None = None
    mba_mbps: int | None = None
    pstate_ratio: str | None = None
    pstate_monitoring: str | None = None


@dataclass(frozen=True)
class Refusal:
    """A container that asked for cache ways and gets no RmdWorkload, and why (an Event on the pod)."""

    container: str
    reason: str
    message: str


@dataclass(frozen=True)
class Invalid:
    """A container whose annotations (or ways limit) are invalid: it gets no RmdWorkload."""

    container: str
    problems: tuple[str, ...]


@dataclass(frozen=True)
class PodRequest:
    namespace: str
    name: str
    uid: str
    node: str
    containers: tuple[ContainerRequest, ...] = ()
    refusals: tuple[Refusal, ...] = ()  # not Guaranteed, fractional CPUs
    invalid: tuple[Invalid, ...] = ()
    ignored: tuple[str, ...] = ()  # annotations that look like ours but configure nothing, and why

    def names(self) -> set[str]:
        """The containers that get an RmdWorkload."""
        return {c.container for c in self.containers}


def _containers(spec: Mapping[str, Any], key: str = "containers") -> list[Mapping[str, Any]]:
    return [c for c in spec.get(key) or () if isinstance(c, Mapping)]


def _resources(container: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    resources = container.get("resources") or {}
    values = resources.get(kind) if isinstance(resources, Mapping) else None
    return values if isinstance(values, Mapping) else {}


def _quantity(value: Any) -> Decimal | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        parsed: Decimal = parse_quantity(value)  # type: ignore[no-untyped-call]  # untyped library
    except (ValueError, TypeError, InvalidOperation):
        return None
    # "NaN" and "Infinity" parse, but are no quantity (the API server refuses them); NaN cannot be compared.
    return parsed if parsed.is_finite() else None


def asks_for_cache_ways(spec: Mapping[str, Any]) -> bool:
    """Whether any app container has a limit on intel.com/l3_cache_ways (the watch filter: cheap)."""
    return any(CACHE_WAYS in _resources(c, "limits") for c in _containers(spec))


def qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class: the API server's (status.qosClass) when set, else computed the same way."""
    given = (pod.get("status") or {}).get("qosClass")
    if isinstance(given, str) and given:
        return given
    spec = pod.get("spec") or {}
    containers = _containers(spec) + _containers(spec, "initContainers")
    guaranteed = bool(containers)
    any_set = False
    for container in containers:
        requests, limits = _resources(container, "requests"), _resources(container, "limits")
        for resource in ("cpu", "memory"):
            limit, request = _quantity(limits.get(resource)), _quantity(requests.get(resource))
            if request is None:
                request = limit  # the API server defaults a missing request to the limit
            any_set = any_set or bool(limit) or bool(request)
            if not limit or request != limit:
                guaranteed = False
    if guaranteed:
        return GUARANTEED
    return "Burstable" if any_set else "BestEffort"


def _cpu_request(container: Mapping[str, Any]) -> Decimal | None:
    request = _quantity(_resources(container, "requests").get("cpu"))
    return request if request is not None else _quantity(_resources(container, "limits").get("cpu"))


def _asking(spec: Mapping[str, Any]) -> dict[str, tuple[Mapping[str, Any], int]]:
    """name -> (container, ways) of the app containers with a positive intel.com/l3_cache_ways limit."""
    asking: dict[str, tuple[Mapping[str, Any], int]] = {}
    for container in _containers(spec):
        ways = _quantity(_resources(container, "limits").get(CACHE_WAYS))
        if ways is not None and ways > 0:
            # The API server keeps a limit such as 1e1000000 (as "10e999999"); making an int of it took the
            # operator half a minute. Capped, it is still refused by the range check (or set by a policy).
            asking[str(container.get("name"))] = (container, int(min(ways, _MAX_WAYS)))
    return asking


def pod_request(pod: Mapping[str, Any]) -> PodRequest:
    """What the pod asks for: a request per qualifying container, a refusal per container that asked for
    cache ways but cannot have them (container "" for the whole pod), the containers whose annotations are
    invalid, and the annotations that configure nothing. The annotations of every container that asks are
    checked, also when it gets nothing for another reason, so that one look shows every problem."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    asking = _asking(spec)
    names = {str(c.get("name")) for c in _containers(spec)}
    given, ignored = pod_annotations.gather(meta.get("annotations") or {}, asking, names)
    requests: list[ContainerRequest] = []
    refused: list[Refusal] = []
    invalid: list[Invalid] = []
    qos = qos_class(pod) if asking else GUARANTEED
    if qos != GUARANTEED:
        message = (
            f"the pod's QoS class is {qos}: {CACHE_WAYS} is only enforced for Guaranteed pods (requests "
            "equal to limits for cpu and memory in every container), whose containers with whole CPUs get "
            "exclusive CPUs; no RmdWorkload is created"
        )
        refused.append(Refusal("", NOT_GUARANTEED, message))
    for name, (container, ways) in sorted(asking.items()):
        settings = pod_annotations.container_settings(ways, given.get(name, {}))
        if settings.problems:
            invalid.append(Invalid(name, settings.problems))
        cpu = _cpu_request(container)
        if qos == GUARANTEED and (cpu is None or cpu <= 0 or cpu != cpu.to_integral_value()):
            cpus = "no" if cpu is None else format(cpu.normalize(), "f")
            refused.append(
                Refusal(
                    name,
                    FRACTIONAL_CPUS,
                    f"container {name} requests {cpus} CPUs: {CACHE_WAYS} "
                    "needs a whole number of CPUs (only those get exclusive CPUs from the static CPU "
                    "manager); no RmdWorkload is created",
                )
            )
        elif qos == GUARANTEED and not settings.problems:
            requests.append(ContainerRequest(name, ways, **settings.values))
    return PodRequest(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        node=str(spec.get("nodeName") or ""),
        containers=tuple(requests),
        refusals=tuple(refused),
        invalid=tuple(invalid),
        ignored=tuple(ignored),
    )


def refusal_event(refusal: Refusal) -> EventText:
    return EventText("Warning", refusal.reason, refusal.message)


def annotation_event(request: PodRequest) -> EventText | None:
    """One Warning with every annotation problem of the pod, or None: the containers whose annotations are
    invalid (they get no RmdWorkload) and the annotations that configure nothing (the rest goes ahead). At
    most an Event's MESSAGE_LIMIT characters: the problems that do not fit are counted, and listed in the
    next Event once these are fixed."""
    sections: list[_Section] = [
        (f"container {i.container}: ", i.problems, "; no RmdWorkload is created") for i in request.invalid
    ]
    if request.ignored:
        sections.append(("annotations ignored: ", request.ignored, ""))
    if not sections:
        return None
    reason = INVALID_REQUEST if request.invalid else IGNORED_ANNOTATION
    total = sum(len(items) for _, items, _ in sections)
    message = _listed(sections, total)
    if len(message) > MESSAGE_LIMIT:
        message = _cut(sections, 0, total)
        for shown in range(1, total):  # stops after a handful: a problem takes about 100 characters
            longer = _cut(sections, shown, total)
            if len(longer) > MESSAGE_LIMIT:
                break
            message = longer
    return EventText("Warning", reason, message)


_Section = tuple[str, Sequence[str], str]  # head, problems, tail


def _listed(sections: Sequence[_Section], shown: int) -> str:
    """The sections with their first `shown` problems in all; a section none of whose problems is shown is
    left out."""
    parts = []
    for head, items, tail in sections:
        if shown <= 0:
            break
        parts.append(head + "; ".join(items[:shown]) + tail)
        shown -= len(items)
    return ". ".join(parts)


def _cut(sections: Sequence[_Section], shown: int, total: int) -> str:
    listed, rest = _listed(sections, shown), total - shown
    more = f"{rest} more problem{'s' if rest > 1 else ''} not shown"
    return (f"{listed}. " if listed else "") + (
        f"{more} (an Event holds {MESSAGE_LIMIT} characters): fix these, and the next Event lists them"
    )


# -- the RmdWorkload of a container --------------------------------------------------------------------------


def workload_name(pod: str, container: str) -> str:
    """`<pod>-rmd-workload-<container>`, as rmd-operator named it; when that exceeds an object name's 253
    characters the pod part is cut and a hash of the full name keeps it unique."""
    name = f"{pod}{WORKLOAD_INFIX}{container}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    keep = _MAX_NAME - len(WORKLOAD_INFIX) - len(container) - len(digest) - 1
    return f"{pod[:keep].rstrip('.-')}-{digest}{WORKLOAD_INFIX}{container}"


def core_ids(cpus: Iterable[int]) -> list[str]:
    """The cpus as coreIds entries: one cpu list, split where it would pass the CRD's 128 characters."""
    items = format_cpu_list(cpus).split(",") if cpus else []
    entries: list[str] = []
    for item in items:
        if entries and len(entries[-1]) + 1 + len(item) <= _MAX_CPU_LIST_ITEM:
            entries[-1] += "," + item
        else:
            entries.append(item)
    return entries


def labels(request: PodRequest, container: str) -> dict[str, str]:
    out = {MANAGED_BY_LABEL: MANAGED_BY, POD_UID_LABEL: request.uid, CONTAINER_LABEL: container}
    if len(request.name) <= _MAX_LABEL_VALUE and _LABEL_VALUE.fullmatch(request.name):
        out[POD_LABEL] = request.name
    return out


def workload_spec(request: PodRequest, container: ContainerRequest, cpus: Iterable[int]) -> dict[str, Any]:
    """The RmdWorkload spec (v0.3 layout) for a container on its exclusive `cpus`."""
    spec: dict[str, Any] = {"coreIds": core_ids(cpus), "nodes": [request.node]}
    rdt: dict[str, Any] = {}
    if container.policy is not None:
        spec["policy"] = container.policy  # the policy sets the ways (with cache ways too, the agent refuses)
    else:
        low = container.cache_min if container.cache_min is not None else container.ways
        rdt["cache"] = {"max": container.ways, "min": low}
    if container.mba_percentage is not None:
        rdt["mba"] = {"percentage": container.mba_percentage}
    elif container.mba_mbps is not None:
        rdt["mba"] = {"mbps": container.mba_mbps}
    if rdt:
        spec["rdt"] = rdt
    pstate: dict[str, str] = {}
    if container.pstate_ratio is not None:
        pstate["ratio"] = container.pstate_ratio
    if container.pstate_monitoring is not None:
        pstate["monitoring"] = container.pstate_monitoring
    if pstate:
        spec["plugins"] = {"pstate": pstate}
    return spec


def owner_reference(request: PodRequest) -> dict[str, Any]:
    # controller: the pod owns it; blockOwnerDeletion: a foreground delete of the pod waits for it.
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": request.name,
        "uid": request.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def workload_body(request: PodRequest, container: ContainerRequest, cpus: Iterable[int]) -> dict[str, Any]:
    """The whole RmdWorkload for a container, owned by its pod (the garbage collector deletes it with it)."""
    return {
        "apiVersion": RMD_WORKLOAD.api_version,
        "kind": RMD_WORKLOAD.kind,
        "metadata": {
            "name": workload_name(request.name, container.container),
            "namespace": request.namespace,
            "labels": labels(request, container.container),
            "ownerReferences": [owner_reference(request)],
        },
        "spec": workload_spec(request, container, cpus),
    }


def owner_pod_uid(workload: Mapping[str, Any]) -> str | None:
    """The uid of the Pod controlling an RmdWorkload, or None (not a pod flow workload)."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or ():
        if (
            isinstance(ref, Mapping)
            and ref.get("kind") == "Pod"
            and ref.get("apiVersion") == "v1"
            and ref.get("controller")
        ):
            return str(ref.get("uid") or "")
    return None


def workload_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch bringing an existing RmdWorkload's spec and our labels to `desired`; None when they
    already match (compare before write). Labels other tools added are left alone."""
    patch: dict[str, Any] = {}
    spec = merge_diff(current.get("spec") or {}, desired.get("spec") or {})
    if spec is not None:
        patch["spec"] = spec
    have_labels = (current.get("metadata") or {}).get("labels") or {}
    want_labels = (desired.get("metadata") or {}).get("labels") or {}
    changed = {k: v for k, v in want_labels.items() if have_labels.get(k) != v}
    if changed:
        patch["metadata"] = {"labels": changed}
    return patch or None


# -- the outcome on the node ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeState:
    """The workload's state on the pod's node, for the generation its status describes."""

    status: str  # Successful, Failed or Pending
    response: str
    cos_name: str = ""
    cores: str = ""
    reason: str = ""  # of a Failed or Pending entry (status.py); "" when the entry has none

    @property
    def never_fits(self) -> bool:
        """Failed for good on this node: the agent says the node can never take the request as it is
        (Unsatisfiable: more ways than one L3 cache's pool holds, MBA the node lacks, ...), or the node lacks
        the feature (Unsupported). Capacity and conflicts (Rejected) may pass later."""
        return self.status == FAILED and self.reason in (UNSATISFIABLE, UNSUPPORTED)


def node_state(workload: Mapping[str, Any], node: str) -> NodeState | None:
    """The status entry of `node`, if the status describes the current spec (observedGeneration)."""
    meta = workload.get("metadata") or {}
    status = workload.get("status") or {}
    if status.get("observedGeneration") != meta.get("generation"):
        return None
    entry = (status.get("workloadStates") or {}).get(node)
    if not isinstance(entry, Mapping) or entry.get("status") not in (SUCCESSFUL, FAILED, PENDING):
        return None
    cores = ",".join(str(c) for c in entry.get("coreIds") or ())
    return NodeState(
        str(entry["status"]),
        str(entry.get("response") or ""),
        str(entry.get("cosName") or ""),
        cores,
        str(entry.get("reason") or ""),
    )


def applied_event(container: str, workload: str, node: str, ways: str, state: NodeState) -> EventText:
    where = ", ".join(p for p in (f"cpus {state.cores}" if state.cores else "", state.cos_name) if p)
    return EventText(
        "Normal",
        APPLIED,
        f"container {container}: {ways} applied on node {node} by RmdWorkload {workload}"
        + (f" ({where})" if where else ""),
    )


@dataclass(frozen=True)
class FailureDecision:
    delete_pod: bool
    event: EventText


def on_failure(
    delete_failed_pods: bool, container: str, workload: str, node: str, why: str, *, never_fits: bool = False
) -> FailureDecision:
    """What to do when a container's cache request failed on the pod's node: delete the pod (rmd-operator's
    documented behaviour: the pod's controller may place a new one elsewhere, or here once capacity or CPUs
    are free), or keep it and only report.

    A failure that can never pass on this node (`never_fits`: more ways than one L3 cache's pool holds, a
    kubelet without exclusive CPUs, ...) never deletes the pod: its controller would create it again, the
    scheduler (which counts the ways of all the node's L3 caches) may place it on the same node again, and so
    on forever. The Event, posted once, says why and what to change."""
    failed = f"container {container}: RmdWorkload {workload} failed on node {node}: {why}"
    if never_fits:
        message = (
            f"{failed}. This cannot change on node {node}, so the pod is not deleted (its controller would "
            "only create it again, and the scheduler may place it on this node again): it keeps running "
            "without cache ways. Change the request, or keep the pod off this node"
        )
        event = EventText("Warning", WORKLOAD_FAILED, message, once=f"never-fits/{container}/{why}")
        return FailureDecision(False, event)
    if delete_failed_pods:
        action = "deleting the pod (delete_failed_pods)"
    else:
        action = "the pod keeps running without it (delete_failed_pods is false)"
    return FailureDecision(delete_failed_pods, EventText("Warning", WORKLOAD_FAILED, f"{failed}; {action}"))


# -- the kubelet's part --------------------------------------------------------------------------------------


def awaiting_kubelet(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's kubelet has not taken it yet: Pending without a start time. The kubelet sets
    status.startTime with its first status of the pod, after admission (a pod it refuses turns Failed), so
    until then there are no CPUs to ask its agent for."""
    status = pod.get("status") or {}
    return status.get("phase") == "Pending" and not status.get("startTime")


_ADMISSION_ADVICE = {
    "TopologyAffinityError": (
        "Its topology manager (policy single-numa-node or restricted) found no NUMA node with the CPUs and "
        f"the {CACHE_WAYS} of each container free together. A container's ways come from one L3 cache, so it "
        "can have at most one L3 cache's guaranteed pool, next to its CPUs (the node's capacity adds up all "
        "its L3 caches): lower the container's cache ways (or CPUs), or free some on that node. The kubelet "
        "does not retry; a Deployment's or ReplicaSet's new pod may be placed on the same node again"
    ),
    "UnexpectedAdmissionError": (
        f"The kubelet could not allocate the pod's devices or CPUs: typically the rmd agent's {CACHE_WAYS} "
        "device plugin on that node has fewer healthy ways than the Node's allocatable says, or failed the "
        "kubelet's Allocate call. Check the rmd-agent pod on that node (its log) and the Node's allocatable "
        f"{CACHE_WAYS}"
    ),
    "SMTAlignmentError": (
        "The static CPU manager's option full-pcpus-only needs whole physical cores: ask for a multiple of "
        "the node's threads per core"
    ),
}


def admission_rejection(pod: Mapping[str, Any]) -> EventText | None:
    """The Warning for a pod its kubelet refused at admission (phase Failed, with the kubelet's reason: a
    topology manager, device, CPU or resource-fit rejection), or None. Such a pod never ran: nothing is
    created for it, and the Event is posted once."""
    status = pod.get("status") or {}
    reason = str(status.get("reason") or "")
    if status.get("phase") != "Failed" or not reason:
        return None
    advice = _ADMISSION_ADVICE.get(reason)
    if advice is None and reason.startswith("OutOf"):
        advice = (
            f"The node had not enough {reason.removeprefix('OutOf')} left when its kubelet admitted the pod "
            "(taken by another pod after scheduling, or devices lost): create the pod again (a controller "
            "does that by itself)"
        )
    if advice is None:
        return None
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    kubelet_said = ": ".join(part for part in (reason, str(status.get("message") or "")) if part)
    return EventText(
        "Warning",
        POD_REJECTED,
        f"the kubelet of node {node} rejected the pod at admission ({kubelet_said}), so no container gets "
        f"cache ways and no RmdWorkload is created. {advice}",
        once=f"rejected/{reason}",
    )


# -- why a container's CPUs cannot be had -------------------------------------------------------------------


@dataclass(frozen=True)
class CpuLookupProblem:
    """Why the flow cannot get a container's CPUs from its node's agent. `key` (container and kind of trouble)
    tells problems apart: the flow posts one Warning per pod and key, not one per retry."""

    key: str
    event: EventText


_RETRYING = "; retrying"


def _agent_lookup(container: str) -> str:
    return f"container {container}: cannot get its exclusive CPUs from the rmd agent"


def no_agent_problem(container: str, node: str, waited: float) -> CpuLookupProblem:
    """No RmdNodeState with an endpoint for the pod's node, for `waited` seconds."""
    return CpuLookupProblem(
        f"{container}/no-agent",
        EventText(
            "Warning",
            CPUS_UNKNOWN,
            f"{_agent_lookup(container)}: no rmd agent has published an endpoint for node {node} for "
            f"{waited:.0f}s. Check that the rmd-agent DaemonSet has a running pod on that node and that its "
            f"RmdNodeState {node_state_name(node)} shows an endpoint{_RETRYING}",
        ),
    )


def call_failed_problem(
    container: str, node: str, endpoint: str, code: str, message: str
) -> CpuLookupProblem:
    """GetContainerCpus failed: the agent is unreachable, its kubelet is, or the agent refused the call."""
    answer = f"{code}: {message}" if message else code
    if code == "UNAVAILABLE" and message.startswith("kubelet PodResources"):
        # The agent answered, but could not ask its kubelet (rmd_agent.kubelet.podresources' message).
        key = "kubelet"
        text = (
            f"{_agent_lookup(container)} of node {node}: the agent cannot ask the kubelet's PodResources API "
            f"({answer}). Check that the kubelet runs on the node and that the agent pod mounts its "
            f"pod-resources directory; `rmd-agent probe` on the node (or the {POD_RESOURCES} and "
            f"{POD_RESOURCES_GET} capabilities in RmdNodeState {node_state_name(node)}) shows what the agent "
            "sees"
        )
    elif code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        key = "agent-unreachable"
        text = (
            f"{_agent_lookup(container)} of node {node} at {endpoint}: {answer}. Check that the agent pod "
            f"on that node runs and is ready (RmdNodeState {node_state_name(node)}) and that the operator "
            f"can reach {endpoint} (network policies, firewalls)"
        )
    elif code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        key = "agent-refused"
        text = (
            f"{_agent_lookup(container)} of node {node}: the agent refused the operator's call ({answer}). "
            "Check the operator's client certificate and the agents' allowed clients (docs/security.md)"
        )
    else:
        key = f"agent-error-{code}"
        text = f"{_agent_lookup(container)} of node {node}: {answer}. See the agent's log on that node"
    return CpuLookupProblem(f"{container}/{key}", EventText("Warning", CPUS_UNKNOWN, text + _RETRYING))


def not_allocated_problem(container: str, node: str, detail: str, waited: float) -> CpuLookupProblem:
    """The agent answered, but the kubelet reports no CPUs for the container yet, for `waited` seconds."""
    return CpuLookupProblem(
        f"{container}/not-allocated",
        EventText(
            "Warning",
            CPUS_UNKNOWN,
            f"container {container}: the kubelet of node {node} reports no CPUs for it after {waited:.0f}s "
            f"({detail or 'no detail'}). Check that the pod was admitted and runs on that node (kubectl "
            "describe pod); `rmd-agent probe` on the node (or RmdNodeState "
            f"{node_state_name(node)}) shows which PodResources API the agent uses{_RETRYING}",
        ),
    )


def cpus_found_event(container: str, node: str, cpus: Iterable[int]) -> EventText:
    return EventText(
        "Normal",
        CPUS_FOUND,
        f"container {container}: the agent of node {node} reports its CPUs {format_cpu_list(cpus)} now",
    )


def pod_reference(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The least of a pod an Event needs (kopf builds the involvedObject from it)."""
    meta = pod.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta},
    }
