"""A simulated kubelet: pods on one node and what its resource managers give them, `cpu_manager_state`, the
pods' cgroups and log directories, and the PodResources v1 gRPC server.

The parts live apart: what admission decides (QoS, static CPU manager, topology manager single-numa-node,
device choice) is pure, in rmd_sim.kubelet_admission; the gRPC server is rmd_sim.kubelet_podresources; the
device plugin side is rmd_sim.devicemanager. This module holds the node's state and what the kubelet does
with it:

* Device-plugin resources: from a static pool (`devices`) or, with `device_plugins=True`, from real device
  plugins that register on `<root>/var/lib/kubelet/device-plugins/kubelet.sock` (rmd_sim.devicemanager).
  `admit_pod` lets the plugin's GetPreferredAllocation pick among the candidates when it offers it, then
  calls the plugin's Allocate and keeps the environment it answers on the pod (`SimPod.envs`); `add_pod`
  asks no plugin. A pod that cannot get its CPUs or devices is rejected (AdmissionError) and leaves no
  trace, like a failed kubelet admission.
* The CPU and topology manager policies: `cpuManagerPolicy` and `topologyManagerPolicy` of the tree's
  kubelet config (defaults `static` and `none`), or the arguments; `topology_manager_policy` is an attribute
  tests may change while it runs.
* `<root>/var/lib/kubelet/cpu_manager_state` (v2 format, valid checksum), rewritten after every change
  through a temp file in the same directory, fsync and rename, as the kubelet's checkpoint manager does.
* What the kubelet makes on the node for an admitted pod: its cgroup, under the parent of its QoS class, in
  every cgroup hierarchy of the tree that has the kubelet's pod root (cgroupfs driver `kubepods/pod<uid>`,
  `kubepods/burstable/pod<uid>`, `kubepods/besteffort/pod<uid>`; systemd driver `kubepods.slice/
  kubepods-pod<uid_>.slice`, `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice`,
  ...), and its log directory `var/log/pods/<namespace>_<name>_<uid>/<container>/`. Both go with the pod.
  A tree without a pod root gets no cgroups (the real kubelet would not start).
* PodResources (rmd_sim.kubelet_podresources) while started: the Get status for an unknown pod is NOT_FOUND
  unless `not_found_code` says otherwise, `get_enabled=False` (`--get-disabled`) answers Get like a kubelet
  whose KubeletPodResourcesGet gate is off; both are attributes tests may flip while it serves. Tests can
  freeze the server with `stall()` / `resume()` to exercise client deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc
import yaml

from rmd_api.cpuset import format_cpu_list, parse_cpu_list
from rmd_api.kubelet.checkpoint import encode_cpu_manager_state_v2
from rmd_sim import cpumanager
from rmd_sim.cpumanager import Cpu, Topology
from rmd_sim.devicemanager import PLUGIN_DIR_REL, Device, DeviceManager, PluginCallFailed
from rmd_sim.kubelet_admission import (
    AdmissionError,
    AdmissionNode,
    ContainerSpec,
    CpuManagerPolicy,
    PodAdmission,
    QoS,
    SimPod,
    exclusive_assignments,
    parse_quantity,
    qos_class,
)
from rmd_sim.kubelet_podresources import PodResourcesServer, unix_address

log = logging.getLogger(__name__)

SOCKET_REL = "var/lib/kubelet/pod-resources/kubelet.sock"
STATE_REL = "var/lib/kubelet/cpu_manager_state"
CONFIG_REL = "var/lib/kubelet/config.yaml"
CGROUP_REL = "sys/fs/cgroup"
POD_LOGS_REL = "var/log/pods"


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


def make_pod_dirs(host_root: Path, pod: SimPod) -> None:
    """The pod's cgroups (with an empty cgroup.procs) and its containers' log directories."""
    for directory in pod_cgroup_dirs(host_root, pod.uid, pod.qos):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup.procs").touch()
    logs = pod_log_dir(host_root, pod)
    for spec in pod.containers:
        (logs / spec.name).mkdir(parents=True, exist_ok=True)


def remove_pod_dirs(host_root: Path, pod: SimPod) -> None:
    for directory in pod_cgroup_dirs(host_root, pod.uid, pod.qos):
        shutil.rmtree(directory, ignore_errors=True)
    shutil.rmtree(pod_log_dir(host_root, pod), ignore_errors=True)


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
        # Read by the server at every call (PodSource).
        self.not_found_code = not_found_code
        self.get_enabled = get_enabled
        self._pods: dict[str, SimPod] = {}
        self._podresources = PodResourcesServer(self, self.socket_path, rate_limit)

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
        return exclusive_assignments(self._pods.values())

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
        remove_pod_dirs(self.host_root, pod)
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
        admission = self._admission_for(namespace, name, uid, containers)
        admission.assign_devices()
        self._commit(admission.pod)
        return admission.pod

    async def admit_pod(
        self, namespace: str, name: str, uid: str, containers: Iterable[ContainerSpec | Sequence[Any]]
    ) -> SimPod:
        """add_pod with the device plugins in the loop: GetPreferredAllocation where a plugin offers it,
        then Allocate (and PreStartContainer if the plugin asks for it) per container and resource. A
        failed call rejects the pod. One admission at a time, as the kubelet does."""
        async with self._admission:
            admission = self._admission_for(namespace, name, uid, containers)
            for spec, resource, count in admission.device_requests():
                candidates = admission.candidates(spec, resource, count)
                chosen = candidates[:count]
                if self.device_manager is not None:
                    numa = admission.numa_of(spec)
                    chosen = await self.device_manager.preferred_among(resource, candidates, count, numa)
                admission.grant(spec, resource, chosen)
            await self._allocate(admission.pod)
            self._commit(admission.pod)
            return admission.pod

    def _admission_for(
        self, namespace: str, name: str, uid: str, containers: Iterable[ContainerSpec | Sequence[Any]]
    ) -> PodAdmission:
        """The pod's admission against the node as it is now, its CPUs chosen; nothing is recorded yet."""
        node = AdmissionNode(
            self.topology,
            self.reserved,
            self.policy,
            self.topology_manager_policy,
            self._pods,
            lambda: self.devices,
        )
        return PodAdmission(node, namespace, name, uid, containers)

    def _commit(self, pod: SimPod) -> None:
        self._pods[pod.uid] = pod
        self.write_state()
        make_pod_dirs(self.host_root, pod)
        log.info(
            "admitted pod %s/%s (%s), exclusive cpus %s, devices %s",
            pod.namespace,
            pod.name,
            pod.qos,
            {c: format_cpu_list(cpus) for c, cpus in pod.cpus.items()} or "none",
            {c: {r: [d.id for d in ds] for r, ds in res.items()} for c, res in pod.devices.items()} or "none",
        )

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
        """Hold every PodResources call until resume(); clients see their deadline expire."""
        self._podresources.stall()

    def resume(self) -> None:
        self._podresources.resume()

    async def start(self) -> None:
        unix_address(self.socket_path)  # a path too long fails before anything is written
        self.write_state()
        await self._podresources.start()
        if self.device_manager is not None:
            await self.device_manager.start()

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving; pods, allocations and known devices are kept (start() again is a kubelet restart)."""
        self.resume()  # let stalled calls finish (or be cancelled) instead of hanging shutdown
        if self.device_manager is not None:
            await self.device_manager.stop()
        await self._podresources.stop(grace)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


# The pod model lives in rmd_sim.kubelet_admission (Device in rmd_sim.devicemanager); callers know it as this
# module's, with the kubelet that admits the pods.
__all__ = [
    "CGROUP_REL",
    "CONFIG_REL",
    "POD_LOGS_REL",
    "SOCKET_REL",
    "STATE_REL",
    "AdmissionError",
    "ContainerSpec",
    "CpuManagerPolicy",
    "Device",
    "SimKubelet",
    "SimPod",
    "make_pod_dirs",
    "parse_quantity",
    "pod_cgroup_dirs",
    "pod_log_dir",
    "qos_class",
    "read_kubelet_config",
    "read_topology",
    "remove_pod_dirs",
    "write_atomically",
]
