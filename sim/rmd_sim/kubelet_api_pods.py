"""The pods side of the simulated kubelet's node (rmd_sim.kubelet_api.KubeletNode): the pods bound to the
node, from the API server to SimKubelet and back.

* list + watch with fieldSelector spec.nodeName=<node> (there is no scheduler: tests bind pods by setting
  nodeName), relisting on expiry (410) and every `resync_seconds`. A new pod that is not finished is
  admitted in creation order:
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
* Deletion: a pod with a deletionTimestamp releases its CPUs and devices and is deleted with grace period 0
  (uid precondition); a pod that disappears from the API is released.

Not simulated: init containers (not admitted, get no resources), container restarts and exits, probes,
pod overhead, eviction.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from rmd_sim.kube_calls import Obj, api_call, api_patch, describe, timestamp
from rmd_sim.kubelet import AdmissionError, ContainerSpec, SimKubelet, parse_quantity

log = logging.getLogger(__name__)

_QOS_RESOURCES = ("cpu", "memory")
_REQUEST_SCALE: tuple[tuple[Literal["cpu", "memory"], int], ...] = (("cpu", 1000), ("memory", 1))


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


# --- the pods of a node ---


class PodSync:
    """Runs the pods bound to `node_name` on `kubelet` (`run()` until cancelled); `allocatable()` is the
    node's allocatable in the fit check's units, as the node reports it."""

    def __init__(
        self,
        kubelet: SimKubelet,
        core: client.CoreV1Api,
        node_name: str,
        *,
        node_ip: str,
        pod_cidr: str,
        resync_seconds: float,
        allocatable: Callable[[], Mapping[str, int]],
        synced: asyncio.Event,
    ) -> None:
        self.kubelet = kubelet
        self.node_name = node_name
        self.node_ip = node_ip
        self.resync_seconds = resync_seconds
        self.synced = synced
        self._core = core
        self._allocatable = allocatable
        hosts = ipaddress.ip_network(pod_cidr).hosts()
        next(hosts, None)  # the first address is the gateway's
        self._free_ips: Iterator[str] = (str(ip) for ip in hosts)
        self._released_ips: list[str] = []
        self._pod_ips: dict[str, str] = {}
        self._desired: dict[str, Obj] = {}  # uid -> the status this node reported for it

    async def run(self) -> None:
        """List and watch the node's pods until cancelled; `synced` is set after the first listing."""
        while True:
            try:
                version = await self._relist()
                self.synced.set()
                await self._watch(version)
            except (ApiException, HTTPError, OSError) as exc:
                # 410: the watch expired, a relist starts it again. Anything else: the same, after a pause.
                if not (isinstance(exc, ApiException) and exc.status == 410):
                    log.warning("pods of node %s: %s; listing again", self.node_name, describe(exc))
                    await asyncio.sleep(1.0)

    def _selector(self) -> str:
        return f"spec.nodeName={self.node_name}"

    async def _relist(self) -> str:
        listed = await api_call(self._core.list_pod_for_all_namespaces, field_selector=self._selector())
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
        allocatable = self._allocatable()
        return fit_failure(pod_requests(specs), used, allocatable, len(self.kubelet.pods))

    def _running_status(self, pod: Obj) -> Obj:
        uid = str(pod["metadata"]["uid"])
        if (pod.get("spec") or {}).get("hostNetwork"):
            ip = self.node_ip
        else:
            ip = self._released_ips.pop(0) if self._released_ips else next(self._free_ips)
            self._pod_ips[uid] = ip
        now = timestamp()
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
            await api_patch(self._core.patch_namespaced_pod_status, meta["name"], meta["namespace"], body)
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
