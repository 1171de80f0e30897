"""Reconciling RmdWorkloads with the node agents: apply, re-apply, remove, check for drift. Async; the
decisions themselves are in spec.py, targets.py, status.py and backoff.py, the calls to one node's agent
in node_steps.py, the status write in status_writer.py.

One pass for one workload (`reconcile`), under that workload's lock:

1. the spec becomes the agent's WorkloadSpec; the cluster view (Node labels, RmdNodeStates) gives the
   candidate nodes, split into targets and blocked nodes (with the reason, for their status entries);
2. on every target where something is due, concurrently: apply (never applied by this process, new
   generation, Pending and its node's backoff has expired, a transient rejection at the drift interval) or
   check for drift (ListWorkloads, shared between workloads per node; re-apply if the agent lost it);
3. nodes that have an entry (or were applied to) but are no longer candidates: remove the workload there;
   the entry goes once the agent confirmed (or the node or its agent is gone);
4. the status is merge-patched where it differs, Events are posted for every change of a node's state, and
   the pass returns how long until something is due again.

Deleting a workload (`finalize`, from the deletion handler that holds the finalizer) removes it from every
node the status or this process knows of, and from any node whose agent says it holds it: a status write lost
in a crash cannot leak it. Unreachable nodes make it retry later (the finalizer stays).

ListWorkloads answers are shared between workloads (inventories.py); `orphans` (orphans.py) removes what an
agent holds for RmdWorkloads that no longer exist, for the case where a finalizer was taken off by hand.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from rmd_api.kube_time import now_time as _utc_now
from rmd_operator import status as st
from rmd_operator.backoff import Backoff
from rmd_operator.errors import RetryLater, SpecError
from rmd_operator.inventories import AgentInventories
from rmd_operator.node_steps import Agents, NodeRecord, NodeSteps
from rmd_operator.orphans import OrphanSweeper
from rmd_operator.settings import OperatorSettings
from rmd_operator.spec import requirements, workload_ref, workload_spec
from rmd_operator.status_writer import StatusSink, StatusWriter
from rmd_operator.targets import Cluster, NodeAgent, may_target, plan_targets

log = logging.getLogger(__name__)

_MIN_DELAY = 0.05
_STATUS_RETRY_SECONDS = 2.0


EventSink = Callable[[Mapping[str, Any], st.EventText], None]


@dataclass
class _Memory:
    """What this process remembers of one workload (by uid) between passes."""

    body: Mapping[str, Any]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    outcomes: dict[str, st.Outcome] | None = None  # None until read from the object's status
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    reconciled_generation: int | None = None
    spec_error: str | None = None
    attached: bool = False


def _meta(body: Mapping[str, Any]) -> tuple[str, str, str, int]:
    meta = body.get("metadata") or {}
    return (
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
        str(meta.get("uid") or ""),
        int(meta.get("generation") or 0),
    )


def _deleting(body: Mapping[str, Any]) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


class Reconciler:
    def __init__(
        self,
        settings: OperatorSettings,
        *,
        agents: Agents,
        status_sink: StatusSink,
        events: EventSink,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], str] = _utc_now,
    ) -> None:
        self._settings = settings
        self._agents = agents
        self.status = StatusWriter(status_sink, wallclock)
        self._post = events
        self._clock = clock
        self.backoff = Backoff(settings.retry_initial_seconds, settings.retry_max_seconds)
        self._memories: dict[str, _Memory] = {}
        self.inventories = AgentInventories(agents, clock)
        self._node_labels_seen: dict[str, dict[str, str]] = {}
        self._agents_seen: dict[str, NodeAgent] = {}
        self.orphans = OrphanSweeper(agents, self.inventories, settings.drift_interval_seconds, clock)
        self.steps = NodeSteps(
            settings,
            agents=agents,
            inventories=self.inventories,
            backoff=self.backoff,
            events=events,
            clock=clock,
        )
        self._tasks: set[asyncio.Task[None]] = set()

    # -- bookkeeping -----------------------------------------------------------------------------------------

    def _memory(self, body: Mapping[str, Any]) -> _Memory:
        uid = _meta(body)[2]
        mem = self._memories.get(uid)
        if mem is None:
            mem = self._memories[uid] = _Memory(body)
        else:
            mem.body = body
        return mem

    def attach(self, body: Mapping[str, Any]) -> asyncio.Event:
        """A workload's daemon starts: returns the event that wakes it for another pass."""
        mem = self._memory(body)
        mem.attached = True
        return mem.wake

    def detach(self, uid: str) -> None:
        mem = self._memories.get(uid)
        if mem is not None:
            mem.attached = False

    def workload_changed(self, body: Mapping[str, Any]) -> None:
        """A watch event for a workload: wake its daemon if its spec changed since the last pass."""
        uid, generation = _meta(body)[2], _meta(body)[3]
        mem = self._memories.get(uid)
        if mem is not None and mem.reconciled_generation != generation:
            mem.wake.set()

    def _wake_for(self, node: str) -> int:
        woken = 0
        for mem in self._memories.values():
            spec = mem.body.get("spec") or {}
            if mem.attached and may_target(spec, node, (mem.outcomes or {}).keys() | mem.nodes.keys()):
                mem.wake.set()
                woken += 1
        return woken

    def node_changed(self, node: str, labels: Mapping[str, str] | None) -> None:
        """A Node was added, relabelled or deleted (labels None): wake the workloads it may concern."""
        if labels is None:
            if self._node_labels_seen.pop(node, None) is None:
                return
        else:
            if self._node_labels_seen.get(node) == labels:
                return
            self._node_labels_seen[node] = dict(labels)
        woken = self._wake_for(node)
        log.debug("node %s changed; %d workload(s) woken", node, woken, extra={"node": node, "woken": woken})

    def agent_changed(self, node: str, agent: NodeAgent | None) -> bool:
        """A node's RmdNodeState was written or deleted (None). Returns whether anything relevant changed."""
        before = self._agents_seen.get(node)
        if before == agent:
            return False
        if agent is None:
            self._agents_seen.pop(node, None)
        else:
            self._agents_seen[node] = agent
        if before is None or agent is None or before.endpoint != agent.endpoint:
            self._agents.forget(node)  # a new endpoint (or none): a new connection
            self.inventories.forget(node)
        if agent is not None and (
            before is None or before.endpoint != agent.endpoint or (agent.ready and not before.ready)
        ):
            self.backoff.reset(node)  # a restarted or re-ready agent is worth trying at once
            for mem in self._memories.values():
                record = mem.nodes.get(node)
                if record is not None:
                    record.checked_at = float("-inf")  # and worth a drift check: did it keep its workloads?
        woken = self._wake_for(node)
        endpoint = agent.endpoint if agent else None
        log.info(
            "agent of node %s changed (endpoint %s); %d workload(s) woken",
            node,
            endpoint,
            woken,
            extra={"node": node, "endpoint": endpoint, "woken": woken},
        )
        return True

    def health(self) -> dict[str, int]:
        return {
            "workloads": sum(1 for m in self._memories.values() if m.attached),
            "nodes_backing_off": sum(1 for n in self._agents_seen if not self.backoff.due(n, self._clock())),
        }

    def spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        """Run a background job (tracked, cancelled by close(), its failure logged)."""

        async def run() -> None:
            try:
                await coro
            except Exception:
                log.exception("background job failed")

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            coro.close()  # never started (cancelled at once): no "never awaited" warning

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(done)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.inventories.close()

    # -- one pass --------------------------------------------------------------------------------------------

    async def reconcile(self, body: Mapping[str, Any], cluster: Cluster) -> float:
        """One pass for the workload; returns the seconds until the next pass is due. Nothing once the object
        is being deleted: from then on only `finalize` acts on it (it may run while the daemon stops)."""
        if _deleting(body):
            return self._settings.drift_interval_seconds
        mem = self._memory(body)
        async with mem.lock:
            if _deleting(body):
                return self._settings.drift_interval_seconds
            return await self._reconcile(body, mem, cluster)

    def _load_outcomes(self, body: Mapping[str, Any], mem: _Memory) -> dict[str, st.Outcome]:
        if mem.outcomes is None:  # first pass in this process: start from what the object records
            stored = (body.get("status") or {}).get("workloadStates") or {}
            mem.outcomes = {
                str(node): st.outcome_from_entry(e) for node, e in stored.items() if isinstance(e, Mapping)
            }
        return mem.outcomes

    async def _reconcile(self, body: Mapping[str, Any], mem: _Memory, cluster: Cluster) -> float:
        namespace, name, uid, generation = _meta(body)
        await self._agents.refresh_credentials()
        previous = dict(self._load_outcomes(body, mem))
        try:
            spec = workload_spec(body.get("spec") or {})
        except SpecError as exc:
            if mem.spec_error != str(exc):
                self._post(body, st.EventText("Warning", "InvalidSpec", str(exc)))
            mem.spec_error = str(exc)
            await self.status.write(body, previous, generation, spec_error=str(exc))
            mem.reconciled_generation = generation
            return self._settings.drift_interval_seconds
        mem.spec_error = None
        ref = workload_ref(namespace, name, uid)
        plan = plan_targets(body.get("spec") or {}, requirements(spec), cluster.node_labels, cluster.agents)
        now = self._clock()

        outcomes: dict[str, st.Outcome] = {}
        observed = (body.get("status") or {}).get("observedGeneration")
        for node, blocked in plan.blocked.items():
            prev, record = previous.get(node), mem.nodes.get(node)
            current = record.generation == generation if record is not None else observed == generation
            if blocked.agent_only and prev is not None and prev.status == st.SUCCESSFUL and current:
                # still enforced there; the agent is needed only for the next change
                outcomes[node] = dataclasses.replace(prev, unconfirmed=blocked.message or blocked.reason)
            else:
                outcomes[node] = st.blocked(blocked.status, blocked.reason, blocked.message)
        jobs: dict[str, Awaitable[st.Outcome | None]] = {}
        for node, endpoint in plan.targets.items():
            why = self.steps.due(mem.nodes.get(node), previous.get(node), node, generation, now)
            if why is None:
                outcomes[node] = previous[node]
            else:
                jobs[node] = self.steps.apply(
                    body=body,
                    nodes=mem.nodes,
                    prev=previous.get(node),
                    node=node,
                    endpoint=endpoint,
                    ref=ref,
                    spec=spec,
                    generation=generation,
                    why=why,
                )
        leaving = sorted((previous.keys() | mem.nodes.keys()) - plan.candidates)
        for node in leaving:
            jobs[node] = self.steps.remove(
                body=body, nodes=mem.nodes, node=node, ref=ref, cluster=cluster, prev=previous.get(node)
            )
        results = await asyncio.gather(*jobs.values())
        for node, result in zip(jobs, results, strict=True):
            if result is not None:
                outcomes[node] = result

        for node in sorted(plan.blocked):
            event = st.transition_event(node, previous.get(node), outcomes[node])
            if event is not None:
                self._post(body, event)
        mem.outcomes = outcomes
        written = await self.status.write(body, outcomes, generation)
        mem.reconciled_generation = generation

        now = self._clock()
        due = [
            self.steps.next_due(mem.nodes.get(node), outcomes.get(node), node, now) for node in plan.targets
        ]
        due += [
            self.backoff.next_attempt(node) or now + self._settings.retry_initial_seconds
            for node in leaving
            if node in outcomes
        ]
        delay = min([self._settings.drift_interval_seconds, *(d - now for d in due)])
        if not written:
            delay = min(delay, _STATUS_RETRY_SECONDS)
        return max(_MIN_DELAY, delay)

    # -- deletion --------------------------------------------------------------------------------------------

    async def finalize(self, body: Mapping[str, Any], cluster: Cluster) -> None:
        """Remove the workload from every node that may hold it. RetryLater if some node could not be reached
        (the caller keeps the finalizer and calls again)."""
        mem = self._memory(body)
        async with mem.lock:
            await self._finalize(body, mem, cluster)
            self._memories.pop(_meta(body)[2], None)
            self.status.forget(_meta(body)[2])

    async def _finalize(self, body: Mapping[str, Any], mem: _Memory, cluster: Cluster) -> None:
        namespace, name, uid, generation = _meta(body)
        ref = workload_ref(namespace, name, uid)
        known = set(self._load_outcomes(body, mem)) | set(mem.nodes)
        failed = await self.steps.remove_everywhere(
            body=body, nodes=mem.nodes, known=known, cluster=cluster, ref=ref
        )
        if failed:
            outcomes = {node: st.removal_pending(error) for node, error in failed.items()}
            previous = mem.outcomes or {}
            for node, outcome in outcomes.items():
                if not outcome.same_state(previous.get(node)):
                    self._post(
                        body,
                        st.EventText("Warning", "RemoveFailed", f"node {node}: {failed[node]}; retrying"),
                    )
            mem.outcomes = outcomes
            await self.status.write(body, outcomes, generation)
            delay = min((self.backoff.next_attempt(n) or 0.0) for n in failed) - self._clock()
            raise RetryLater(
                f"could not remove the workload from {', '.join(sorted(failed))} yet",
                delay=max(self._settings.retry_initial_seconds, delay),
            )
