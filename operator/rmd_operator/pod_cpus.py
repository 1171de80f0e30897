"""A pod flow container's exclusive CPUs: asked of the node's agent until the kubelet has allocated them, and
waited for until no other workload holds them on the node."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from rmd_api.agent.v1 import agent_pb2
from rmd_operator import pods
from rmd_operator.agent_client import CallFailure
from rmd_operator.pod_objects import PodObjects
from rmd_operator.pod_outcomes import PodOutcomes
from rmd_operator.settings import OperatorSettings
from rmd_operator.targets import NodeAgent
from rmd_operator.tracked_pod import TrackedPod

log = logging.getLogger(__name__)

ALLOCATION_POLL = (0.2, 5.0)  # first and longest wait for the kubelet to allocate a container's CPUs
RELEASE_POLL = (0.25, 2.0)  # ... for the agent to release CPUs a previous workload held
_RELEASE_WAIT_SECONDS = 30.0  # after this, the RmdWorkload is created anyway (and fails if still in conflict)
# While a container's CPUs are not allocated, check this often that its pod still exists: a deletion the
# watch missed (its connection was down) would otherwise leave the flow asking forever.
_POD_CHECK_SECONDS = 60.0
# A node without an agent, or a container the kubelet reports no CPUs for, is normal for a moment (the
# operator starting, the pod just scheduled); a Warning Event only when it lasts this long.
_QUIET_SECONDS = 30.0


class PodAgents(Protocol):
    """What the pod flow needs of the agent clients."""

    async def container_cpus(
        self, node: str, endpoint: str, *, namespace: str, pod: str, uid: str, container: str
    ) -> agent_pb2.GetContainerCpusResponse: ...

    async def list_workloads(self, node: str, endpoint: str) -> Sequence[agent_pb2.Workload]: ...


class PodCpus:
    def __init__(
        self,
        settings: OperatorSettings,
        *,
        agents: PodAgents,
        objects: PodObjects,
        outcomes: PodOutcomes,
        node_agents: Mapping[str, NodeAgent],
        still_there: Callable[[TrackedPod], Awaitable[bool]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._agents = agents
        self._objects = objects
        self._outcomes = outcomes
        self._node_agents = node_agents  # the pod flow's live view: node -> its agent
        self._still_there = still_there
        self._clock = clock

    async def cpus(self, pod: TrackedPod, want: pods.ContainerRequest, name: str) -> list[int] | None:
        """The container's exclusive CPUs once the kubelet allocated them; None when it never will (the
        failure is handled) or the pod turned out to be gone."""
        request = pod.request
        short, unreachable = ALLOCATION_POLL[0], self._settings.retry_initial_seconds
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
                await pod.nap(ALLOCATION_POLL[1])
                continue
            waited = self._clock() - started
            agent = self._node_agents.get(request.node)
            if agent is None or not agent.endpoint:
                if waited >= _QUIET_SECONDS:
                    self._trouble(pod, pods.no_agent_problem(want.container, request.node, waited))
                    warned = True
                await pod.nap(short)
                short = min(short * 2, ALLOCATION_POLL[1])
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
                await pod.nap(unreachable)
                unreachable = min(unreachable * 2, self._settings.retry_max_seconds)
                continue
            unreachable = self._settings.retry_initial_seconds
            state = agent_pb2.GetContainerCpusResponse
            if answer.state == state.ALLOCATED and answer.cpus:
                if warned:
                    self._outcomes.event(
                        pod, pods.cpus_found_event(want.container, request.node, answer.cpus)
                    )
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
                self._outcomes.failed(pod, want.container, name, why, never_fits=True)
                return None
            if waited >= _QUIET_SECONDS:
                problem = pods.not_allocated_problem(want.container, request.node, answer.detail, waited)
                self._trouble(pod, problem)
                warned = True
            await pod.nap(short)
            short = min(short * 2, ALLOCATION_POLL[1])

    def _trouble(self, pod: TrackedPod, problem: pods.CpuLookupProblem) -> None:
        """Post the problem's Warning, unless one with its key was posted for the pod already."""
        if problem.key not in pod.troubles:
            pod.troubles.add(problem.key)
            self._outcomes.event(pod, problem.event)
            log.warning(
                "pod %s/%s: %s",
                pod.request.namespace,
                pod.request.name,
                problem.event.message,
                extra={"pod": f"{pod.request.namespace}/{pod.request.name}", "reason": problem.event.reason},
            )

    async def await_released(self, pod: TrackedPod, name: str, cpus: Sequence[int]) -> None:
        """Wait (bounded) until no other workload holds `cpus` on the node. The kubelet gave them to this
        container exclusively, so a holder is almost always the previous pod's workload on its way out."""
        request = pod.request
        deadline = self._clock() + _RELEASE_WAIT_SECONDS
        delay = RELEASE_POLL[0]
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
            await pod.nap(delay)
            delay = min(delay * 2, RELEASE_POLL[1])
