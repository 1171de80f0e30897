"""What the simulated kubelet (rmd_sim.kubelet) decides when it admits a pod, as pure functions of the node's
state: the pod model (container resources, QoS class) and one pod's way through the resource managers.

What it reproduces (reference notes numa-topology-podresources.md §1, §2):

* QoS classes computed like Kubernetes (only cpu and memory count): Guaranteed when every container has
  cpu and memory limits and its requests equal them (a missing request defaults to the limit, as the API
  server does); BestEffort when no container sets any; Burstable otherwise.
* Exclusive CPUs, via rmd_sim.cpumanager, only for containers of Guaranteed pods with an integer CPU
  request, and only with the `static` policy. Everything else shares the pool. A pod that cannot get its
  CPUs or devices is rejected (AdmissionError) and leaves no trace, like a failed kubelet admission.
* The topology manager's `single-numa-node` policy (scope container): a container's exclusive CPUs and its
  devices that report a NUMA node must all come from one NUMA node with enough of each free (the lowest
  such node, as the kubelet's narrowest-hint rule picks it). When none has them, the pod is rejected with
  the kubelet's reason `TopologyAffinityError` and message "Resources cannot be allocated with Topology
  locality", and nothing is allocated. The other policies (`best-effort`, `restricted`) and scope `pod` are
  not modelled: they admit like `none`.
* Device-plugin resources: healthy devices not yet held are handed out, those on the NUMA nodes of the
  container's CPUs first. Which of them the plugin prefers, and its Allocate, are the kubelet's part (it
  talks to the plugins). Extended resources without a device pool are kept on the pod but never reported:
  the kubelet only reports device-plugin devices.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from rmd_sim import cpumanager
from rmd_sim.cpumanager import Topology
from rmd_sim.devicemanager import Device

CpuManagerPolicy = Literal["static", "none"]
SINGLE_NUMA_NODE = "single-numa-node"
# The kubelet's topology manager rejection (pkg/kubelet/cm/topologymanager: TopologyAffinityError).
TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"
QoS = Literal["Guaranteed", "Burstable", "BestEffort"]


# --- quantities and QoS ---

_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX: dict[str | None, Fraction] = {
    None: Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    **{s: Fraction(1024 ** (i + 1)) for i, s in enumerate(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])},
}


def parse_quantity(text: str | int) -> Fraction:
    """A Kubernetes resource quantity ("500m", "2", "1.5", "4Gi", "1e3") as an exact number."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(f"invalid resource quantity {text!r}")
    number: str = match.group(1)
    suffix: str | None = match.group(2)
    return Fraction(number) * _SUFFIX[suffix]


@dataclass(frozen=True)
class ContainerSpec:
    """A container's resources as in a pod spec; None means "not set". `resources`: extended resources."""

    name: str
    cpu_request: str | None = None
    cpu_limit: str | None = None
    memory_request: str | None = None
    memory_limit: str | None = None
    resources: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: ContainerSpec | Sequence[Any]) -> ContainerSpec:
        """Accept a ContainerSpec or a tuple (name, cpu request, cpu limit, memory, extended resources).

        In the tuple form `memory` is both request and limit, and the trailing items may be left out.
        """
        if isinstance(spec, ContainerSpec):
            return spec
        if not 1 <= len(spec) <= 5:
            raise ValueError(f"container {spec!r}: expected (name, cpu request, cpu limit, memory, extras)")
        name, cpu_request, cpu_limit, memory, resources = (*spec, None, None, None, None)[:5]
        return cls(str(name), cpu_request, cpu_limit, memory, memory, dict(resources or {}))

    def effective(self, resource: Literal["cpu", "memory"]) -> tuple[Fraction | None, Fraction | None]:
        """(request, limit) after the API server's defaulting: a missing request takes the limit.

        Zero counts as unset, as in Kubernetes' QoS computation.
        """
        raw_request, raw_limit = (
            (self.cpu_request, self.cpu_limit)
            if resource == "cpu"
            else (self.memory_request, self.memory_limit)
        )
        limit = parse_quantity(raw_limit) if raw_limit is not None else None
        request = parse_quantity(raw_request) if raw_request is not None else limit
        return (request or None, limit or None)


_QOS_RESOURCES: tuple[Literal["cpu", "memory"], ...] = ("cpu", "memory")


