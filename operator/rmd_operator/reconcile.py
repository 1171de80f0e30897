"""Reconciling RmdWorkloads with the node agents: apply, re-apply, remove, check for drift. Async; the
decisions themselves are in spec.py, targets.py, status.py and backoff.py.

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

`sweep_orphans` removes what an agent holds for RmdWorkloads that no longer exist, for the case where a
finalizer was taken off by hand.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rmd_api.agent.v1 import agent_pb2
from rmd_operator import status as st
from rmd_operator.agent_client import CallFailure
from rmd_operator.backoff import Backoff
from rmd_operator.errors import RetryLater, SpecError
from rmd_operator.kube import KubeError
from rmd_operator.settings import OperatorSettings
from rmd_operator.spec import requirements, workload_ref, workload_spec
from rmd_operator.targets import NodeAgent, may_target, plan_targets

log = logging.getLogger(__name__)

_MIN_DELAY = 0.05
_STATUS_RETRY_SECONDS = 2.0


class Agents(Protocol):
    """What the reconciler needs of the agent clients (agent_client.AgentClients)."""

    async def apply(
        self, node: str, endpoint: str, ref: agent_pb2.WorkloadRef, spec: agent_pb2.WorkloadSpec
    ) -> tuple[agent_pb2.Workload, bool]: ...

    async def remove(self, node: str, endpoint: str, ref: agent_pb2.WorkloadRef) -> bool: ...

    async def list_workloads(self, node: str, endpoint: str) -> Sequence[agent_pb2.Workload]: ...

    def forget(self, node: str) -> None: ...

    async def refresh_credentials(self) -> bool: ...


class StatusSink(Protocol):
    async def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool: ...


EventSink = Callable[[Mapping[str, Any], st.EventText], None]


@dataclass(frozen=True)
class Cluster:
    """What the operator knows of the nodes: labels of every Node, and each node's agent (RmdNodeState)."""

    node_labels: Mapping[str, Mapping[str, str]]
    agents: Mapping[str, NodeAgent]


@dataclass
class _NodeRecord:
    generation: int  # the generation last attempted on the node
    attempted_at: float
    checked_at: float  # when the node was last known to hold it (applied, or seen by a drift check)


@dataclass
class _Memory:
    """What this process remembers of one workload (by uid) between passes."""

    body: Mapping[str, Any]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    outcomes: dict[str, st.Outcome] | None = None  # None until read from the object's status
    nodes: dict[str, _NodeRecord] = field(default_factory=dict)
    reconciled_generation: int | None = None
    spec_error: str | None = None
    attached: bool = False
    # The status this process last wrote: (the object's status it was computed from, the status after the
    # write). A pass that runs before the watch brought the object back with that write still sees the old
    # status, and without this would write the same status a second time.
    written: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None


