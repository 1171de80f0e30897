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
* **Pods**: list + watch with fieldSelector spec.nodeName=<node> (there is no scheduler: tests bind pods by
  setting nodeName), relisting on expiry (410) and every `resync_seconds`. A new pod that is not finished
  is admitted in creation order:
  1. the kubelet's resource-fit predicate against node allocatable, for pods and for every resource the
     node reports (requests; a missing request defaults to the limit; resources the node does not report
     are ignored, like the kubelet's removeMissingExtendedResources) -> Failed, reason `OutOf<resource>`,
     message "Node didn't have enough resource: ...";
  2. SimKubelet.admit_pod: topology manager (single-numa-node), static CPU manager, device manager with the
     plugins' Allocate -> Failed, reason `TopologyAffinityError` (message "Resources cannot be allocated
     with Topology locality") or `UnexpectedAdmissionError` (AdmissionError.reason).
  Admitted pods get status Running with the conditions Initialized, PodReadyToStartContainers,
  ContainersReady, Ready and PodScheduled True, a podIP from `pod_cidr` (the node IP with hostNetwork),
  hostIP and running container statuses. Rejections read "Pod was rejected: <message>", as the kubelet
  writes them. Status patches carry the pod's uid, so they never land on a new pod of the same name.
* **Deletion**: a pod with a deletionTimestamp releases its CPUs and devices and is deleted with grace
  period 0 (uid precondition); a pod that disappears from the API is released.

Not simulated: init containers (not admitted, get no resources), container restarts and exits, probes,
pod overhead, eviction, node leases and heartbeats beyond the status writes above.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import logging
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from rmd_sim.kubelet import AdmissionError, ContainerSpec, SimKubelet, parse_quantity

log = logging.getLogger(__name__)

Obj = dict[str, Any]

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
MAX_PODS = 110
_QOS_RESOURCES = ("cpu", "memory")
_REQUEST_SCALE: tuple[tuple[Literal["cpu", "memory"], int], ...] = (("cpu", 1000), ("memory", 1))
_MEMTOTAL = re.compile(r"Node\s+\d+\s+MemTotal:\s+(\d+)\s*kB")
_HUGEPAGE_DIR = re.compile(r"hugepages-(\d+)kB")


# --- pods (pure) ---


def container_specs(pod: Obj) -> tuple[ContainerSpec, ...]:
    """The app containers of a pod object; every resource other than cpu and memory goes to `resources`
    as an integer (a request, else the limit)."""
    specs = []
    for container in pod.get("spec", {}).get("containers") or ():
        resources = container.get("resources") or {}
        requests: Mapping[str, Any] = resources.get("requests") or {}
        limits: Mapping[str, Any] = resources.get("limits") or {}
        extended = {
            name: math.ceil(parse_quantity(str(requests.get(name, limits.get(name)))))
            for name in sorted(set(requests) | set(limits))
            if name not in _QOS_RESOURCES
        }

        def text(values: Mapping[str, Any], name: str) -> str | None:
            return None if values.get(name) is None else str(values[name])

        specs.append(
            ContainerSpec(
                str(container["name"]),
                cpu_request=text(requests, "cpu"),
                cpu_limit=text(limits, "cpu"),
                memory_request=text(requests, "memory"),
                memory_limit=text(limits, "memory"),
                resources=extended,
            )
        )
    return tuple(specs)


def pod_requests(specs: Sequence[ContainerSpec]) -> dict[str, int]:
    """What a pod asks of the node: cpu in millicores, memory in bytes, other resources as counted."""
    total: dict[str, int] = {}
    for spec in specs:
        for resource, scale in _REQUEST_SCALE:
            request, _ = spec.effective(resource)
            if request:
                total[resource] = total.get(resource, 0) + math.ceil(request * scale)
        for name, count in spec.resources.items():
            total[name] = total.get(name, 0) + count
    return total


def fit_failure(
    request: Mapping[str, int], used: Mapping[str, int], allocatable: Mapping[str, int], pods: int
) -> tuple[str, str] | None:
    """(reason, message) of the first resource the pod does not fit in, like the kubelet's predicate."""
    checks = [("pods", 1, pods), *((r, n, used.get(r, 0)) for r, n in sorted(request.items()) if n > 0)]
    for resource, wanted, in_use in checks:
        if resource in allocatable and in_use + wanted > allocatable[resource]:
            return (
                f"OutOf{resource}",
                f"Node didn't have enough resource: {resource}, requested: {wanted}, used: {in_use}, "
                f"capacity: {allocatable[resource]}",
            )
    return None


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


def _describe(exc: Exception) -> str:
    return f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
        hosts = ipaddress.ip_network(pod_cidr).hosts()
        next(hosts, None)  # the first address is the gateway's
        self._free_ips: Iterator[str] = (str(ip) for ip in hosts)
        self._released_ips: list[str] = []
        self._pod_ips: dict[str, str] = {}
        self._desired: dict[str, Obj] = {}  # uid -> the status this node reported for it
        self._node_dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # --- running ---

    async def run(self) -> None:
        self.kubelet.add_device_listener(self._node_dirty.set)
        try:
            await self._sync_node()
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._node_loop())
                tasks.create_task(self._pods_loop())
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
                log.warning("cannot update node %s: %s", self.node_name, _describe(exc))

    def desired_node_status(self) -> Obj:
        resources = node_resources(self.kubelet, self._memory)
        now = _now()
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
        node = await self._call(self._core.read_node, self.node_name, missing_ok=True)
        if node is None:
            body = client.V1Node(metadata=client.V1ObjectMeta(name=self.node_name, labels=self.labels))
            node = await self._call(self._core.create_node, body)
            log.info("registered node %s", self.node_name)
        assert node is not None
        labels = node.get("metadata", {}).get("labels") or {}
        missing = {k: v for k, v in self.labels.items() if labels.get(k) != v}
        if missing:
            await self._patch(self._core.patch_node, self.node_name, {"metadata": {"labels": missing}})
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
            await self._patch(self._core.patch_node_status, self.node_name, {"status": patch})
            log.info("node %s status: allocatable %s", self.node_name, desired["allocatable"])
        await self._lift_not_ready_taint(node)

    async def _lift_not_ready_taint(self, node: Obj) -> None:
        """The API server taints a new Node not-ready (TaintNodesByCondition); kube-controller-manager's node
        lifecycle controller lifts it once the kubelet reports Ready. The simulated cluster does not run that
        controller (it would also evict the pods of nodes that renew no Lease), so the kubelet lifts it."""
        taints = (node.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
        if len(kept) != len(taints):
            await self._patch(self._core.patch_node, self.node_name, {"spec": {"taints": kept or None}})

    # --- pods ---

    async def _pods_loop(self) -> None:
        while True:
            try:
                version = await self._relist()
                self.synced.set()
                await self._watch(version)
            except (ApiException, HTTPError, OSError) as exc:
                # 410: the watch expired, a relist starts it again. Anything else: the same, after a pause.
                if not (isinstance(exc, ApiException) and exc.status == 410):
                    log.warning("pods of node %s: %s; listing again", self.node_name, _describe(exc))
                    await asyncio.sleep(1.0)

    def _selector(self) -> str:
        return f"spec.nodeName={self.node_name}"

    async def _relist(self) -> str:
        listed = await self._call(self._core.list_pod_for_all_namespaces, field_selector=self._selector())
        assert listed is not None
        pods = sorted(listed.get("items") or (), key=lambda p: p["metadata"].get("creationTimestamp", ""))
        present = {p["metadata"]["uid"] for p in pods}
        for uid in set(self._desired) - present:
            self._release(uid)
        for pod in pods:
            await self._sync_pod("ADDED", pod)
        return str(listed["metadata"]["resourceVersion"])

    async def _watch(self, version: str) -> None:
        """Handle watch events from `version` until the stream ends (every resync_seconds)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Obj] | Exception | None] = asyncio.Queue()
        stream = watch.Watch()  # type: ignore[no-untyped-call]  # the watch module has no annotations

        def pump() -> None:  # in a thread: the client is synchronous
            try:
                for event in stream.stream(  # type: ignore[no-untyped-call]
                    self._core.list_pod_for_all_namespaces,
                    field_selector=self._selector(),
                    resource_version=version,
                    timeout_seconds=max(1, int(self.resync_seconds)),
                    allow_watch_bookmarks=True,
                ):
                    loop.call_soon_threadsafe(events.put_nowait, (event["type"], event["raw_object"]))
            except Exception as exc:
                loop.call_soon_threadsafe(events.put_nowait, exc)
            else:
                loop.call_soon_threadsafe(events.put_nowait, None)

        reader = asyncio.create_task(asyncio.to_thread(pump))
        try:
            while (item := await events.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                kind, pod = item
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    await self._sync_pod(kind, pod)
        finally:
            # stop() closes the connection the thread reads; repeated in case the request had not started.
            while not reader.done():
                stream.stop()  # type: ignore[no-untyped-call]
                await asyncio.wait({reader}, timeout=0.2)
            with contextlib.suppress(Exception):
                reader.result()

    async def _sync_pod(self, kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        uid = str(meta["uid"])
        if kind == "DELETED":
            self._release(uid)
            return
        if meta.get("deletionTimestamp"):
            self._release(uid)
            await self._delete(pod)
            return
        desired = self._desired.get(uid)
        if desired is None:
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                return  # finished before this kubelet saw it
            desired = await self._admit(pod)
        if (pod.get("status") or {}).get("phase") != desired["phase"]:
            await self._report(pod, desired)

    async def _admit(self, pod: Obj) -> Obj:
        meta = pod["metadata"]
        namespace, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
        failure = None
        if not any(p.uid == uid for p in self.kubelet.pods):  # else admitted before this node object ran
            failure = self._fit_failure(container_specs(pod))
            if failure is None:
                try:
                    await self.kubelet.admit_pod(namespace, name, uid, container_specs(pod))
                except AdmissionError as exc:
                    failure = (exc.reason, str(exc))
        desired: Obj
        if failure is not None:
            reason, message = failure
            log.info("rejected pod %s/%s: %s: %s", namespace, name, reason, message)
            desired = {"phase": "Failed", "reason": reason, "message": f"Pod was rejected: {message}"}
        else:
            desired = self._running_status(pod)
        self._desired[uid] = desired
        return desired

    def _fit_failure(self, specs: Sequence[ContainerSpec]) -> tuple[str, str] | None:
        used: dict[str, int] = {}
        for admitted in self.kubelet.pods:
            for resource, n in pod_requests(admitted.containers).items():
                used[resource] = used.get(resource, 0) + n
        allocatable = node_resources(self.kubelet, self._memory).allocatable
        return fit_failure(pod_requests(specs), used, allocatable, len(self.kubelet.pods))

    def _running_status(self, pod: Obj) -> Obj:
        uid = str(pod["metadata"]["uid"])
        if (pod.get("spec") or {}).get("hostNetwork"):
            ip = self.node_ip
        else:
            ip = self._released_ips.pop(0) if self._released_ips else next(self._free_ips)
            self._pod_ips[uid] = ip
        now = _now()
        conditions = [
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        ]
        return {
            "phase": "Running",
            "hostIP": self.node_ip,
            "hostIPs": [{"ip": self.node_ip}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "conditions": [{"type": c, "status": "True", "lastTransitionTime": now} for c in conditions],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "containerID": f"sim://{uid}/{c['name']}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for c in pod.get("spec", {}).get("containers") or ()
            ],
        }

    async def _report(self, pod: Obj, status: Obj) -> None:
        meta = pod["metadata"]
        body = {"metadata": {"uid": meta["uid"]}, "status": status}  # the uid makes it a precondition
        try:
            await self._patch(self._core.patch_namespaced_pod_status, meta["name"], meta["namespace"], body)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
            self._release(str(meta["uid"]))  # gone, or replaced by a pod with the same name

    async def _delete(self, pod: Obj) -> None:
        meta = pod["metadata"]
        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        try:
            await asyncio.to_thread(
                self._core.delete_namespaced_pod, meta["name"], meta["namespace"], body=options
            )
            log.info("deleted pod %s/%s", meta["namespace"], meta["name"])
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def _release(self, uid: str) -> None:
        if self._desired.pop(uid, None) is None:
            return
        if any(p.uid == uid for p in self.kubelet.pods):
            self.kubelet.remove_pod(uid)
        ip = self._pod_ips.pop(uid, None)
        if ip is not None:
            self._released_ips.append(ip)

    # --- API calls, in threads (the client is synchronous) ---

    async def _call(self, method: Any, *args: Any, missing_ok: bool = False, **kwargs: Any) -> Obj | None:
        """The answer as plain JSON; None for 404 when `missing_ok`."""
        try:
            response = await asyncio.to_thread(method, *args, _preload_content=False, **kwargs)
        except ApiException as exc:
            if missing_ok and exc.status == 404:
                return None
            raise
        result: Obj = json.loads(response.data)
        return result

    async def _patch(self, method: Any, *args: Any) -> None:
        await asyncio.to_thread(method, *args, _content_type=STRATEGIC_MERGE)
