"""The simulated kubelet as a node of a real API server (end-to-end tests, the demo).

    async with KubeletNode(kubelet, api_client, "node-1", labels={...}):
        ...  # pods created with spec.nodeName=node-1 become Running with exclusive CPUs

What it does of the kubelet's job, and how:

* **Node**: created if missing (labels kubernetes.io/hostname, os, arch plus `labels`; missing labels are
  added to an existing Node), then its status: capacity and allocatable (cpu = online CPUs, less
  reservedSystemCPUs for allocatable; memory and hugepages-* from the host tree's NUMA nodes, memory
  allocatable less the hugepages; pods 110; every device-plugin resource with all its devices in capacity
  and the healthy ones in allocatable), Ready condition and addresses. Written through the status
  subresource when it differs from what the API server has (checked at every device change and resync).
  A deleted Node is registered again, as the kubelet does.
* **Pods** (rmd_sim.kubelet_api_pods): list + watch of the pods bound to the node; new ones are admitted
  (resource fit against node allocatable, then SimKubelet.admit_pod) and reported Running or Failed with
  the kubelet's reasons and messages; deleted ones are released and deleted with grace period 0.

Not simulated: node leases and heartbeats beyond the status writes above; for pods, see
rmd_sim.kubelet_api_pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from rmd_sim.kube_calls import Obj, api_call, api_patch, describe, timestamp
from rmd_sim.kubelet import SimKubelet, parse_quantity
from rmd_sim.kubelet_api_pods import PodSync, container_specs, fit_failure, pod_requests

log = logging.getLogger(__name__)

MAX_PODS = 110
_MEMTOTAL = re.compile(r"Node\s+\d+\s+MemTotal:\s+(\d+)\s*kB")
_HUGEPAGE_DIR = re.compile(r"hugepages-(\d+)kB")


# --- node resources ---


@dataclass(frozen=True)
class NodeResources:
    """Capacity and allocatable in the fit check's units (cpu millicores, bytes, counts)."""

    capacity: dict[str, int]
    allocatable: dict[str, int]


def read_host_memory(host_root: Path) -> tuple[int | None, dict[str, int]]:
    """(MemTotal bytes summed over NUMA nodes or None, hugepages bytes by resource name) of a host tree."""
    total: int | None = None
    hugepages: dict[str, int] = {}
    node_dir = host_root / "sys/devices/system/node"
    for node in sorted(node_dir.glob("node[0-9]*")) if node_dir.is_dir() else ():
        meminfo = node / "meminfo"
        match = _MEMTOTAL.search(meminfo.read_text()) if meminfo.exists() else None
        if match:
            total = (total or 0) + int(match.group(1)) * 1024
        for pages in sorted((node / "hugepages").glob("hugepages-*kB")):
            size = _HUGEPAGE_DIR.fullmatch(pages.name)
            count = pages / "nr_hugepages"
            if size and count.exists():
                name = hugepage_resource(int(size.group(1)))
                hugepages[name] = hugepages.get(name, 0) + int(count.read_text()) * int(size.group(1)) * 1024
    return total, hugepages


def hugepage_resource(size_kb: int) -> str:
    for unit, kb in (("Gi", 1024 * 1024), ("Mi", 1024)):
        if size_kb % kb == 0:
            return f"hugepages-{size_kb // kb}{unit}"
    return f"hugepages-{size_kb}Ki"


def node_resources(kubelet: SimKubelet, memory: tuple[int | None, Mapping[str, int]]) -> NodeResources:
    total_memory, hugepages = memory
    cpus = len(kubelet.topology.ids)
    capacity = {"cpu": cpus * 1000, "pods": MAX_PODS, **hugepages}
    allocatable = {"cpu": (cpus - len(kubelet.reserved)) * 1000, "pods": MAX_PODS, **hugepages}
    if total_memory is not None:
        capacity["memory"] = total_memory
        allocatable["memory"] = max(0, total_memory - sum(hugepages.values()))
    healthy, unhealthy = kubelet.devices, kubelet.unhealthy_devices()
    for resource in sorted(set(healthy) | set(unhealthy)):
        capacity[resource] = len(healthy.get(resource, ())) + len(unhealthy.get(resource, ()))
        allocatable[resource] = len(healthy.get(resource, ()))
    return NodeResources(capacity, allocatable)


