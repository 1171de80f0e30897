"""One workload on one node: apply it, check it for drift, or remove it, through the node's agent.

Each step calls the agent, keeps the node's backoff, records when the node was last attempted and known to
hold the workload (`NodeRecord`), posts an Event for each change of the node's state, and returns the node's
new outcome for the status (status.py). reconcile.py decides which step is due on which node.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rmd_api.agent.v1 import agent_pb2
from rmd_operator import status as st
from rmd_operator.agent_client import CallFailure
from rmd_operator.backoff import Backoff
from rmd_operator.inventories import AgentInventories
from rmd_operator.settings import OperatorSettings
from rmd_operator.targets import Cluster, reachable_agent

log = logging.getLogger(__name__)

EventSink = Callable[[Mapping[str, Any], st.EventText], None]


class Agents(Protocol):
    """What the reconciler needs of the agent clients (agent_client.AgentClients)."""

    async def apply(
        self, node: str, endpoint: str, ref: agent_pb2.WorkloadRef, spec: agent_pb2.WorkloadSpec
    ) -> tuple[agent_pb2.Workload, bool]: ...

    async def remove(self, node: str, endpoint: str, ref: agent_pb2.WorkloadRef) -> bool: ...

    async def list_workloads(self, node: str, endpoint: str) -> Sequence[agent_pb2.Workload]: ...

    def forget(self, node: str) -> None: ...

    async def refresh_credentials(self) -> bool: ...


@dataclass
class NodeRecord:
    generation: int  # the generation last attempted on the node
    attempted_at: float
    checked_at: float  # when the node was last known to hold it (applied, or seen by a drift check)


def holds(workloads: Sequence[agent_pb2.Workload], ref: agent_pb2.WorkloadRef) -> bool:
    return any(
        w.ref.namespace == ref.namespace and w.ref.name == ref.name and w.ref.uid == ref.uid
        for w in workloads
    )


class NodeSteps:
    def __init__(
        self,
        settings: OperatorSettings,
        *,
        agents: Agents,
        inventories: AgentInventories,
        backoff: Backoff,
        events: EventSink,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._agents = agents
        self._inventories = inventories
        self.backoff = backoff
        self._event = events
        self._clock = clock

    def due(
        self, record: NodeRecord | None, prev: st.Outcome | None, node: str, generation: int, now: float
    ) -> str | None:
        """What is due on a target node: "apply", "spec", "retry", "check" (drift), or nothing."""
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

    def next_due(self, record: NodeRecord | None, prev: st.Outcome | None, node: str, now: float) -> float:
        """When the next step on a target node is due."""
        drift = self._settings.drift_interval_seconds
        backoff_at = self.backoff.next_attempt(node) or now
        if record is None or prev is None:
            return now
        if prev.status == st.SUCCESSFUL:
            return max(record.checked_at + drift, backoff_at)
        if prev.status == st.FAILED:
            return record.attempted_at + drift if prev.retry else now + drift
        return backoff_at

    async def apply(
        self,
        *,
        body: Mapping[str, Any],
        nodes: dict[str, NodeRecord],
        prev: st.Outcome | None,
        node: str,
        endpoint: str,
        ref: agent_pb2.WorkloadRef,
        spec: agent_pb2.WorkloadSpec,
        generation: int,
        why: str,
    ) -> st.Outcome:
        record = nodes.get(node)
        if why == "check" and prev is not None and record is not None:
            try:
                listed = await self._inventories.list(
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
            if holds(listed, ref):
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
        rounded: st.EventText | None = None
        try:
            workload, changed = await self._agents.apply(node, endpoint, ref, spec)
        except CallFailure as exc:
            outcome = st.call_failed(exc.code, exc.message)
            if outcome.status == st.PENDING:
                self.backoff.failed(node, self._clock())
            nodes[node] = NodeRecord(generation, started, record.checked_at if record else 0.0)
            event = st.transition_event(node, prev, outcome)
        else:
            self.backoff.succeeded(node)
            outcome = st.applied(workload)
            nodes[node] = NodeRecord(generation, started, self._clock())
            if why == "check":
                event = st.drift_event(node, workload)
            elif why == "spec" and changed and prev is not None and prev.status == st.SUCCESSFUL:
                event = st.updated_event(node, generation, workload)
            else:
                event = st.transition_event(node, prev, outcome)
            rounded = st.mba_rounded_event(node, workload)
        if event is not None:
            self._event(body, event)
        if rounded is not None:
            self._event(body, rounded)
        return outcome

    def _check_freshness(self) -> float:
        """How old a shared ListWorkloads answer may be for a drift check."""
        return min(self._settings.drift_interval_seconds / 4, 10.0)

    async def remove(
        self,
        *,
        body: Mapping[str, Any],
        nodes: dict[str, NodeRecord],
        node: str,
        ref: agent_pb2.WorkloadRef,
        cluster: Cluster,
        prev: st.Outcome | None,
    ) -> st.Outcome | None:
        """Remove the workload from a node that is no longer a candidate; None once it is gone from there
        (then its record goes from `nodes`)."""
        workload = f"{ref.namespace}/{ref.name}"
        agent = reachable_agent(node, cluster)
        if agent is None:
            log.info(
                "node %s or its agent is gone; dropping its entry of %s",
                node,
                workload,
                extra={"node": node, "workload": workload},
            )
            nodes.pop(node, None)
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
        nodes.pop(node, None)
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

    async def remove_everywhere(
        self,
        *,
        body: Mapping[str, Any],
        nodes: dict[str, NodeRecord],
        known: set[str],
        cluster: Cluster,
        ref: agent_pb2.WorkloadRef,
    ) -> dict[str, str]:
        """Remove a deleted workload from the `known` nodes and from every other node whose agent lists it;
        returns the nodes it could not be removed from yet, with the error."""
        # Agents may hold it without the status saying so (a status write lost in a crash): ask every agent
        # the status does not name. An agent that cannot be asked is skipped: the orphan sweep covers it.
        others = sorted(n for n in cluster.agents if n not in known and reachable_agent(n, cluster))
        listed = await asyncio.gather(*(self._lists_ref(n, cluster, ref) for n in others))
        targets = sorted(known | {n for n, held in zip(others, listed, strict=True) if held})

        async def remove(node: str) -> tuple[str, bool, str]:
            agent = reachable_agent(node, cluster)
            if agent is None:
                return node, False, ""
            try:
                found = await self._agents.remove(node, agent.endpoint, ref)
            except CallFailure as exc:
                self.backoff.failed(node, self._clock())
                return node, False, str(exc)
            self.backoff.succeeded(node)
            return node, found, ""

        results = await asyncio.gather(*(remove(n) for n in targets))
        removed = [node for node, found, _ in results if found]
        if removed:
            self._event(body, st.EventText("Normal", "Removed", f"removed from node(s) {', '.join(removed)}"))
        for node, _, error in results:
            if not error:
                nodes.pop(node, None)
        return {node: error for node, _, error in results if error}

    async def _lists_ref(self, node: str, cluster: Cluster, ref: agent_pb2.WorkloadRef) -> bool:
        agent = reachable_agent(node, cluster)
        if agent is None:
            return False
        try:
            return holds(await self._inventories.list(node, agent.endpoint, not_before=self._clock()), ref)
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
