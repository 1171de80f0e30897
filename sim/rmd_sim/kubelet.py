"""A simulated kubelet: pods on one node, the static CPU manager, the PodResources v1 gRPC server and
`cpu_manager_state`.

What it reproduces (reference notes numa-topology-podresources.md §1, §2):

* QoS classes computed like Kubernetes (only cpu and memory count): Guaranteed when every container has
  cpu and memory limits and its requests equal them (a missing request defaults to the limit, as the API
  server does); BestEffort when no container sets any; Burstable otherwise.
* Exclusive CPUs, via rmd_sim.cpumanager, only for containers of Guaranteed pods with an integer CPU
  request, and only with the `static` policy. Everything else shares the pool. A pod that cannot get its
  CPUs or devices is rejected (add_pod raises) and leaves no trace, like a failed kubelet admission.
* The topology manager's `single-numa-node` policy (scope container; `topologyManagerPolicy` of the tree's
  kubelet config, default `none`): a container's exclusive CPUs and its devices that report a NUMA node
  must all come from one NUMA node with enough of each free (the lowest such node, as the kubelet's
  narrowest-hint rule picks it). When none has them, the pod is rejected with the kubelet's reason
  `TopologyAffinityError` and message "Resources cannot be allocated with Topology locality", and nothing
  is allocated. The other policies (`best-effort`, `restricted`) and scope `pod` are not modelled: they
  admit like `none`.
* Device-plugin resources: from a static pool (`devices`) or, with `device_plugins=True`, from real device
  plugins that register on `<root>/var/lib/kubelet/device-plugins/kubelet.sock` (rmd_sim.devicemanager).
  Healthy devices not yet held are handed out, those on the NUMA nodes of the container's CPUs first (the
  plugin's GetPreferredAllocation picks among them when it offers it); `admit_pod` then calls the plugin's
  Allocate and keeps the environment it answers on the pod (`SimPod.envs`). Extended resources without
  a device pool are kept on the pod but never reported: the kubelet only reports device-plugin devices.
* PodResourcesLister: List = every pod added and not removed (the active pods), containers' `cpu_ids`
  only the exclusive CPUs; GetAllocatableResources = online CPUs minus the reserved set (empty with
  policy `none`) and all devices; Get = one pod, else the error "pod <name> in namespace <ns> not found".
  The real kubelet returns that as a plain Go error (status UNKNOWN); here the status is NOT_FOUND unless
  `not_found_code` says otherwise. `get_enabled=False` (`--get-disabled`; an attribute tests may flip
  while it serves, like a kubelet restarted with other gates) answers Get like a 1.27-1.35 kubelet whose
  KubeletPodResourcesGet gate is off: status UNKNOWN, "PodResources API Get method disabled". The
  kubelet's rate limit (100 qps, burst 10, RESOURCE_EXHAUSTED "rejected by rate limit") applies. No memory
  manager: memory blocks are never reported.
* `<root>/var/lib/kubelet/cpu_manager_state` (v2 format, valid checksum), rewritten after every change
  through a temp file in the same directory, fsync and rename, as the kubelet's checkpoint manager does.
* What the kubelet makes on the node for an admitted pod: its cgroup, under the parent of its QoS class, in
  every cgroup hierarchy of the tree that has the kubelet's pod root (cgroupfs driver `kubepods/pod<uid>`,
  `kubepods/burstable/pod<uid>`, `kubepods/besteffort/pod<uid>`; systemd driver `kubepods.slice/
  kubepods-pod<uid_>.slice`, `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice`,
  ...), and its log directory `var/log/pods/<namespace>_<name>_<uid>/<container>/`. Both go with the pod.
  A tree without a pod root gets no cgroups (the real kubelet would not start).

Tests can freeze the server with `stall()` / `resume()` to exercise client deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import grpc
import grpc.aio
import yaml

from rmd_api.cpuset import format_cpu_list, parse_cpu_list
from rmd_api.kubelet.checkpoint import encode_cpu_manager_state_v2
from rmd_api.kubelet.podresources.v1 import api_pb2, api_pb2_grpc
from rmd_sim import cpumanager
from rmd_sim.cpumanager import Cpu, Topology
from rmd_sim.devicemanager import PLUGIN_DIR_REL, Device, DeviceManager, PluginCallFailed

log = logging.getLogger(__name__)

SOCKET_REL = "var/lib/kubelet/pod-resources/kubelet.sock"
STATE_REL = "var/lib/kubelet/cpu_manager_state"
CONFIG_REL = "var/lib/kubelet/config.yaml"
CGROUP_REL = "sys/fs/cgroup"
POD_LOGS_REL = "var/log/pods"
MAX_UNIX_PATH = 107  # sun_path is 108 bytes including the terminating NUL

CpuManagerPolicy = Literal["static", "none"]
SINGLE_NUMA_NODE = "single-numa-node"
# The kubelet's topology manager rejection (pkg/kubelet/cm/topologymanager: TopologyAffinityError).
TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"
QoS = Literal["Guaranteed", "Burstable", "BestEffort"]

_add_servicer: Any = api_pb2_grpc.add_PodResourcesListerServicer_to_server  # generated without annotations


# --- quantities and QoS (pure) ---

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


# --- host tree ---


def read_topology(host_root: Path) -> Topology:
    """CPUs of a host tree from sysfs: package and core ids per CPU, NUMA node from nodeN/cpulist."""
    cpu_dir = host_root / "sys/devices/system/cpu"
    node_dir = host_root / "sys/devices/system/node"
    online_file = cpu_dir / "online"
    online = parse_cpu_list(online_file.read_text()) if online_file.exists() else None
    numa_of: dict[int, int] = {}
    if node_dir.is_dir():
        for entry in node_dir.iterdir():
            if re.fullmatch(r"node\d+", entry.name) and (entry / "cpulist").exists():
                for cpu_id in parse_cpu_list((entry / "cpulist").read_text()):
                    numa_of[cpu_id] = int(entry.name[4:])
    cpus = []
    for entry in cpu_dir.iterdir() if cpu_dir.is_dir() else ():
        if not re.fullmatch(r"cpu\d+", entry.name) or not (entry / "topology").is_dir():
            continue
        cpu_id = int(entry.name[3:])
        if online is not None and cpu_id not in online:
            continue
        socket = int((entry / "topology/physical_package_id").read_text())
        core = int((entry / "topology/core_id").read_text())
        cpus.append(Cpu(cpu_id, socket, numa_of.get(cpu_id, 0), core))
    if not cpus:
        raise ValueError(f"{cpu_dir}: no cpuN/topology directories; is {host_root} a host tree?")
    return Topology.of(cpus)


def read_kubelet_config(host_root: Path) -> dict[str, Any]:
    """The kubelet config file of a host tree (empty when there is none)."""
    path = host_root / CONFIG_REL
    if not path.exists():
        return {}
    loaded = yaml.safe_load(path.read_text())
    return loaded if isinstance(loaded, dict) else {}


def write_atomically(path: Path, text: str) -> None:
    """Temp file in the same directory, fsync, rename over `path`: readers see the old or the new file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def pod_cgroup_dirs(host_root: Path, uid: str, qos: QoS) -> list[Path]:
    """Where the kubelet puts the pod's cgroup: one directory per hierarchy that has the kubelet's pod root,
    named for the cgroup driver that root shows (kubelet `cgroup_manager_linux.go`, `pod_container_manager`).
    """
    base = Path(host_root) / CGROUP_REL
    if (base / "cgroup.controllers").exists():
        hierarchies = [base]
    elif base.is_dir():
        hierarchies = sorted(d for d in base.iterdir() if d.is_dir() and not d.is_symlink())
    else:
        return []
    klass = qos.lower()
    dirs = []
    for hierarchy in hierarchies:
        if (hierarchy / "kubepods.slice").is_dir():
            escaped = uid.replace("-", "_")
            top = "kubepods.slice"
            if qos == "Guaranteed":
                dirs.append(hierarchy / top / f"kubepods-pod{escaped}.slice")
            else:
                dirs.append(
                    hierarchy / top / f"kubepods-{klass}.slice" / f"kubepods-{klass}-pod{escaped}.slice"
                )
        elif (hierarchy / "kubepods").is_dir():
            parent = hierarchy / "kubepods"
            dirs.append(parent / f"pod{uid}" if qos == "Guaranteed" else parent / klass / f"pod{uid}")
    return dirs