def format_quantity(resource: str, value: int) -> str:
    """A quantity string as the kubelet reports it (cpu in cores or millicores, bytes with binary units)."""
    if resource == "cpu":
        return str(value // 1000) if value % 1000 == 0 else f"{value}m"
    if resource == "memory" or resource.startswith("hugepages-"):
        for unit, size in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
            if value and value % size == 0:
                return f"{value // size}{unit}"
    return str(value)


def _same_quantities(current: Mapping[str, Any] | None, desired: Mapping[str, str]) -> bool:
    if current is None or set(current) != set(desired):
        return False
    return all(parse_quantity(str(current[k])) == parse_quantity(v) for k, v in desired.items())


def api_client_from_kubeconfig(kubeconfig: Path) -> Any:
    """A kubernetes ApiClient for `kubeconfig`, never through a proxy (close it after use)."""
    configuration = client.Configuration()
    configuration.proxy = None  # otherwise HTTPS_PROXY from the environment would be used
    config.load_kube_config(  # type: ignore[no-untyped-call]  # the loader module has no annotations
        config_file=str(kubeconfig), client_configuration=configuration
    )
    return client.ApiClient(configuration=configuration)


# --- the node ---


NOT_READY_TAINT = "node.kubernetes.io/not-ready"


class KubeletNode:
    """Registers `node_name` for a SimKubelet and runs the pods bound to it; `run()` until cancelled, or
    `async with` (which returns once the Node exists and the pods already bound were handled)."""

    def __init__(
        self,
        kubelet: SimKubelet,
        api_client: Any,
        node_name: str,
        *,
        labels: Mapping[str, str] | None = None,
        node_ip: str = "127.0.0.1",
        pod_cidr: str = "10.244.0.0/24",
        resync_seconds: float = 10.0,
    ) -> None:
        self.kubelet = kubelet
        self.node_name = node_name
        self.labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **(labels or {}),
        }
        self.node_ip = node_ip
        self.resync_seconds = resync_seconds
        self.synced = asyncio.Event()
        self._core = client.CoreV1Api(api_client)
        self._memory = read_host_memory(kubelet.host_root)
        self._pods = PodSync(
            kubelet,
            self._core,
            node_name,
            node_ip=node_ip,
            pod_cidr=pod_cidr,
            resync_seconds=resync_seconds,
            allocatable=lambda: node_resources(self.kubelet, self._memory).allocatable,
            synced=self.synced,
        )
        self._node_dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # --- running ---

    async def run(self) -> None:
        self.kubelet.add_device_listener(self._node_dirty.set)
        try:
            await self._sync_node()
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._node_loop())
                tasks.create_task(self._pods.run())
        finally:
            self.kubelet.remove_device_listener(self._node_dirty.set)

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self.run())
        synced = asyncio.create_task(self.synced.wait())
        await asyncio.wait({self._task, synced}, return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            synced.cancel()
            await self._task  # raises what stopped it
            raise RuntimeError("KubeletNode.run() ended before the node was synced")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # --- node ---

    async def _node_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._node_dirty.wait(), self.resync_seconds)
            self._node_dirty.clear()
            try:
                await self._sync_node()
            except (ApiException, HTTPError, OSError) as exc:
                log.warning("cannot update node %s: %s", self.node_name, describe(exc))

    def desired_node_status(self) -> Obj:
        resources = node_resources(self.kubelet, self._memory)
        now = timestamp()
        return {
            "capacity": {k: format_quantity(k, v) for k, v in sorted(resources.capacity.items())},
            "allocatable": {k: format_quantity(k, v) for k, v in sorted(resources.allocatable.items())},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": self.node_ip},
                {"type": "Hostname", "address": self.node_name},
            ],
        }

    async def _sync_node(self) -> None:
        node = await api_call(self._core.read_node, self.node_name, missing_ok=True)
        if node is None:
            body = client.V1Node(metadata=client.V1ObjectMeta(name=self.node_name, labels=self.labels))
            node = await api_call(self._core.create_node, body)
            log.info("registered node %s", self.node_name)
        assert node is not None
        labels = node.get("metadata", {}).get("labels") or {}
        missing = {k: v for k, v in self.labels.items() if labels.get(k) != v}
        if missing:
            await api_patch(self._core.patch_node, self.node_name, {"metadata": {"labels": missing}})
        desired = self.desired_node_status()
        status = node.get("status") or {}
        ready: Obj = next((c for c in status.get("conditions") or () if c.get("type") == "Ready"), {})
        if not (
            _same_quantities(status.get("capacity"), desired["capacity"])
            and _same_quantities(status.get("allocatable"), desired["allocatable"])
            and ready.get("status") == "True"
            and status.get("addresses") == desired["addresses"]
        ):
            if ready.get("status") == "True":
                desired["conditions"][0]["lastTransitionTime"] = ready.get("lastTransitionTime")
            patch = dict(desired)
            for key in ("capacity", "allocatable"):  # a merge patch keeps map keys it does not mention
                gone = set(status.get(key) or {}) - set(desired[key])
                patch[key] = {**desired[key], **dict.fromkeys(gone)}
            await api_patch(self._core.patch_node_status, self.node_name, {"status": patch})
            log.info("node %s status: allocatable %s", self.node_name, desired["allocatable"])
        await self._lift_not_ready_taint(node)

    async def _lift_not_ready_taint(self, node: Obj) -> None:
        """The API server taints a new Node not-ready (TaintNodesByCondition); kube-controller-manager's node
        lifecycle controller lifts it once the kubelet reports Ready. The simulated cluster does not run that
        controller (it would also evict the pods of nodes that renew no Lease), so the kubelet lifts it."""
        taints = (node.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
        if len(kept) != len(taints):
            await api_patch(self._core.patch_node, self.node_name, {"spec": {"taints": kept or None}})


# The pods' pure admission rules live in rmd_sim.kubelet_api_pods; callers know them as this module's.
__all__ = [
    "MAX_PODS",
    "NOT_READY_TAINT",
    "KubeletNode",
    "NodeResources",
    "api_client_from_kubeconfig",
    "container_specs",
    "fit_failure",
    "format_quantity",
    "hugepage_resource",
    "node_resources",
    "pod_requests",
    "read_host_memory",
]
