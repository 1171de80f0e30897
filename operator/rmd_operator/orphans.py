"""Removing what an agent holds for RmdWorkloads that no longer exist.

Deleting a workload normally goes through its finalizer (reconcile.py `finalize`). When someone takes the
finalizer off by hand, or the object goes while its node's agent is away, the agent keeps the workload; a
sweep compares what an agent lists with the RmdWorkloads that exist (same namespace, name and uid) and removes
the rest. A node is due for a sweep once per interval (the handlers ask on every RmdNodeState change and every
heartbeat renewal, so at least that often while the agent is alive), and at once after its agent restarted:
a workload deleted while the agent was down would otherwise hold its CPUs and cache until the next interval.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from rmd_api.agent.v1 import agent_pb2
from rmd_operator.agent_client import CallFailure
from rmd_operator.inventories import AgentInventories

log = logging.getLogger(__name__)


class WorkloadRemover(Protocol):
    async def remove(self, node: str, endpoint: str, ref: agent_pb2.WorkloadRef) -> bool: ...


class OrphanSweeper:
    def __init__(
        self,
        agents: WorkloadRemover,
        inventories: AgentInventories,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._agents = agents
        self._inventories = inventories
        self._interval = interval
        self._clock = clock
        self._swept_at: dict[str, float] = {}
        self._restarted: set[str] = set()  # nodes whose agent restarted since their last sweep

    def restarted(self, node: str) -> None:
        """The node's agent started again: sweep it as soon as it answers."""
        self._restarted.add(node)

    def due(self, node: str) -> bool:
        last = self._swept_at.get(node)
        return node in self._restarted or last is None or self._clock() - last >= self._interval

    async def sweep(
        self,
        node: str,
        endpoint: str,
        existing_uid: Callable[[str, str], str | None],
        in_scope: Callable[[str], bool],
    ) -> list[str]:
        """Remove from the node every workload whose RmdWorkload (same namespace, name and uid) no longer
        exists, among the namespaces this operator handles; returns their namespace/name."""
        self._swept_at[node] = self._clock()
        restarted = node in self._restarted
        self._restarted.discard(node)
        try:
            listed = await self._inventories.list(node, endpoint, not_before=self._clock())
        except CallFailure as exc:
            if restarted:
                self._restarted.add(node)  # still owed: the next chance takes it
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