@dataclass
class _Inventory:
    started: float  # the list reflects the agent's state at some moment after this
    workloads: Sequence[agent_pb2.Workload]


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def _holds(workloads: Sequence[agent_pb2.Workload], ref: agent_pb2.WorkloadRef) -> bool:
    return any(
        w.ref.namespace == ref.namespace and w.ref.name == ref.name and w.ref.uid == ref.uid
        for w in workloads
    )


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
        self._status = status_sink
        self._post = events
        self._clock = clock
        self._wallclock = wallclock
        self.backoff = Backoff(settings.retry_initial_seconds, settings.retry_max_seconds)
        self._memories: dict[str, _Memory] = {}
        self._inventories: dict[str, _Inventory] = {}
        self._fetches: dict[str, tuple[float, asyncio.Task[Sequence[agent_pb2.Workload]]]] = {}
        self._node_labels_seen: dict[str, dict[str, str]] = {}
        self._agents_seen: dict[str, NodeAgent] = {}
        self._swept_at: dict[str, float] = {}
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
            self._inventories.pop(node, None)
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
        for _, fetch in list(self._fetches.values()):
            fetch.cancel()
        await asyncio.gather(*self._tasks, *(f for _, f in self._fetches.values()), return_exceptions=True)

    # -- agent inventories (ListWorkloads, shared between workloads) --------------------------------------

    async def _inventory(self, node: str, endpoint: str, not_before: float) -> Sequence[agent_pb2.Workload]:
        """The node's workloads as listed by a ListWorkloads sent at or after `not_before`. Concurrent
        callers share one call. CallFailure."""
        cached = self._inventories.get(node)
        if cached is not None and cached.started >= not_before:
            return cached.workloads
        fetch = self._fetches.get(node)
        if fetch is None or fetch[0] < not_before:
            started = self._clock()
            task = asyncio.get_running_loop().create_task(self._agents.list_workloads(node, endpoint))
            fetch = self._fetches[node] = (started, task)

            def done(
                t: asyncio.Task[Sequence[agent_pb2.Workload]], node: str = node, started: float = started
            ) -> None:
                if self._fetches.get(node, (0.0, None))[1] is t:
                    del self._fetches[node]
                if not t.cancelled() and t.exception() is None:
                    newest = self._inventories.get(node)
                    if newest is None or newest.started <= started:
                        self._inventories[node] = _Inventory(started, t.result())

            task.add_done_callback(done)
        return await asyncio.shield(fetch[1])

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

    def _due(self, node: str, mem: _Memory, generation: int, now: float) -> str | None:
        """What is due on a target node: "apply", "spec", "retry", "check" (drift), or nothing."""
        record = mem.nodes.get(node)
        prev = (mem.outcomes or {}).get(node)
        if record is None or prev is None:
            return "apply"
        if record.generation != generation:
            return "spec"
        drift = self._settings.drift_interval_seconds
        if prev.status == st.SUCCESSFUL:
            if now - record.checked_at >= drift and self.backoff.due(node, now):
                return "check"
            return None
        if prev.status == st.FAILED:
            return "retry" if prev.retry and now - record.attempted_at >= drift else None
        return "retry" if self.backoff.due(node, now) else None

    def _next_due(self, node: str, mem: _Memory, now: float) -> float:
        record = mem.nodes.get(node)
        prev = (mem.outcomes or {}).get(node)
        drift = self._settings.drift_interval_seconds
        backoff_at = self.backoff.next_attempt(node) or now
        if record is None or prev is None:
            return now
        if prev.status == st.SUCCESSFUL:
            return max(record.checked_at + drift, backoff_at)
        if prev.status == st.FAILED:
            return record.attempted_at + drift if prev.retry else now + drift
        return backoff_at

    async def _reconcile(self, body: Mapping[str, Any], mem: _Memory, cluster: Cluster) -> float:
        namespace, name, uid, generation = _meta(body)
        await self._agents.refresh_credentials()
        previous = dict(self._load_outcomes(body, mem))
        try:
            spec = workload_spec(body.get("spec") or {})
        except SpecError as exc:
            if mem.spec_error != str(exc):
                self._event(body, st.EventText("Warning", "InvalidSpec", str(exc)))
            mem.spec_error = str(exc)
            await self._write(body, previous, generation, spec_error=str(exc))
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
            why = self._due(node, mem, generation, now)
            if why is None:
                outcomes[node] = previous[node]
            else:
                jobs[node] = self._apply_on(
                    body=body,
                    mem=mem,
                    node=node,
                    endpoint=endpoint,
                    ref=ref,
                    spec=spec,
                    generation=generation,
                    why=why,
                )
        leaving = sorted((previous.keys() | mem.nodes.keys()) - plan.candidates)
        for node in leaving:
            jobs[node] = self._remove_from(
                body=body, mem=mem, node=node, ref=ref, cluster=cluster, prev=previous.get(node)
            )
        results = await asyncio.gather(*jobs.values())
        for node, result in zip(jobs, results, strict=True):
            if result is not None:
                outcomes[node] = result

        for node in sorted(plan.blocked):
            event = st.transition_event(node, previous.get(node), outcomes[node])
            if event is not None:
                self._event(body, event)
        mem.outcomes = outcomes
        written = await self._write(body, outcomes, generation)
        mem.reconciled_generation = generation

        now = self._clock()
        due = [self._next_due(node, mem, now) for node in plan.targets]
        due += [
            self.backoff.next_attempt(node) or now + self._settings.retry_initial_seconds
            for node in leaving
            if node in outcomes
        ]
        delay = min([self._settings.drift_interval_seconds, *(d - now for d in due)])
        if not written:
            delay = min(delay, _STATUS_RETRY_SECONDS)
        return max(_MIN_DELAY, delay)

    async def _apply_on(
        self,
        *,
        body: Mapping[str, Any],
        mem: _Memory,
        node: str,
        endpoint: str,
        ref: agent_pb2.WorkloadRef,
        spec: agent_pb2.WorkloadSpec,
        generation: int,
        why: str,
    ) -> st.Outcome:
        prev = (mem.outcomes or {}).get(node)
        record = mem.nodes.get(node)
        if why == "check" and prev is not None and record is not None:
            try:
                listed = await self._inventory(
                    node, endpoint, not_before=max(record.checked_at, self._clock() - self._check_freshness())
                )
            except CallFailure as exc:
                # Probably still enforced (resctrl does not need the agent): say so, check again later.
                self.backoff.failed(node, self._clock())
                log.warning(
                    "drift check of %s/%s on node %s failed: %s",
                    ref.namespace,
                    ref.name,
                    node,
                    exc,
                    extra={"node": node, "workload": f"{ref.namespace}/{ref.name}", "error": str(exc)},
                )
                return dataclasses.replace(prev, unconfirmed=str(exc))
            if _holds(listed, ref):
                record.checked_at = self._clock()
                return dataclasses.replace(prev, unconfirmed="")
            log.info(
                "drift: node %s no longer has %s/%s; re-applying",
                node,
                ref.namespace,
                ref.name,
                extra={"node": node, "workload": f"{ref.namespace}/{ref.name}"},
            )
        started = self._clock()
        try:
            workload, changed = await self._agents.apply(node, endpoint, ref, spec)
        except CallFailure as exc:
            outcome = st.call_failed(exc.code, exc.message)
            if outcome.status == st.PENDING:
                self.backoff.failed(node, self._clock())
            mem.nodes[node] = _NodeRecord(generation, started, record.checked_at if record else 0.0)
            event = st.transition_event(node, prev, outcome)
        else:
            self.backoff.succeeded(node)
            outcome = st.applied(workload)
            mem.nodes[node] = _NodeRecord(generation, started, self._clock())
            if why == "check":
                event = st.drift_event(node, workload)
            elif why == "spec" and changed and prev is not None and prev.status == st.SUCCESSFUL:
                event = st.updated_event(node, generation, workload)
            else:
                event = st.transition_event(node, prev, outcome)
        if event is not None:
            self._event(body, event)
        return outcome

    def _check_freshness(self) -> float:
        """How old a shared ListWorkloads answer may be for a drift check."""
        return min(self._settings.drift_interval_seconds / 4, 10.0)

    def _reachable(self, node: str, cluster: Cluster) -> NodeAgent | None:
        """The node's agent if there is one to call; None when the node or its agent is gone (then there is
        nobody to remove anything from, and nothing to wait for)."""
        agent = cluster.agents.get(node)
        if node not in cluster.node_labels or agent is None or not agent.endpoint:
            return None
        return agent

    async def _remove_from(
        self,
        *,
        body: Mapping[str, Any],
        mem: _Memory,
        node: str,
        ref: agent_pb2.WorkloadRef,
        cluster: Cluster,
        prev: st.Outcome | None,
    ) -> st.Outcome | None:
        """Remove the workload from a node that is no longer a candidate; None once it is gone from there."""
        workload = f"{ref.namespace}/{ref.name}"
        agent = self._reachable(node, cluster)
        if agent is None:
            log.info(
                "node %s or its agent is gone; dropping its entry of %s",
                node,
                workload,
                extra={"node": node, "workload": workload},
            )
            mem.nodes.pop(node, None)
            return None
        if prev is not None and prev.reason == "RemovalPending" and not self.backoff.due(node, self._clock()):
            return prev
        try:
            found = await self._agents.remove(node, agent.endpoint, ref)
        except CallFailure as exc:
            if st.call_failed(exc.code, exc.message).status == st.PENDING:
                self.backoff.failed(node, self._clock())
            outcome = st.removal_pending(str(exc))
            if not outcome.same_state(prev):
                self._event(body, st.EventText("Warning", "RemoveFailed", f"node {node}: {exc}; retrying"))
            return outcome
        self.backoff.succeeded(node)
        mem.nodes.pop(node, None)
        if found:
            self._event(body, st.removed_event(node, "no longer a target"))
        log.info(
            "removed %s from node %s (found: %s)",
            workload,
            node,
            found,
            extra={"node": node, "workload": workload, "found": found},
        )
        return None

    async def _write(
        self,
        body: Mapping[str, Any],
        outcomes: Mapping[str, st.Outcome],
        generation: int,
        spec_error: str | None = None,
    ) -> bool:
        """Patch the managed status fields where they differ from the object's; False if the write failed."""
        namespace, name, uid, _ = _meta(body)
        current = body.get("status") or {}
        mem = self._memories.get(uid)
        if mem is not None and mem.written is not None:
            if mem.written[0] == current:  # the watch has not brought our last write back yet
                current = mem.written[1]
            else:
                mem.written = None  # the watch caught up (or someone else wrote): the object is the truth
        entries = {node: st.entry(o) for node, o in sorted(outcomes.items())}
        desired = st.desired_status(entries, generation, current, self._wallclock(), spec_error)
        patch = st.status_patch(current, desired)
        if patch is None:
            return True
        try:
            await self._status.patch_status(namespace, name, patch)
        except KubeError as exc:
            log.warning(
                "status write of %s/%s failed; retrying: %s",
                namespace,
                name,
                exc,
                extra={"workload": f"{namespace}/{name}", "error": str(exc)},
            )
            return False
        if mem is not None:
            mem.written = (
                copy.deepcopy(dict(body.get("status") or {})),
                {**copy.deepcopy(dict(current)), **desired},
            )
        return True

    def _event(self, body: Mapping[str, Any], event: st.EventText) -> None:
        self._post(body, event)

    # -- deletion --------------------------------------------------------------------------------------------

    async def finalize(self, body: Mapping[str, Any], cluster: Cluster) -> None:
        """Remove the workload from every node that may hold it. RetryLater if some node could not be reached
        (the caller keeps the finalizer and calls again)."""
        mem = self._memory(body)
        async with mem.lock:
            await self._finalize(body, mem, cluster)
            self._memories.pop(_meta(body)[2], None)

    async def _finalize(self, body: Mapping[str, Any], mem: _Memory, cluster: Cluster) -> None:
        namespace, name, uid, generation = _meta(body)
        ref = workload_ref(namespace, name, uid)
        known = set(self._load_outcomes(body, mem)) | set(mem.nodes)
        # Agents may hold it without the status saying so (a status write lost in a crash): ask every agent
        # the status does not name. An agent that cannot be asked is skipped: the orphan sweep covers it.
        others = sorted(n for n in cluster.agents if n not in known and self._reachable(n, cluster))
        listed = await asyncio.gather(*(self._lists_ref(n, cluster, ref) for n in others))
        nodes = sorted(known | {n for n, holds in zip(others, listed, strict=True) if holds})

        async def remove(node: str) -> tuple[str, bool, str]:
            agent = self._reachable(node, cluster)
            if agent is None:
                return node, False, ""
            try:
                found = await self._agents.remove(node, agent.endpoint, ref)
            except CallFailure as exc:
                self.backoff.failed(node, self._clock())
                return node, False, str(exc)
            self.backoff.succeeded(node)
            return node, found, ""

        results = await asyncio.gather(*(remove(n) for n in nodes))
        failed = {node: error for node, _, error in results if error}
        removed = [node for node, found, _ in results if found]
        if removed:
            self._event(body, st.EventText("Normal", "Removed", f"removed from node(s) {', '.join(removed)}"))
        for node, _, error in results:
            if not error:
                mem.nodes.pop(node, None)
        if failed:
            outcomes = {node: st.removal_pending(error) for node, error in failed.items()}
            previous = mem.outcomes or {}
            for node, outcome in outcomes.items():
                if not outcome.same_state(previous.get(node)):
                    self._event(
                        body,
                        st.EventText("Warning", "RemoveFailed", f"node {node}: {failed[node]}; retrying"),
                    )
            mem.outcomes = outcomes
            await self._write(body, outcomes, generation)
            delay = min((self.backoff.next_attempt(n) or 0.0) for n in failed) - self._clock()
            raise RetryLater(
                f"could not remove the workload from {', '.join(sorted(failed))} yet",
                delay=max(self._settings.retry_initial_seconds, delay),
            )

    async def _lists_ref(self, node: str, cluster: Cluster, ref: agent_pb2.WorkloadRef) -> bool:
        agent = self._reachable(node, cluster)
        if agent is None:
            return False
        try:
            return _holds(await self._inventory(node, agent.endpoint, not_before=self._clock()), ref)
        except CallFailure as exc:
            log.info(
                "could not ask the agent of node %s whether it holds %s/%s: %s",
                node,
                ref.namespace,
                ref.name,
                exc,
                extra={"node": node, "error": str(exc)},
            )
            return False

    # -- orphans ---------------------------------------------------------------------------------------------

    def sweep_due(self, node: str) -> bool:
        last = self._swept_at.get(node)
        return last is None or self._clock() - last >= self._settings.drift_interval_seconds

    async def sweep_orphans(
        self,
        node: str,
        endpoint: str,
        existing_uid: Callable[[str, str], str | None],
        in_scope: Callable[[str], bool],
    ) -> list[str]:
        """Remove from the node every workload whose RmdWorkload (same namespace, name and uid) no longer
        exists, among the namespaces this operator handles; returns their namespace/name."""
        self._swept_at[node] = self._clock()
        try:
            listed = await self._inventory(node, endpoint, not_before=self._clock())
        except CallFailure as exc:
            log.info(
                "orphan sweep of node %s skipped: %s", node, exc, extra={"node": node, "error": str(exc)}
            )
            return []
        removed = []
        for w in _orphans(listed, existing_uid, in_scope):
            try:
                await self._agents.remove(node, endpoint, w.ref)
            except CallFailure as exc:
                log.warning(
                    "could not remove orphaned workload %s/%s from node %s: %s",
                    w.ref.namespace,
                    w.ref.name,
                    node,
                    exc,
                    extra={"node": node, "workload": f"{w.ref.namespace}/{w.ref.name}", "error": str(exc)},
                )
                continue
            removed.append(f"{w.ref.namespace}/{w.ref.name}")
            log.info(
                "removed orphaned workload %s/%s (uid %s, no such RmdWorkload) from node %s",
                w.ref.namespace,
                w.ref.name,
                w.ref.uid,
                node,
                extra={"node": node, "workload": f"{w.ref.namespace}/{w.ref.name}", "uid": w.ref.uid},
            )
        return removed


def _orphans(
    listed: Sequence[agent_pb2.Workload],
    existing_uid: Callable[[str, str], str | None],
    in_scope: Callable[[str], bool],
) -> Iterator[agent_pb2.Workload]:
    for w in listed:
        ref = w.ref
        if not ref.uid or not in_scope(ref.namespace):
            continue  # not ours to judge: applied without an object identity, or another operator's namespace
        if existing_uid(ref.namespace, ref.name) != ref.uid:
            yield w
