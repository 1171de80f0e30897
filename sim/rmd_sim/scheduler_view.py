"""The NUMA-aware scheduler's view of a node's pods, restated from pod specs for tests: which pods the
scheduler-plugins NodeResourceTopologyMatch plugin counts in its pod fingerprint (`with-exclusive-resources`,
reference numa-scheduler-interop.md) and the fingerprint it computes from them. Tests compare it with what the
agent publishes, which only sees what the kubelet exposes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from fractions import Fraction
from typing import Any

from rmd_agent.nrt.fingerprint import fingerprint
from rmd_sim.kubelet_admission import parse_quantity

Obj = Mapping[str, Any]


def container_requests(container: Obj) -> dict[str, Fraction]:
    """Requests after the API server's defaulting: a resource with a limit and no request requests it."""
    resources = container.get("resources", {})
    requests = {name: parse_quantity(v) for name, v in resources.get("requests", {}).items()}
    for name, value in resources.get("limits", {}).items():
        requests.setdefault(name, parse_quantity(value))
    return requests


def container_limits(container: Obj) -> dict[str, Fraction]:
    return {name: parse_quantity(v) for name, v in container.get("resources", {}).get("limits", {}).items()}


def container_qos(container: Obj) -> str:
    requests, limits = container_requests(container), container_limits(container)
    classes = set()
    for name in ("cpu", "memory"):
        request, limit = requests.get(name, Fraction(0)), limits.get(name, Fraction(0))
        if request != limit:
            return "Burstable"
        classes.add("BestEffort" if request == 0 else "Guaranteed")
    return classes.pop() if len(classes) == 1 else "Burstable"


def pod_qos(pod: Obj) -> str:
    """Kubernetes' QoS class (GetPodQOS): every container, init containers included, counts."""
    if pod.get("status", {}).get("qosClass"):
        return str(pod["status"]["qosClass"])
    spec = pod["spec"]
    classes = {container_qos(c) for c in [*spec.get("initContainers", []), *spec["containers"]]}
    return classes.pop() if len(classes) == 1 else "Burstable"


def steady_containers(pod: Obj) -> list[Obj]:
    """Sidecars (init containers with restartPolicy Always) and regular containers."""
    spec = pod["spec"]
    sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    return [*sidecars, *spec["containers"]]


def native(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def exclusive_request(qos: str, name: str, amount: Fraction, nrt: Collection[str]) -> bool:
    """Whether one request makes the pod count: an NRT-listed extended resource in any pod; in a Guaranteed
    pod an integral CPU amount, memory or hugepages."""
    if not native(name):
        return name in nrt
    if qos != "Guaranteed" or amount <= 0:
        return False
    if name == "cpu":
        return amount.denominator == 1
    return name == "memory" or name.startswith("hugepages-")


def scheduler_counts(pod: Obj, nrt: Collection[str]) -> bool:
    """scheduler-plugins' with-exclusive-resources rule, over the pod spec."""
    qos = pod_qos(pod)
    return any(
        exclusive_request(qos, name, amount, nrt)
        for container in steady_containers(pod)
        for name, amount in container_requests(container).items()
    )


def scheduler_fingerprint(pods: Iterable[Obj], nrt: Collection[str]) -> str:
    """The fingerprint the scheduler computes for these pods (those bound to the node and not finished)."""
    return fingerprint(
        (p["metadata"]["namespace"], p["metadata"]["name"])
        for p in pods
        if p.get("status", {}).get("phase") not in ("Succeeded", "Failed") and scheduler_counts(p, nrt)
    )