def pod_log_dir(host_root: Path, pod: SimPod) -> Path:
    """The kubelet's log directory of a pod (kuberuntime `BuildPodLogsDirectory`)."""
    return Path(host_root) / POD_LOGS_REL / f"{pod.namespace}_{pod.name}_{pod.uid}"


# --- the node model ---


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


class SimKubelet:
    """Pods on a node and what the kubelet's resource managers give them; serves PodResources while started.

    `async with SimKubelet(...)` starts the gRPC server (and writes the state file); add_pod/remove_pod work
    with or without the server.
    """

    def __init__(
        self,
        host_root: Path,
        topology: Topology,
        *,
        reserved_cpus: Iterable[int] = (),
        cpu_manager_policy: CpuManagerPolicy = "static",
        topology_manager_policy: str = "none",
        devices: Mapping[str, Sequence[Device]] | None = None,
        device_plugins: bool = False,
        socket_path: Path | None = None,
        not_found_code: grpc.StatusCode = grpc.StatusCode.NOT_FOUND,
        get_enabled: bool = True,
        rate_limit: tuple[float, int] | None = (100.0, 10),
    ) -> None:
        self.host_root = Path(host_root)
        self.topology = topology
        self.reserved = frozenset(reserved_cpus)
        if not self.reserved <= topology.ids:
            raise ValueError(
                f"reserved cpus {format_cpu_list(self.reserved - topology.ids)} are not on the node"
            )
        self.policy: CpuManagerPolicy = cpu_manager_policy
        # An attribute tests may change while it runs (a kubelet restarted with another policy).
        self.topology_manager_policy = topology_manager_policy
        self._static_devices = {name: tuple(devs) for name, devs in (devices or {}).items()}
        self.device_manager = (
            DeviceManager(self.host_root / PLUGIN_DIR_REL, self._devices_changed) if device_plugins else None
        )
        self._device_listeners: list[Callable[[], None]] = []
        self._admission = asyncio.Lock()
        self.socket_path = Path(socket_path) if socket_path else self.host_root / SOCKET_REL
        self.state_path = self.host_root / STATE_REL
        self.not_found_code = not_found_code
        self.get_enabled = get_enabled
        self._pods: dict[str, SimPod] = {}
        self._limiter = _TokenBucket(*rate_limit) if rate_limit else None
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._server: grpc.aio.Server | None = None

    @classmethod
    def from_host_tree(
        cls,
        host_root: Path,
        *,
        reserved_cpus: Iterable[int] | None = None,
        cpu_manager_policy: CpuManagerPolicy | None = None,
        topology_manager_policy: str | None = None,
        **kwargs: Any,
    ) -> SimKubelet:
        """A kubelet for a host tree: topology from its sysfs, the rest from the arguments.

        Reserved CPUs and the CPU and topology manager policies not given come from the tree's kubelet config
        (reservedSystemCPUs, cpuManagerPolicy, topologyManagerPolicy), defaulting to none reserved, `static`
        and `none` (the kubelet's default).
        """
        config = read_kubelet_config(Path(host_root))
        if reserved_cpus is None:
            reserved_cpus = parse_cpu_list(str(config.get("reservedSystemCPUs", "")))
        if cpu_manager_policy is None:
            cpu_manager_policy = (
                "static" if str(config.get("cpuManagerPolicy", "static")) == "static" else "none"
            )
        if topology_manager_policy is None:
            topology_manager_policy = str(config.get("topologyManagerPolicy") or "none")
        return cls(
            Path(host_root),
            read_topology(Path(host_root)),
            reserved_cpus=reserved_cpus,
            cpu_manager_policy=cpu_manager_policy,
            topology_manager_policy=topology_manager_policy,
            **kwargs,
        )

    # --- pods ---

    @property
    def pods(self) -> list[SimPod]:
        return list(self._pods.values())

    def assignments(self) -> dict[tuple[str, str], frozenset[int]]:
        """Exclusive CPUs keyed by (pod uid, container name)."""
        return {(pod.uid, name): cpus for pod in self._pods.values() for name, cpus in pod.cpus.items()}

    def shared_pool(self) -> frozenset[int]:
        """The defaultCpuSet: all CPUs minus exclusive ones (reserved included); empty with policy none."""
        if self.policy == "none":
            return frozenset()
        return cpumanager.shared_pool(self.topology, self.assignments())

    def allocatable_cpus(self) -> frozenset[int]:
        return self.topology.ids - self.reserved if self.policy == "static" else frozenset()

    def remove_pod(self, uid: str) -> None:
        """Forget the pod; its CPUs go back to the shared pool and the state file is rewritten."""
        pod = self._pods.pop(uid, None)
        if pod is None:
            raise KeyError(f"no pod with uid {uid}")
        self.write_state()
        self._remove_pod_dirs(pod)
        log.info("removed pod %s/%s", pod.namespace, pod.name)

    def find_pod(self, namespace: str, name: str) -> SimPod | None:
        return next((p for p in self._pods.values() if p.namespace == namespace and p.name == name), None)

    # --- devices ---

    @property
    def devices(self) -> dict[str, tuple[Device, ...]]:
        """Healthy devices per resource: the static pool, where no registered plugin lists its own."""
        merged = dict(self._static_devices)
        if self.device_manager is not None:
            for resource in self.device_manager.resources():
                merged[resource] = self.device_manager.devices(resource, healthy=True)
        return merged

    def unhealthy_devices(self) -> dict[str, tuple[Device, ...]]:
        """Devices in the capacity but not allocatable (a plugin said so, or its stream ended)."""
        manager = self.device_manager
        if manager is None:
            return {}
        return {r: manager.devices(r, healthy=False) for r in manager.resources()}

    def add_device_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` whenever a device plugin's list changes."""
        self._device_listeners.append(listener)

    def remove_device_listener(self, listener: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._device_listeners.remove(listener)

    def _devices_changed(self) -> None:
        for listener in list(self._device_listeners):
            listener()

    # --- admission ---

    def add_pod(
        self, namespace: str, name: str, uid: str, containers: Iterable[ContainerSpec | Sequence[Any]]
    ) -> SimPod:
        """Admit a pod: pin CPUs and devices, rewrite cpu_manager_state. On AdmissionError nothing changes.

        No device plugin is called (admit_pod does that)."""
        pod = self._plan_pod(namespace, name, uid, containers)
        used = self._used_devices()
        for spec in pod.containers:
            for resource, count in self._device_requests(spec):
                self._grant(
                    pod,
                    spec,
                    resource,
                    self._device_candidates(pod, spec, resource, count, used)[:count],
                    used,
                )
        self._commit(pod)
        return pod

    async def admit_pod(
        self, namespace: str, name: str, uid: str, containers: Iterable[ContainerSpec | Sequence[Any]]
    ) -> SimPod:
        """add_pod with the device plugins in the loop: GetPreferredAllocation where a plugin offers it,
        then Allocate (and PreStartContainer if the plugin asks for it) per container and resource. A
        failed call rejects the pod. One admission at a time, as the kubelet does."""
        async with self._admission:
            pod = self._plan_pod(namespace, name, uid, containers)
            used = self._used_devices()
            for spec in pod.containers:
                for resource, count in self._device_requests(spec):
                    candidates = self._device_candidates(pod, spec, resource, count, used)
                    chosen = await self._preferred(resource, candidates, count, self._numa_of(pod, spec))
                    self._grant(pod, spec, resource, chosen, used)
            await self._allocate(pod)
            self._commit(pod)
            return pod

    def _plan_pod(
        self, namespace: str, name: str, uid: str, containers: Iterable[ContainerSpec | Sequence[Any]]
    ) -> SimPod:
        """A new pod with its exclusive CPUs (and, with single-numa-node, each container's NUMA node)
        chosen; nothing is recorded yet."""
        if uid in self._pods:
            raise AdmissionError(f"pod uid {uid} already exists")
        if any(p.namespace == namespace and p.name == name for p in self._pods.values()):
            raise AdmissionError(f"pod {name} already exists in namespace {namespace}")
        specs = tuple(ContainerSpec.of(c) for c in containers)
        pod = SimPod(namespace, name, uid, specs, qos_class(specs))
        assigned = self.assignments()
        claimed: dict[tuple[str, int], int] = {}  # (resource, NUMA node) -> devices earlier containers take
        for spec in specs:
            count = exclusive_cpu_count(pod.qos, spec) if self.policy == "static" else 0
            reserved = self.reserved
            if self.topology_manager_policy == SINGLE_NUMA_NODE:
                node = self._single_numa_node(spec, count, assigned, claimed)
                if node is not None:
                    pod.numa[spec.name] = node
                    reserved = reserved | (self.topology.ids - self.topology.numa_nodes[node])
            if count:
                try:
                    cpus = cpumanager.allocate(self.topology, reserved, assigned, count)
                except cpumanager.NotEnoughCpus as exc:
                    raise AdmissionError(f"pod {namespace}/{name} container {spec.name}: {exc}") from exc
                pod.cpus[spec.name] = cpus
                assigned[(uid, spec.name)] = cpus
        return pod

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
        used = self._used_devices()
        wanted = {
            resource: count
            for resource, count in self._device_requests(spec)
            if any(d.numa_nodes for d in self.devices[resource])
        }
        if not cpus and not wanted:
            return None
        free_cpus = cpumanager.free_cpus(self.topology, self.reserved, assigned)

        def fits(node: int) -> bool:
            if cpus and len(free_cpus & self.topology.numa_nodes[node]) < cpus:
                return False
            for resource, count in wanted.items():
                # A device counts for a NUMA node it is attached to (the device manager's hint rule).
                near = [
                    d for d in self.devices[resource] if node in d.numa_nodes and (resource, d.id) not in used
                ]
                if len(near) - claimed.get((resource, node), 0) < count:
                    return False
            return True

        node = next((n for n in sorted(self.topology.numa_nodes) if fits(n)), None)
        if node is None:
            raise AdmissionError(TOPOLOGY_AFFINITY_MESSAGE, reason=TOPOLOGY_AFFINITY_ERROR)
        for resource, count in wanted.items():
            claimed[(resource, node)] = claimed.get((resource, node), 0) + count
        return node

    def _commit(self, pod: SimPod) -> None:
        self._pods[pod.uid] = pod
        self.write_state()
        self._make_pod_dirs(pod)
        log.info(
            "admitted pod %s/%s (%s), exclusive cpus %s, devices %s",
            pod.namespace,
            pod.name,
            pod.qos,
            {c: format_cpu_list(cpus) for c, cpus in pod.cpus.items()} or "none",
            {c: {r: [d.id for d in ds] for r, ds in res.items()} for c, res in pod.devices.items()} or "none",
        )

    def _used_devices(self) -> set[tuple[str, str]]:
        """(resource, device id) of every device a pod holds."""
        return {
            (resource, d.id)
            for p in self._pods.values()
            for per_resource in p.devices.values()
            for resource, devs in per_resource.items()
            for d in devs
        }

    def _device_requests(self, spec: ContainerSpec) -> list[tuple[str, int]]:
        pools = self.devices
        return [(r, n) for r, n in sorted(spec.resources.items()) if r in pools and n > 0]

    def _device_candidates(
        self, pod: SimPod, spec: ContainerSpec, resource: str, count: int, used: set[tuple[str, str]]
    ) -> list[Device]:
        """Free healthy devices, those near the container's CPUs first (the topology hint's preference)."""
        free = [d for d in self.devices[resource] if (resource, d.id) not in used]
        if len(free) < count:
            raise AdmissionError(
                f"pod {pod.namespace}/{pod.name} container {spec.name}: requested number of devices "
                f"unavailable for {resource}. Requested: {count}, Available: {len(free)}"
            )
        numa = self._numa_of(pod, spec)
        free.sort(key=lambda d: (not (d.numa_nodes and d.numa_nodes <= numa), not d.numa_nodes & numa))
        return free

    def _numa_of(self, pod: SimPod, spec: ContainerSpec) -> frozenset[int]:
        """The NUMA nodes the container's devices should come from: its aligned node, else its CPUs' nodes."""
        if spec.name in pod.numa:
            return frozenset({pod.numa[spec.name]})
        return frozenset(self.topology.cpu(c).numa for c in pod.cpus.get(spec.name, ()))

    async def _preferred(
        self, resource: str, candidates: list[Device], count: int, numa: frozenset[int]
    ) -> list[Device]:
        chosen = candidates[:count]
        manager = self.device_manager
        options = manager.options(resource) if manager is not None else None
        if manager is None or options is None or not options.get_preferred_allocation_available:
            return chosen
        aligned = [d for d in candidates if d.numa_nodes and d.numa_nodes <= numa]
        offer = aligned if len(aligned) >= count else candidates
        try:
            ids = await manager.preferred(resource, [d.id for d in offer], [], count)
        except PluginCallFailed as exc:
            log.warning("ignoring the preferred allocation of %s: %s", resource, exc)
            return chosen
        by_id = {d.id: d for d in offer}
        if len(set(ids)) != count or not all(i in by_id for i in ids):
            log.warning(
                "ignoring the preferred allocation of %s: %s is not %d offered devices", resource, ids, count
            )
            return chosen
        return [by_id[i] for i in ids]

    def _grant(
        self,
        pod: SimPod,
        spec: ContainerSpec,
        resource: str,
        devices: Sequence[Device],
        used: set[tuple[str, str]],
    ) -> None:
        pod.devices.setdefault(spec.name, {})[resource] = tuple(devices)
        used.update((resource, d.id) for d in devices)

    async def _allocate(self, pod: SimPod) -> None:
        manager = self.device_manager
        if manager is None:
            return
        for container, per_resource in pod.devices.items():
            for resource, devices in sorted(per_resource.items()):
                options = manager.options(resource)
                if options is None:
                    continue  # a static pool: nobody to ask
                ids = [d.id for d in devices]
                try:
                    pod.envs.setdefault(container, {}).update(await manager.allocate(resource, ids))
                    if options.pre_start_required:
                        await manager.pre_start(resource, ids)
                except PluginCallFailed as exc:
                    raise AdmissionError(
                        f"pod {pod.namespace}/{pod.name} container {container}: "
                        f"Allocate failed due to {exc}, which is unexpected"
                    ) from exc

    # --- the pod's cgroup and log directory ---

    def _make_pod_dirs(self, pod: SimPod) -> None:
        for directory in pod_cgroup_dirs(self.host_root, pod.uid, pod.qos):
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "cgroup.procs").touch()
        logs = pod_log_dir(self.host_root, pod)
        for spec in pod.containers:
            (logs / spec.name).mkdir(parents=True, exist_ok=True)

    def _remove_pod_dirs(self, pod: SimPod) -> None:
        for directory in pod_cgroup_dirs(self.host_root, pod.uid, pod.qos):
            shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(pod_log_dir(self.host_root, pod), ignore_errors=True)

    # --- cpu_manager_state ---

    def write_state(self) -> None:
        """Rewrite cpu_manager_state (v2) atomically."""
        entries = {
            pod.uid: {name: format_cpu_list(cpus) for name, cpus in sorted(pod.cpus.items())}
            for pod in self._pods.values()
            if pod.cpus
        }
        text = encode_cpu_manager_state_v2(self.policy, format_cpu_list(self.shared_pool()), entries)
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.state_path, text)

    # --- server ---

    def stall(self) -> None:
        """Hold every call until resume(); clients see their deadline expire."""
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    async def start(self) -> None:
        path = str(self.socket_path.absolute())
        if len(path.encode()) > MAX_UNIX_PATH:
            raise ValueError(f"unix socket path is {len(path.encode())} bytes, over {MAX_UNIX_PATH}: {path}")
        self.write_state()
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)  # a stale socket from a previous run, as the kubelet does
        server = grpc.aio.server()
        _add_servicer(_Servicer(self), server)
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise OSError(f"cannot listen on {path}")
        await server.start()
        self._server = server
        log.info("simulated kubelet serving PodResources on %s", path)
        if self.device_manager is not None:
            await self.device_manager.start()

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving; pods, allocations and known devices are kept (start() again is a kubelet restart)."""
        self.resume()  # let stalled calls finish (or be cancelled) instead of hanging shutdown
        if self.device_manager is not None:
            await self.device_manager.stop()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # --- answers (protobuf), used by the servicer ---

    def _device_messages(self, devices: Mapping[str, Iterable[Device]]) -> list[api_pb2.ContainerDevices]:
        # One entry per (device, NUMA node), as the kubelet's containerDevicesFromResourceDeviceInstances.
        return [
            api_pb2.ContainerDevices(
                resource_name=resource,
                device_ids=[d.id],
                topology=None if node is None else api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=node)]),
            )
            for resource, devs in sorted(devices.items())
            for d in devs
            for node in (*sorted(d.numa_nodes),) or (None,)
        ]

    def _pod_message(self, pod: SimPod) -> api_pb2.PodResources:
        return api_pb2.PodResources(
            name=pod.name,
            namespace=pod.namespace,
            containers=[
                api_pb2.ContainerResources(
                    name=spec.name,
                    cpu_ids=sorted(pod.cpus.get(spec.name, ())),
                    devices=self._device_messages(pod.devices.get(spec.name, {})),
                )
                for spec in pod.containers
            ],
        )

    async def _admit_call(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await self._resumed.wait()
        if self._limiter is not None and not self._limiter.take():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")


class _TokenBucket:
    """The kubelet's PodResources limiter: `qps` tokens per second, at most `burst` saved up."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.qps)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class _Servicer:
    """PodResourcesLister over a SimKubelet (the generated base class is untyped, so it is not subclassed)."""

    def __init__(self, kubelet: SimKubelet) -> None:
        self.kubelet = kubelet

    async def List(  # gRPC method names
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.ListPodResourcesResponse:
        await self.kubelet._admit_call(context)
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[self.kubelet._pod_message(p) for p in self.kubelet.pods]
        )

    async def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.AllocatableResourcesResponse:
        await self.kubelet._admit_call(context)
        return api_pb2.AllocatableResourcesResponse(
            cpu_ids=sorted(self.kubelet.allocatable_cpus()),
            devices=self.kubelet._device_messages(self.kubelet.devices),
        )

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.GetPodResourcesResponse:
        await self.kubelet._admit_call(context)
        if not self.kubelet.get_enabled:  # the KubeletPodResourcesGet gate is off (default before 1.34)
            await context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        pod = self.kubelet.find_pod(request.pod_namespace, request.pod_name)
        if pod is None:
            await context.abort(
                self.kubelet.not_found_code,
                f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
            )
        assert pod is not None  # abort raises
        return api_pb2.GetPodResourcesResponse(pod_resources=self.kubelet._pod_message(pod))