def qos_class(containers: Iterable[ContainerSpec]) -> QoS:
    """The pod's QoS class, from cpu and memory only (as Kubernetes' GetPodQOS)."""
    any_set = False
    guaranteed = True
    for container in containers:
        for resource in _QOS_RESOURCES:
            request, limit = container.effective(resource)
            any_set = any_set or request is not None or limit is not None
            guaranteed = guaranteed and limit is not None and request == limit
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def exclusive_cpu_count(qos: QoS, container: ContainerSpec) -> int:
    """CPUs the static policy pins for the container: its integer CPU request in a Guaranteed pod, else 0."""
    request, _ = container.effective("cpu")
    if qos != "Guaranteed" or request is None or request.denominator != 1:
        return 0
    return int(request)


# --- pods on the node ---


@dataclass
class SimPod:
    namespace: str
    name: str
    uid: str
    containers: tuple[ContainerSpec, ...]
    qos: QoS
    cpus: dict[str, frozenset[int]] = field(default_factory=dict)  # exclusive CPUs by container
    devices: dict[str, dict[str, tuple[Device, ...]]] = field(default_factory=dict)  # container -> resource
    envs: dict[str, dict[str, str]] = field(default_factory=dict)  # container -> what device plugins set
    numa: dict[str, int] = field(default_factory=dict)  # container -> its NUMA node (single-numa-node)


class AdmissionError(ValueError):
    """The pod cannot be admitted (not enough exclusive CPUs or devices, duplicate uid or name).

    `reason` is the pod status reason the kubelet gives such a rejection."""

    def __init__(self, message: str, reason: str = "UnexpectedAdmissionError") -> None:
        super().__init__(message)
        self.reason = reason


def exclusive_assignments(pods: Iterable[SimPod]) -> dict[tuple[str, str], frozenset[int]]:
    """Exclusive CPUs keyed by (pod uid, container name)."""
    return {(pod.uid, name): cpus for pod in pods for name, cpus in pod.cpus.items()}


def used_devices(pods: Iterable[SimPod]) -> set[tuple[str, str]]:
    """(resource, device id) of every device the pods hold."""
    return {
        (resource, d.id)
        for p in pods
        for per_resource in p.devices.values()
        for resource, devs in per_resource.items()
        for d in devs
    }


@dataclass(frozen=True)
class AdmissionNode:
    """What admission decides against: the node's CPUs, its managers' policies, the pods it holds by uid, and
    its healthy devices per resource (a function: device plugins may change them while a plugin is asked)."""

    topology: Topology
    reserved: frozenset[int]
    cpu_manager_policy: CpuManagerPolicy
    topology_manager_policy: str
    pods: Mapping[str, SimPod]
    devices: Callable[[], Mapping[str, tuple[Device, ...]]]


