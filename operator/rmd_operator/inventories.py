"""What each node's agent holds, as one shared ListWorkloads answer per node.

Drift checks of many workloads on one node, deletions and the orphan sweep all ask the same question; a
caller says how fresh the answer must be (`not_before`), and concurrent callers share one call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from rmd_api.agent.v1 import agent_pb2


class WorkloadLister(Protocol):
    async def list_workloads(self, node: str, endpoint: str) -> Sequence[agent_pb2.Workload]: ...


@dataclass
class _Inventory:
    started: float  # the list reflects the agent's state at some moment after this
    workloads: Sequence[agent_pb2.Workload]


class AgentInventories:
    def __init__(self, agents: WorkloadLister, clock: Callable[[], float] = time.monotonic) -> None:
        self._agents = agents
        self._clock = clock
        self._inventories: dict[str, _Inventory] = {}
        self._fetches: dict[str, tuple[float, asyncio.Task[Sequence[agent_pb2.Workload]]]] = {}

    async def list(self, node: str, endpoint: str, not_before: float) -> Sequence[agent_pb2.Workload]:
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

    def forget(self, node: str) -> None:
        """The node's agent changed (new endpoint, or gone): what it listed before says nothing now."""
        self._inventories.pop(node, None)

    async def close(self) -> None:
        fetches = [task for _, task in self._fetches.values()]
        for task in fetches:
            task.cancel()
        await asyncio.gather(*fetches, return_exceptions=True)
