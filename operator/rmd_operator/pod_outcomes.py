"""What becomes of a pod flow workload: Events for its state on the pod's node, deleting a pod whose request
failed, deleting the workloads of a finished pod."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from rmd_operator import pods
from rmd_operator.kube import KubeError
from rmd_operator.pod_objects import ObjectRefused, PodObjects
from rmd_operator.settings import OperatorSettings
from rmd_operator.status import FAILED, SUCCESSFUL, EventText
from rmd_operator.tracked_pod import TrackedPod, deleting, guarded, ways_text

log = logging.getLogger(__name__)

EventSink = Callable[[Mapping[str, Any], EventText], None]


class PodOutcomes:
    def __init__(self, settings: OperatorSettings, *, objects: PodObjects, events: EventSink) -> None:
        self._settings = settings
        self._objects = objects
        self._post = events
        self._jobs: set[asyncio.Task[None]] = set()

    def event(self, pod: TrackedPod, event: EventText) -> None:
        self._post(pod.ref, event)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a job in the background (cancelled by close(), its failure logged)."""
        task = asyncio.get_running_loop().create_task(guarded(coro))
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def close(self) -> None:
        jobs = list(self._jobs)
        for task in jobs:
            task.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)

    def observe(self, pod: TrackedPod, want: pods.ContainerRequest, workload: Mapping[str, Any]) -> None:
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
                self.event(
                    pod, pods.applied_event(want.container, name, pod.request.node, ways_text(want), state)
                )
        elif state.status == FAILED:
            _, _, why = state.response.partition(": ")
            self.failed(pod, want.container, name, why or state.response, never_fits=state.never_fits)

    def failed(
        self, pod: TrackedPod, container: str, workload: str, why: str, *, never_fits: bool = False
    ) -> None:
        decision = pods.on_failure(
            self._settings.delete_failed_pods,
            container,
            workload,
            pod.request.node,
            why,
            never_fits=never_fits,
        )
        self.event(pod, decision.event)
        log.warning(
            "pod %s/%s: %s",
            pod.request.namespace,
            pod.request.name,
            decision.event.message,
            extra={"pod": f"{pod.request.namespace}/{pod.request.name}", "workload": workload},
        )
        if decision.delete_pod and not pod.deleting:
            pod.deleting = True
            self.spawn(self._delete_pod(pod))

    async def _delete_pod(self, pod: TrackedPod) -> None:
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

    async def delete_workloads(
        self, pod: TrackedPod, containers: Sequence[pods.ContainerRequest], why: str
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
                    if current is None or pods.owner_pod_uid(current) != request.uid or deleting(current):
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