class PodAdmission:
    """One pod through the kubelet's resource managers, against `node` as it is. The node is not changed:
    the caller records `pod` once every step passed. A step raises AdmissionError when the pod does not fit.

    Construction checks the pod is new and picks each container's exclusive CPUs (and, with single-numa-node,
    its NUMA node). Devices follow: `assign_devices()` takes the first candidates; a caller that asks device
    plugins instead walks `device_requests()`, choosing among `candidates()` and passing the choice to
    `grant()`.
    """

    def __init__(
        self,
        node: AdmissionNode,
        namespace: str,
        name: str,
        uid: str,
        containers: Iterable[ContainerSpec | Sequence[Any]],
    ) -> None:
        self.node = node
        if uid in node.pods:
            raise AdmissionError(f"pod uid {uid} already exists")
        if any(p.namespace == namespace and p.name == name for p in node.pods.values()):
            raise AdmissionError(f"pod {name} already exists in namespace {namespace}")
        specs = tuple(ContainerSpec.of(c) for c in containers)
        self.pod = SimPod(namespace, name, uid, specs, qos_class(specs))
        # Devices already held, and those this pod takes as it goes.
        self._used = used_devices(node.pods.values())
        self._plan_cpus()

    def _plan_cpus(self) -> None:
        node, pod = self.node, self.pod
        topology = node.topology
        assigned = exclusive_assignments(node.pods.values())
        claimed: dict[tuple[str, int], int] = {}  # (resource, NUMA node) -> devices earlier containers take
        for spec in pod.containers:
            count = exclusive_cpu_count(pod.qos, spec) if node.cpu_manager_policy == "static" else 0
            reserved = node.reserved
            if node.topology_manager_policy == SINGLE_NUMA_NODE:
                numa = self._single_numa_node(spec, count, assigned, claimed)
                if numa is not None:
                    pod.numa[spec.name] = numa
                    reserved = reserved | (topology.ids - topology.numa_nodes[numa])
            if count:
                try:
                    cpus = cpumanager.allocate(topology, reserved, assigned, count)
                except cpumanager.NotEnoughCpus as exc:
                    raise AdmissionError(
                        f"pod {pod.namespace}/{pod.name} container {spec.name}: {exc}"
                    ) from exc
                pod.cpus[spec.name] = cpus
                assigned[(pod.uid, spec.name)] = cpus

    def _single_numa_node(
        self,
        spec: ContainerSpec,
        cpus: int,
        assigned: Mapping[tuple[str, str], frozenset[int]],
        claimed: dict[tuple[str, int], int],
    ) -> int | None:
        """The NUMA node the topology manager (single-numa-node) aligns the container to: the lowest one with
        `cpus` free exclusive CPUs and enough free devices of each requested resource that reports NUMA
        nodes. None when nothing of the container cares about NUMA (shared CPUs, no such devices).
        AdmissionError (TopologyAffinityError) when no node has it all."""
        topology = self.node.topology
        pools = self.node.devices()
        wanted = {
            resource: count
            for resource, count in self._requests(spec)
            if any(d.numa_nodes for d in pools[resource])
        }
        if not cpus and not wanted:
            return None
        free_cpus = cpumanager.free_cpus(topology, self.node.reserved, assigned)

        def fits(node: int) -> bool:
            if cpus and len(free_cpus & topology.numa_nodes[node]) < cpus:
                return False
            for resource, count in wanted.items():
                # A device counts for a NUMA node it is attached to (the device manager's hint rule).
                near = [
                    d for d in pools[resource] if node in d.numa_nodes and (resource, d.id) not in self._used
                ]
                if len(near) - claimed.get((resource, node), 0) < count:
                    return False
            return True

        node = next((n for n in sorted(topology.numa_nodes) if fits(n)), None)
        if node is None:
            raise AdmissionError(TOPOLOGY_AFFINITY_MESSAGE, reason=TOPOLOGY_AFFINITY_ERROR)
        for resource, count in wanted.items():
            claimed[(resource, node)] = claimed.get((resource, node), 0) + count
        return node

    # --- devices ---

    def _requests(self, spec: ContainerSpec) -> list[tuple[str, int]]:
        pools = self.node.devices()
        return [(r, n) for r, n in sorted(spec.resources.items()) if r in pools and n > 0]

    def device_requests(self) -> Iterator[tuple[ContainerSpec, str, int]]:
        """(container, resource, count) of every device-plugin resource the pod asks for, in admission order
        (containers in order, resources by name). Lazy: each container's requests are read from the device
        pools as they are when it comes up."""
        for spec in self.pod.containers:
            for resource, count in self._requests(spec):
                yield spec, resource, count

    def candidates(self, spec: ContainerSpec, resource: str, count: int) -> list[Device]:
        """Free healthy devices, those near the container's CPUs first (the topology hint's preference)."""
        pod = self.pod
        free = [d for d in self.node.devices()[resource] if (resource, d.id) not in self._used]
        if len(free) < count:
            raise AdmissionError(
                f"pod {pod.namespace}/{pod.name} container {spec.name}: requested number of devices "
                f"unavailable for {resource}. Requested: {count}, Available: {len(free)}"
            )
        numa = self.numa_of(spec)
        free.sort(key=lambda d: (not (d.numa_nodes and d.numa_nodes <= numa), not d.numa_nodes & numa))
        return free

    def numa_of(self, spec: ContainerSpec) -> frozenset[int]:
        """The NUMA nodes the container's devices should come from: its aligned node, else its CPUs' nodes."""
        pod = self.pod
        if spec.name in pod.numa:
            return frozenset({pod.numa[spec.name]})
        return frozenset(self.node.topology.cpu(c).numa for c in pod.cpus.get(spec.name, ()))

    def grant(self, spec: ContainerSpec, resource: str, devices: Sequence[Device]) -> None:
        self.pod.devices.setdefault(spec.name, {})[resource] = tuple(devices)
        self._used.update((resource, d.id) for d in devices)

    def assign_devices(self) -> None:
        """Grant every device request its first candidates (no device plugin is asked)."""
        for spec, resource, count in self.device_requests():
            self.grant(spec, resource, self.candidates(spec, resource, count)[:count])
