"""The pod flow: pods asking for `intel.com/l3_cache_ways` get an RmdWorkload per container. Async
orchestration; the decisions are in pods.py, waiting for a container's CPUs in pod_cpus.py, what follows a
workload's outcome in pod_outcomes.py, the API calls in pod_objects.py. The RmdWorkloads it writes are
ordinary ones: the reconcile loop applies them to the node's agent, and removes them when the garbage
collector deletes them with their pod.

For each pod (by uid) whose request changed:

1. an Event for each refusal (not Guaranteed, fractional CPUs), and one for all the annotation problems
   (invalid values, annotations that configure nothing);
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
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rmd_operator import pod_cpus, pods
from rmd_operator.kube import KubeError
from rmd_operator.pod_cpus import PodAgents, PodCpus
from rmd_operator.pod_objects import Obj, ObjectRefused, PodObjects
from rmd_operator.pod_outcomes import EventSink, PodOutcomes
from rmd_operator.settings import OperatorSettings
from rmd_operator.status import EventText
from rmd_operator.targets import NodeAgent
from rmd_operator.tracked_pod import TrackedPod, deleting, guarded, ways_text

log = logging.getLogger(__name__)


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
        self._objects = objects
        self._node_agents: dict[str, NodeAgent] = {}
        self._pods: dict[str, TrackedPod] = {}
        self._outcomes = PodOutcomes(settings, objects=objects, events=events)
        self._cpus = PodCpus(
            settings,
            agents=agents,
            objects=objects,
            outcomes=self._outcomes,
            node_agents=self._node_agents,
            still_there=self._still_there,
            clock=clock,
        )

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
        if deleting(pod):
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
                self._outcomes.spawn(
                    self._outcomes.delete_workloads(tracked, tracked.request.containers, "the pod finished")
                )
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
                self._outcomes.spawn(
                    self._outcomes.delete_workloads(tracked, dropped, "its request no longer qualifies")
                )
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
        self._outcomes.observe(pod, want, workload)

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
        tasks = [t for p in self._pods.values() for t in p.tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._outcomes.close()

    # -- bookkeeping ----------------------------------------------------------------------------------------

    def _track(self, uid: str, pod: Mapping[str, Any], request: pods.PodRequest) -> TrackedPod:
        tracked = self._pods[uid] = TrackedPod(request, pods.pod_reference(pod))
        return tracked

    def _stop(self, pod: TrackedPod) -> None:
        pod.stopping = True
        for task in pod.tasks.values():
            task.cancel()
        pod.tasks.clear()

    def _start(self, pod: TrackedPod, want: pods.ContainerRequest) -> None:
        old = pod.tasks.pop(want.container, None)
        if old is not None:
            old.cancel()
        task = asyncio.get_running_loop().create_task(guarded(self._ensure(pod, want)))
        pod.tasks[want.container] = task

        def done(finished: asyncio.Task[None]) -> None:
            if pod.tasks.get(want.container) is finished:
                del pod.tasks[want.container]

        task.add_done_callback(done)

    def _announce(self, pod: TrackedPod) -> None:
        """Events for the request's refusals and one for all its annotation problems, each once per pod."""
        texts = [pods.refusal_event(r) for r in pod.request.refusals]
        annotations = pods.annotation_event(pod.request)
        if annotations is not None:
            texts.append(annotations)
        for text in texts:
            self._post_once(pod, text)

    def _post_once(self, pod: TrackedPod, text: EventText) -> None:
        """Post the Event and log it, unless this process posted the same one for the pod already."""
        if (text.reason, text.message) in pod.posted:
            return
        pod.posted.add((text.reason, text.message))
        self._outcomes.event(pod, text)
        log.info(
            "pod %s/%s: %s",
            pod.request.namespace,
            pod.request.name,
            text.message,
            extra={"pod": f"{pod.request.namespace}/{pod.request.name}", "reason": text.reason},
        )

    # -- one container --------------------------------------------------------------------------------------

    async def _ensure(self, pod: TrackedPod, want: pods.ContainerRequest) -> None:
        request = pod.request
        namespace, name = request.namespace, pods.workload_name(request.name, want.container)
        cpus = await self._cpus.cpus(pod, want, name)
        if cpus is None:
            return
        delay = self._settings.retry_initial_seconds
        while True:
            try:
                current = await self._put(pod, want, name, cpus)
            except ObjectRefused as exc:
                self._outcomes.event(
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
                await pod.nap(delay)
                delay = min(delay * 2, self._settings.retry_max_seconds)
                continue
            if current is None:
                await pod.nap(pod_cpus.RELEASE_POLL[0])
                continue  # raced with another writer or an earlier pod's workload: look again
            self._outcomes.observe(pod, want, current)
            return

    async def _put(
        self, pod: TrackedPod, want: pods.ContainerRequest, name: str, cpus: Sequence[int]
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
                if not deleting(current):
                    uid = str((current.get("metadata") or {}).get("uid") or "")
                    await self._objects.delete_workload(request.namespace, name, uid)
                await pod.nap(pod_cpus.RELEASE_POLL[1])
                return None
        desired = pods.workload_body(request, want, cpus)
        if current is None:
            await self._cpus.await_released(pod, name, cpus)
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
                    ways_text(want),
                    extra={"workload": f"{request.namespace}/{name}", "node": request.node},
                )
            return created
        patch = pods.workload_patch(current, desired)
        if patch is None:
            return current
        if "coreIds" in (patch.get("spec") or {}):
            await self._cpus.await_released(pod, name, cpus)
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

    async def _still_there(self, pod: TrackedPod) -> bool:
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
