"""The pod flow: pods asking for `intel.com/l3_cache_ways` get an RmdWorkload per container. Async
orchestration; the decisions are in pods.py. The RmdWorkloads it writes are ordinary ones: the reconcile loop
applies them to the node's agent, and removes them when the garbage collector deletes them with their pod.

For each pod (by uid) whose request changed:

1. an Event for each refusal (not Guaranteed, fractional CPUs, invalid annotations) and for annotations that
   configure nothing;
2. per qualifying container, concurrently:
   a. once the node's kubelet has taken the pod (its status has a start time: the kubelet admitted it), its
      CPUs from the node's agent (GetContainerCpus), retried until the kubelet has allocated them (and
      while the agent is unreachable, with backoff). A failed call gives a Warning Event at once, and so
      does a node without an agent or a kubelet reporting no CPUs for the container after
      _QUIET_SECONDS (normal for a moment after scheduling); each kind of trouble once per container, not
      once per retry. Getting the CPUs after such a Warning gives a Normal Event;
   b. an RmdWorkload of that name owned by an earlier pod of the same name (a StatefulSet's) is deleted and
      waited out; one that is not a pod's is left alone (Event);
   c. if the agent still holds another workload on those CPUs (the previous pod's, released only after the
      garbage collector deleted its RmdWorkload), wait for it to go, for a bounded time;
   d. create the RmdWorkload, or patch it where it differs (compare before write);
3. the workload's status on the pod's node (workload_changed): Successful gives a Normal Event on the pod;
   Failed an Event, and the pod is deleted unless delete_failed_pods is false or the failure can never pass
   on that node (pods.on_failure: deleting would only make its controller create it again, perhaps on the
   same node, forever).

A finished pod (Succeeded, Failed) keeps its object but not its CPUs: its RmdWorkloads are deleted, since the
garbage collector only acts once the pod object goes. A pod its kubelet refused at admission (Failed with
TopologyAffinityError, UnexpectedAdmissionError, ...) gets one Warning quoting the kubelet, and nothing else.
A pod flow RmdWorkload deleted while its pod runs is created again, as rmd-operator did.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_api.agent.v1 import agent_pb2
from rmd_api.names import RMD_WORKLOAD
from rmd_operator import pods
from rmd_operator.agent_client import CallFailure
from rmd_operator.errors import OperatorError
from rmd_operator.kube import KubeError, load_configuration
from rmd_operator.settings import OperatorSettings
from rmd_operator.status import FAILED, SUCCESSFUL, EventText
from rmd_operator.targets import NodeAgent

log = logging.getLogger(__name__)

_ALLOCATION_POLL = (0.2, 5.0)  # first and longest wait for the kubelet to allocate a container's CPUs
_RELEASE_POLL = (0.25, 2.0)  # ... for the agent to release CPUs a previous workload held
_RELEASE_WAIT_SECONDS = 30.0  # after this, the RmdWorkload is created anyway (and fails if still in conflict)
# While a container's CPUs are not allocated, check this often that its pod still exists: a deletion the
# watch missed (its connection was down) would otherwise leave the flow asking forever.
_POD_CHECK_SECONDS = 60.0
# A node without an agent, or a container the kubelet reports no CPUs for, is normal for a moment (the
# operator starting, the pod just scheduled); a Warning Event only when it lasts this long.
_QUIET_SECONDS = 30.0
_REQUEST_TIMEOUT_SECONDS = 30.0

Obj = dict[str, Any]
EventSink = Callable[[Mapping[str, Any], EventText], None]


class ObjectRefused(OperatorError):
    """The API server refused a write for a reason retrying will not fix (invalid, forbidden)."""


class PodAgents(Protocol):
    """What the pod flow needs of the agent clients."""

    async def container_cpus(
        self, node: str, endpoint: str, *, namespace: str, pod: str, uid: str, container: str
    ) -> agent_pb2.GetContainerCpusResponse: ...

    async def list_workloads(self, node: str, endpoint: str) -> Sequence[agent_pb2.Workload]: ...


class PodObjects(Protocol):
    """The pod flow's reads and writes in the API. KubeError for trouble worth retrying, ObjectRefused for the
    rest."""

    async def get_workload(self, namespace: str, name: str) -> Obj | None: ...

    async def create_workload(self, body: Mapping[str, Any]) -> Obj | None:
        """The created object; None when one of that name exists already."""

    async def patch_workload(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Obj | None:
        """The patched object; None when it is gone."""

    async def delete_workload(self, namespace: str, name: str, uid: str) -> None:
        """Delete it if it still is the object with `uid`."""

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the pod if it still is the one with `uid`; whether it was deleted by this call."""

    async def pod_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the pod of that name, None if there is none."""

    async def container_started(self, namespace: str, name: str, uid: str, container: str) -> bool:
        """Whether the pod with `uid` shows the container started (running or ended) in its status."""


# -- the I/O implementations -------------------------------------------------------------------------------


def _api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")


class PodObjectsApi:
    """PodObjects over the `kubernetes` client, every call in a worker thread. `close()` at exit."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self._objects = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)

    @classmethod
    async def create(cls) -> PodObjectsApi:
        configuration = await asyncio.to_thread(load_configuration)
        return cls(client.ApiClient(configuration=configuration))

    def close(self) -> None:
        self._api.close()

    async def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Obj | None:
        """The answer as plain JSON; None for 404 and 409 (gone, exists, or a failed uid precondition)."""

        def call() -> Any:
            return method(*args, _request_timeout=_REQUEST_TIMEOUT_SECONDS, _preload_content=False, **kwargs)

        try:
            response = await asyncio.to_thread(call)
        except ApiException as exc:
            if exc.status in (404, 409):
                return None
            if exc.status in (400, 403, 422):
                raise ObjectRefused(f"{what}: {_api_message(exc)}") from None
            raise KubeError(f"{what}: {_api_message(exc)}") from None
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            raise KubeError(f"{what}: {exc}") from None
        result: Obj = json.loads(response.data) if response.data else {}
        return result

    async def get_workload(self, namespace: str, name: str) -> Obj | None:
        return await self._call(
            f"read RmdWorkload {namespace}/{name}",
            self._objects.get_namespaced_custom_object,
            RMD_WORKLOAD.group,
            RMD_WORKLOAD.version,
            namespace,
            RMD_WORKLOAD.plural,
            name,
        )

    async def create_workload(self, body: Mapping[str, Any]) -> Obj | None:
        meta = body["metadata"]
        return await self._call(
            f"create RmdWorkload {meta['namespace']}/{meta['name']}",
            self._objects.create_namespaced_custom_object,
            RMD_WORKLOAD.group,
            RMD_WORKLOAD.version,
            meta["namespace"],
            RMD_WORKLOAD.plural,
            dict(body),
        )

    async def patch_workload(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Obj | None:
        return await self._call(
            f"update RmdWorkload {namespace}/{name}",
            self._objects.patch_namespaced_custom_object,
            RMD_WORKLOAD.group,
            RMD_WORKLOAD.version,
            namespace,
            RMD_WORKLOAD.plural,
            name,
            dict(patch),
            _content_type="application/merge-patch+json",
        )

    async def delete_workload(self, namespace: str, name: str, uid: str) -> None:
        await self._call(
            f"delete RmdWorkload {namespace}/{name}",
            self._objects.delete_namespaced_custom_object,
            RMD_WORKLOAD.group,
            RMD_WORKLOAD.version,
            namespace,
            RMD_WORKLOAD.plural,
            name,
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
        )

    async def pod_uid(self, namespace: str, name: str) -> str | None:
        found = await self._call(
            f"read pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace
        )
        return None if found is None else str((found.get("metadata") or {}).get("uid") or "")

    async def container_started(self, namespace: str, name: str, uid: str, container: str) -> bool:
        found = await self._call(
            f"read pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace
        )
        if found is None or (found.get("metadata") or {}).get("uid") != uid:
            return False
        statuses = (found.get("status") or {}).get("containerStatuses") or []
        status: dict[str, Any] = next((s for s in statuses if s.get("name") == container), {})
        state = status.get("state") or {}
        return bool(status.get("started") or state.get("running") or state.get("terminated"))

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        deleted = await self._call(
            f"delete pod {namespace}/{name}",
            self._core.delete_namespaced_pod,
            name,
            namespace,
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
        )
        return deleted is not None


# -- the flow ----------------------------------------------------------------------------------------------


@dataclass
class _Pod:
    """What this process knows of one pod (by uid)."""

    request: pods.PodRequest
    ref: Obj  # for Events
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # container -> its task
    states: dict[str, str] = field(default_factory=dict)  # container -> last status seen on the node
    written: set[str] = field(default_factory=set)  # containers whose workload this process wrote
    posted: set[tuple[str, str]] = field(default_factory=set)  # (reason, message) of refusals posted
    troubles: set[str] = field(default_factory=set)  # keys of CpuLookupProblems posted
    stopping: bool = False  # terminating or finished: nothing is created any more
    deleting: bool = False  # the flow deleted the pod
    awaiting_kubelet: bool = False  # bound, but its kubelet has not taken it yet (pods.awaiting_kubelet)


def _deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _ways_text(want: pods.ContainerRequest) -> str:
    if want.policy is not None:
        return f"policy {want.policy}"
    low = want.cache_min if want.cache_min is not None else want.ways
    return f"{want.ways} cache ways" if low == want.ways else f"{low}-{want.ways} cache ways (best effort)"


class PodFlow:
    def __init__(
        self,
        settings: OperatorSettings,
        *,
        agents: PodAgents,
        objects: PodObjects,
        events: EventSink,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._agents = agents
        self._objects = objects
        self._post = events
        self._node_agents: dict[str, NodeAgent] = {}
        self._clock = clock
        self._pods: dict[str, _Pod] = {}
        self._jobs: set[asyncio.Task[None]] = set()

    # -- events from the watches ----------------------------------------------------------------------------

    def pod_changed(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """A watch event (None: the initial listing) for a pod on a node that asks for cache ways."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        tracked = self._pods.get(uid)
        if event_type == "DELETED":
            if tracked is not None:
                self._stop(tracked)
                del self._pods[uid]
            return
        if _deleting(pod):
            if tracked is not None:
                self._stop(tracked)  # the garbage collector deletes its workloads once it is gone
            return
        if (pod.get("status") or {}).get("phase") in pods.TERMINAL_PHASES:
            if tracked is None or not tracked.stopping:
                tracked = tracked or self._track(uid, pod, pods.pod_request(pod))
                self._stop(tracked)
                rejected = pods.admission_rejection(pod)
                if rejected is not None:
                    self._post_once(tracked, rejected)
                self._spawn(self._delete_workloads(tracked, tracked.request.containers, "the pod finished"))
            return
        request = pods.pod_request(pod)
        if tracked is not None and tracked.request == request:
            tracked.awaiting_kubelet = pods.awaiting_kubelet(pod)
            tracked.wake.set()  # e.g. now Running: a good moment to ask for its CPUs again
            return
        if tracked is None:
            tracked = self._track(uid, pod, request)
        else:
            self._stop(tracked)
            tracked.stopping = False
            dropped = [c for c in tracked.request.containers if c.container not in request.names()]
            tracked.request = request
            if dropped:
                self._spawn(self._delete_workloads(tracked, dropped, "its request no longer qualifies"))
        tracked.awaiting_kubelet = pods.awaiting_kubelet(pod)
        self._announce(tracked)
        for want in request.containers:
            self._start(tracked, want)

    def workload_changed(self, event_type: str | None, workload: Mapping[str, Any]) -> None:
        """A watch event for an RmdWorkload: the status of a pod's workload, or its deletion."""
        pod = self._pods.get(pods.owner_pod_uid(workload) or "")
        if pod is None:
            return
        name = str((workload.get("metadata") or {}).get("name") or "")
        want = next(
            (c for c in pod.request.containers if pods.workload_name(pod.request.name, c.container) == name),
            None,
        )
        if want is None:
            return
        if event_type == "DELETED":
            task = pod.tasks.get(want.container)
            if not pod.stopping and (task is None or task.done()):
                log.info(
                    "RmdWorkload %s/%s was deleted while its pod runs; creating it again",
                    pod.request.namespace,
                    name,
                    extra={"workload": f"{pod.request.namespace}/{name}"},
                )
                pod.states.pop(want.container, None)
                self._start(pod, want)
            return
        self._observe(pod, want, workload)

    def agent_changed(self, node: str, agent: NodeAgent | None) -> None:
        """A node's RmdNodeState was written (or deleted: None): pods waiting for its agent may go on."""
        if agent is None:
            self._node_agents.pop(node, None)
        else:
            self._node_agents[node] = agent
        for pod in self._pods.values():
            if pod.request.node == node:
                pod.wake.set()

    def health(self) -> dict[str, int]:
        return {"pods": len(self._pods)}

    async def close(self) -> None:
        tasks = [*self._jobs, *(t for p in self._pods.values() for t in p.tasks.values())]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- bookkeeping ----------------------------------------------------------------------------------------

    def _track(self, uid: str, pod: Mapping[str, Any], request: pods.PodRequest) -> _Pod:
        tracked = self._pods[uid] = _Pod(request, pods.pod_reference(pod))
        return tracked

    def _stop(self, pod: _Pod) -> None:
        pod.stopping = True
        for task in pod.tasks.values():
            task.cancel()
        pod.tasks.clear()

    def _start(self, pod: _Pod, want: pods.ContainerRequest) -> None:
        old = pod.tasks.pop(want.container, None)
        if old is not None:
            old.cancel()
        task = asyncio.get_running_loop().create_task(self._guarded(self._ensure(pod, want)))
        pod.tasks[want.container] = task

        def done(finished: asyncio.Task[None]) -> None:
            if pod.tasks.get(want.container) is finished:
                del pod.tasks[want.container]

        task.add_done_callback(done)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(self._guarded(coro))
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    @staticmethod
    async def _guarded(coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod flow job failed")

    def _event(self, pod: _Pod, event: EventText) -> None:
        self._post(pod.ref, event)

    def _announce(self, pod: _Pod) -> None:
        """Events for the request's refusals and ignored annotations, each once per pod."""
        texts = [pods.refusal_event(r) for r in pod.request.refusals]
        if pod.request.ignored:
            texts.append(pods.ignored_event(pod.request.ignored))
        for text in texts:
            self._post_once(pod, text)

    def _post_once(self, pod: _Pod, text: EventText) -> None:
        """Post the Event and log it, unless this process posted the same one for the pod already."""
        if (text.reason, text.message) in pod.posted:
            return
        pod.posted.add((text.reason, text.message))
        self._event(pod, text)
        log.info(
            "pod %s/%s: %s",
            pod.request.namespace,
            pod.request.name,
            text.message,
            extra={"pod": f"{pod.request.namespace}/{pod.request.name}", "reason": text.reason},
        )

    async def _nap(self, pod: _Pod, seconds: float) -> None:
        """Sleep `seconds`, or less if something about the pod or its node's agent changed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pod.wake.wait(), seconds)
        pod.wake.clear()

    # -- one container --------------------------------------------------------------------------------------

    async def _ensure(self, pod: _Pod, want: pods.ContainerRequest) -> None:
        request = pod.request
        namespace, name = request.namespace, pods.workload_name(request.name, want.container)
        cpus = await self._cpus(pod, want, name)
        if cpus is None:
            return
        delay = self._settings.retry_initial_seconds
        while True:
            try:
                current = await self._put(pod, want, name, cpus)
            except ObjectRefused as exc:
                self._event(
                    pod,
                    EventText(
                        "Warning",
                        pods.INVALID_REQUEST,
                        f"container {want.container}: RmdWorkload {name} cannot be written ({exc}); the "
                        "container gets no cache ways",
                    ),
                )
                return
            except KubeError as exc:
                log.warning(
                    "pod %s/%s: %s; retrying",
                    namespace,
                    request.name,
                    exc,
                    extra={"workload": f"{namespace}/{name}", "error": str(exc)},
                )
                await self._nap(pod, delay)
                delay = min(delay * 2, self._settings.retry_max_seconds)
                continue
            if current is None:
                await self._nap(pod, _RELEASE_POLL[0])
                continue  # raced with another writer or an earlier pod's workload: look again
            self._observe(pod, want, current)
            return

    async def _put(
        self, pod: _Pod, want: pods.ContainerRequest, name: str, cpus: Sequence[int]
    ) -> Obj | None:
        """Create the workload or bring it up to date; the object as written, or None to look again."""
        request = pod.request
        current = await self._objects.get_workload(request.namespace, name)
        if current is not None:
            owner = pods.owner_pod_uid(current)
            if owner is None:
                raise ObjectRefused(f"an RmdWorkload named {name} exists and does not belong to this pod")
            if owner != request.uid:
                # An earlier pod of the same name (a StatefulSet's): the garbage collector deletes its
                # workload; do it now, and wait until the agents released it.
                if not _deleting(current):
                    uid = str((current.get("metadata") or {}).get("uid") or "")
                    await self._objects.delete_workload(request.namespace, name, uid)
                await self._nap(pod, _RELEASE_POLL[1])
                return None
        desired = pods.workload_body(request, want, cpus)
        if current is None:
            await self._await_released(pod, name, cpus)
            created = await self._objects.create_workload(desired)
            if created is not None:
                pod.written.add(want.container)
                log.info(
                    "created RmdWorkload %s/%s for pod %s on node %s (cpus %s, %s)",
                    request.namespace,
                    name,
                    request.name,
                    request.node,
                    ",".join(pods.core_ids(cpus)),
                    _ways_text(want),
                    extra={"workload": f"{request.namespace}/{name}", "node": request.node},
                )
            return created
        patch = pods.workload_patch(current, desired)
        if patch is None:
            return current
        if "coreIds" in (patch.get("spec") or {}):
            await self._await_released(pod, name, cpus)
        patched = await self._objects.patch_workload(request.namespace, name, patch)
        if patched is not None:
            pod.written.add(want.container)
            log.info(
                "updated RmdWorkload %s/%s for pod %s",
                request.namespace,
                name,
                request.name,
                extra={"workload": f"{request.namespace}/{name}", "node": request.node},
            )
        return patched

    async def _cpus(self, pod: _Pod, want: pods.ContainerRequest, name: str) -> list[int] | None:
        """The container's exclusive CPUs once the kubelet allocated them; None when it never will (the
        failure is handled) or the pod turned out to be gone."""
        request = pod.request
        short, unreachable = _ALLOCATION_POLL[0], self._settings.retry_initial_seconds
        started = self._clock()
        check_at = started + _POD_CHECK_SECONDS
        warned = False  # a Warning about this container's CPUs is out
        while True:
            if self._clock() >= check_at:
                check_at = self._clock() + _POD_CHECK_SECONDS
                if not await self._still_there(pod):
                    return None
            if pod.awaiting_kubelet:
                # Nothing to ask for before admission; the pod's next status (admitted or refused) wakes us.
                started = self._clock()
                await self._nap(pod, _ALLOCATION_POLL[1])
                continue
            waited = self._clock() - started
            agent = self._node_agents.get(request.node)
            if agent is None or not agent.endpoint:
                if waited >= _QUIET_SECONDS:
                    self._trouble(pod, pods.no_agent_problem(want.container, request.node, waited))
                    warned = True
                await self._nap(pod, short)
                short = min(short * 2, _ALLOCATION_POLL[1])
                continue
            try:
                answer = await self._agents.container_cpus(
                    request.node,
                    agent.endpoint,
                    namespace=request.namespace,
                    pod=request.name,
                    uid=request.uid,
                    container=want.container,
                )
            except CallFailure as exc:
                log.info(
                    "pod %s/%s: cannot ask the agent of node %s for its CPUs: %s; retrying",
                    request.namespace,
                    request.name,
                    request.node,
                    exc,
                    extra={"node": request.node, "error": str(exc)},
                )
                problem = pods.call_failed_problem(
                    want.container, request.node, agent.endpoint, exc.code, exc.message
                )
                self._trouble(pod, problem)
                warned = True
                await self._nap(pod, unreachable)
                unreachable = min(unreachable * 2, self._settings.retry_max_seconds)
                continue
            unreachable = self._settings.retry_initial_seconds
            state = agent_pb2.GetContainerCpusResponse
            if answer.state == state.ALLOCATED and answer.cpus:
                if warned:
                    self._event(pod, pods.cpus_found_event(want.container, request.node, answer.cpus))
                return sorted(answer.cpus)
            # A real kubelet lists an admitted container in PodResources a moment before its CPU manager
            # allocates (seen on a real node: the pod was failed and deleted in that window). The CPUs are
            # allocated before the container starts, so only a started container without them is final.
            if answer.state == state.NOT_EXCLUSIVE and await self._objects.container_started(
                request.namespace, request.name, request.uid, want.container
            ):
                # A Guaranteed container with whole CPUs in the shared pool: the kubelet's CPU manager policy
                # is not static, which no new pod on this node changes.
                why = (
                    f"the kubelet gave the container no exclusive CPUs ({answer.detail}): its CPU manager "
                    "policy is not static"
                )
                self._failed(pod, want.container, name, why, never_fits=True)
                return None
            if waited >= _QUIET_SECONDS:
                problem = pods.not_allocated_problem(want.container, request.node, answer.detail, waited)
                self._trouble(pod, problem)
                warned = True
            await self._nap(pod, short)
            short = min(short * 2, _ALLOCATION_POLL[1])

    def _trouble(self, pod: _Pod, problem: pods.CpuLookupProblem) -> None:
        """Post the problem's Warning, unless one with its key was posted for the pod already."""
        if problem.key not in pod.troubles:
            pod.troubles.add(problem.key)
            self._event(pod, problem.event)
            log.warning(
                "pod %s/%s: %s",
                pod.request.namespace,
                pod.request.name,
                problem.event.message,
                extra={"pod": f"{pod.request.namespace}/{pod.request.name}", "reason": problem.event.reason},
            )

    async def _still_there(self, pod: _Pod) -> bool:
        """Whether the pod still exists; forgets it if not."""
        request = pod.request
        try:
            uid = await self._objects.pod_uid(request.namespace, request.name)
        except (KubeError, ObjectRefused):
            return True  # cannot tell: keep going
        if uid == request.uid:
            return True
        log.info(
            "pod %s/%s (uid %s) is gone; forgetting it",
            request.namespace,
            request.name,
            request.uid,
            extra={"pod": f"{request.namespace}/{request.name}"},
        )
        if self._pods.get(request.uid) is pod:
            del self._pods[request.uid]
        self._stop(pod)  # its other containers' tasks too (this one returns at once)
        return False

    async def _await_released(self, pod: _Pod, name: str, cpus: Sequence[int]) -> None:
        """Wait (bounded) until no other workload holds `cpus` on the node. The kubelet gave them to this
        container exclusively, so a holder is almost always the previous pod's workload on its way out."""
        request = pod.request
        deadline = self._clock() + _RELEASE_WAIT_SECONDS
        delay = _RELEASE_POLL[0]
        wanted = set(cpus)
        while True:
            agent = self._node_agents.get(request.node)
            if agent is None or not agent.endpoint:
                return
            try:
                listed = await self._agents.list_workloads(request.node, agent.endpoint)
            except CallFailure:
                return  # the apply will tell
            holders = sorted(
                f"{w.ref.namespace}/{w.ref.name}"
                for w in listed
                if (w.ref.namespace, w.ref.name) != (request.namespace, name) and wanted & set(w.cpus)
            )
            if not holders:
                return
            if self._clock() >= deadline:
                log.warning(
                    "cpus of %s/%s are still held by %s after %.0fs; creating it anyway",
                    request.namespace,
                    name,
                    ", ".join(holders),
                    _RELEASE_WAIT_SECONDS,
                    extra={"workload": f"{request.namespace}/{name}", "holders": holders},
                )
                return
            log.info(
                "waiting for %s to release cpus of %s/%s on node %s",
                ", ".join(holders),
                request.namespace,
                name,
                request.node,
                extra={"workload": f"{request.namespace}/{name}", "holders": holders},
            )
            await self._nap(pod, delay)
            delay = min(delay * 2, _RELEASE_POLL[1])

    # -- outcomes -------------------------------------------------------------------------------------------

    def _observe(self, pod: _Pod, want: pods.ContainerRequest, workload: Mapping[str, Any]) -> None:
        """React to the workload's state on the pod's node, once per change of state."""
        if pod.stopping:
            return
        state = pods.node_state(workload, pod.request.node)
        if state is None:
            return
        previous = pod.states.get(want.container)
        pod.states[want.container] = state.status
        if state.status == previous:
            return
        name = str((workload.get("metadata") or {}).get("name") or "")
        if state.status == SUCCESSFUL:
            # Not after an operator restart for a workload that was already fine: nothing happened.
            if previous is not None or want.container in pod.written:
                self._event(
                    pod, pods.applied_event(want.container, name, pod.request.node, _ways_text(want), state)
                )
        elif state.status == FAILED:
            _, _, why = state.response.partition(": ")
            self._failed(pod, want.container, name, why or state.response, never_fits=state.never_fits)

    def _failed(
        self, pod: _Pod, container: str, workload: str, why: str, *, never_fits: bool = False
    ) -> None:
        decision = pods.on_failure(
            self._settings.delete_failed_pods,
            container,
            workload,
            pod.request.node,
            why,
            never_fits=never_fits,
        )
        self._event(pod, decision.event)
        log.warning(
            "pod %s/%s: %s",
            pod.request.namespace,
            pod.request.name,
            decision.event.message,
            extra={"pod": f"{pod.request.namespace}/{pod.request.name}", "workload": workload},
        )
        if decision.delete_pod and not pod.deleting:
            pod.deleting = True
            self._spawn(self._delete_pod(pod))

    async def _delete_pod(self, pod: _Pod) -> None:
        request = pod.request
        delay = self._settings.retry_initial_seconds
        while True:
            try:
                deleted = await self._objects.delete_pod(request.namespace, request.name, request.uid)
            except KubeError as exc:
                log.warning("cannot delete pod %s/%s: %s; retrying", request.namespace, request.name, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._settings.retry_max_seconds)
                continue
            except ObjectRefused as exc:
                log.error("cannot delete pod %s/%s: %s", request.namespace, request.name, exc)
                return
            log.info(
                "deleted pod %s/%s: its cache request failed (found: %s)",
                request.namespace,
                request.name,
                deleted,
                extra={"pod": f"{request.namespace}/{request.name}"},
            )
            return

    async def _delete_workloads(
        self, pod: _Pod, containers: Sequence[pods.ContainerRequest], why: str
    ) -> None:
        """Delete the pod's workloads for `containers` (those still its own), retrying API trouble. A finished
        pod's CPUs went back to the kubelet's shared pool; the garbage collector would wait for the object."""
        request = pod.request
        for want in containers:
            name = pods.workload_name(request.name, want.container)
            delay = self._settings.retry_initial_seconds
            while True:
                try:
                    current = await self._objects.get_workload(request.namespace, name)
                    if current is None or pods.owner_pod_uid(current) != request.uid or _deleting(current):
                        break
                    uid = str((current.get("metadata") or {}).get("uid") or "")
                    await self._objects.delete_workload(request.namespace, name, uid)
                except KubeError as exc:
                    log.warning("cannot delete RmdWorkload %s/%s: %s; retrying", request.namespace, name, exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._settings.retry_max_seconds)
                    continue
                except ObjectRefused as exc:
                    log.error("cannot delete RmdWorkload %s/%s: %s", request.namespace, name, exc)
                    break
                log.info(
                    "deleted RmdWorkload %s/%s of pod %s: %s",
                    request.namespace,
                    name,
                    request.name,
                    why,
                    extra={"workload": f"{request.namespace}/{name}"},
                )
                break
