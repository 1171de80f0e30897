"""The agents' heartbeats: each agent renews a Lease (rmd_agent.heartbeat); when one is not renewed for its
leaseDurationSeconds, the node's RmdNodeState is marked Ready=False (HeartbeatExpired), as the node lifecycle
controller does for kubelets. Its workloads then show that the agent cannot confirm them (status.py), and new
ones wait. The agent puts Ready back when it writes its condition again.

Expiry is judged on the operator's clock from when it saw each renewal, never by comparing the agent's
renewTime with the local time, so clock skew between nodes does not matter. Before marking, the Lease is read
again: a stalled watch must not declare live agents dead.

`HeartbeatMonitor` is the bookkeeping (pure); `AgentLiveness` adds the clock loop and the API calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from rmd_api.kube_time import format_time
from rmd_api.node_state import HEARTBEAT_EXPIRED, LEASE_PREFIX, READY

log = logging.getLogger(__name__)

MAX_DURATION_SECONDS = 3600.0  # a longer lease is not a heartbeat: ignored, as a malformed one
RETRY_SECONDS = 1.0  # after a failed read or write, try the expiry again this much later

Obj = dict[str, Any]


class Seen(enum.Enum):
    NEW = "new"  # the first renewal seen of this node (operator start, new node)
    RENEWED = "renewed"
    RESTARTED = "restarted"  # another start of the agent holds the Lease now
    SAME = "same"  # nothing new (a resync, another field)


@dataclass(frozen=True)
class Renewal:
    holder: str
    renew_time: str
    duration: float


@dataclass
class Beat:
    renewal: Renewal
    seen_at: float  # operator clock
    expired: bool = False  # handled: marked not ready, or found already not ready

    @property
    def deadline(self) -> float:
        return self.seen_at + self.renewal.duration


def lease_node(lease: Mapping[str, Any]) -> str | None:
    """The node whose agent holds `lease`, None for a Lease that is not an agent's."""
    name = str((lease.get("metadata") or {}).get("name") or "")
    if not name.startswith(LEASE_PREFIX):
        return None
    return name.removeprefix(LEASE_PREFIX) or None


def read_renewal(lease: Mapping[str, Any]) -> Renewal | None:
    """The Lease's holder, renewal and duration; None when it lacks them or they make no sense."""
    spec = lease.get("spec") or {}
    holder, renew = spec.get("holderIdentity"), spec.get("renewTime")
    duration = spec.get("leaseDurationSeconds")
    if not (isinstance(holder, str) and holder and isinstance(renew, str) and renew):
        return None
    if isinstance(duration, bool) or not isinstance(duration, int | float):
        return None
    if not 0 < duration <= MAX_DURATION_SECONDS:
        return None
    return Renewal(holder, renew, float(duration))


class HeartbeatMonitor:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._beats: dict[str, Beat] = {}

    def observe(self, node: str, renewal: Renewal) -> Seen:
        before = self._beats.get(node)
        if before is not None and before.renewal == renewal:
            return Seen.SAME
        self._beats[node] = Beat(renewal, self._clock())
        if before is None:
            return Seen.NEW
        return Seen.RESTARTED if before.renewal.holder != renewal.holder else Seen.RENEWED

    def forget(self, node: str) -> None:
        self._beats.pop(node, None)

    def beat(self, node: str) -> Beat | None:
        return self._beats.get(node)

    def expired(self) -> list[str]:
        """Nodes whose renewal is overdue and not handled yet."""
        now = self._clock()
        return sorted(n for n, b in self._beats.items() if not b.expired and now >= b.deadline)

    def handled(self, node: str) -> None:
        beat = self._beats.get(node)
        if beat is not None:
            beat.expired = True

    def next_deadline(self) -> float | None:
        deadlines = [b.deadline for b in self._beats.values() if not b.expired]
        return min(deadlines) if deadlines else None


def expired_message(namespace: str, lease: str, renewal: Renewal) -> str:
    return (
        f"the agent has not renewed its heartbeat (Lease {namespace}/{lease}) for {renewal.duration:g}s, "
        f"last at {renewal.renew_time}: it is down or cut off. Its workloads may still be enforced by the "
        f"node, but nothing can confirm or change them until the agent is back"
    )


def not_ready_patch(node_state: Mapping[str, Any], message: str, now: datetime) -> Obj | None:
    """The status patch marking `node_state` Ready=False (HeartbeatExpired), conditional on the version
    read; None when its Ready is not True (the agent's own reason, e.g. AgentStopped, stands)."""
    conditions: Sequence[Mapping[str, Any]] = (node_state.get("status") or {}).get("conditions") or ()
    ready = next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == READY), None)
    if ready is None or ready.get("status") != "True":
        return None
    marked = {
        "type": READY,
        "status": "False",
        "reason": HEARTBEAT_EXPIRED,
        "message": message,
        "lastTransitionTime": format_time(now),
    }
    others = [dict(c) for c in conditions if c is not ready]
    return {
        "metadata": {"resourceVersion": (node_state.get("metadata") or {}).get("resourceVersion")},
        "status": {"conditions": [*others, marked]},
    }


class LivenessApi(Protocol):
    """The reads and the write AgentLiveness needs (kube.NodeStateApi)."""

    async def read_lease(self, name: str) -> Obj | None: ...

    async def read_node_state(self, node: str) -> Obj | None: ...

    async def patch_node_state_status(self, node: str, patch: Obj) -> bool: ...


class AgentLiveness:
    """Feeds the agents' Lease events to a HeartbeatMonitor and marks nodes whose heartbeat expired."""

    def __init__(
        self,
        api: LivenessApi,
        namespace: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.monitor = HeartbeatMonitor(clock)
        self._clock = clock
        self._wall_clock = wall_clock
        self._wake = asyncio.Event()
        self._retry_at: dict[str, float] = {}
        self.marked = 0  # RmdNodeStates marked not ready, for tests and logs

    def lease_changed(self, event_type: str | None, lease: Mapping[str, Any]) -> tuple[str, Seen] | None:
        """A watch event of an agent Lease: (node, what it says), None for other Leases and deletions."""
        node = lease_node(lease)
        if node is None or (lease.get("metadata") or {}).get("namespace") != self.namespace:
            return None
        renewal = read_renewal(lease)
        if event_type == "DELETED" or renewal is None:
            self.monitor.forget(node)
            return None
        seen = self.monitor.observe(node, renewal)
        if seen is not Seen.SAME:
            self._retry_at.pop(node, None)
            self._wake.set()
        return node, seen

    async def run(self) -> None:
        """Mark expired heartbeats until cancelled."""
        while True:
            await self.check()
            wait = self._next_wait()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    def _next_wait(self) -> float:
        times = [t for t in (self.monitor.next_deadline(), *self._retry_at.values()) if t is not None]
        return max(0.05, min(times) - self._clock()) if times else 60.0

    async def check(self) -> None:
        now = self._clock()
        for node in self.monitor.expired():
            if self._retry_at.get(node, now) > now:
                continue
            try:
                done = await self._expire(node)
            except Exception as exc:  # the API is unreachable: try again soon
                done = False
                log.warning("could not check the heartbeat of node %s: %s", node, exc, extra={"node": node})
            if done:
                self._retry_at.pop(node, None)
            else:
                self._retry_at[node] = self._clock() + RETRY_SECONDS

    async def _expire(self, node: str) -> bool:
        """Mark the node not ready if its Lease is still as last seen; False: look again soon."""
        beat = self.monitor.beat(node)
        if beat is None:
            return True
        name = LEASE_PREFIX + node
        lease = await self._api.read_lease(name)
        renewal = read_renewal(lease) if lease is not None else None
        if lease is not None and renewal is not None and renewal != beat.renewal:
            self.lease_changed("MODIFIED", lease)  # renewed after all: the watch is behind
            return True
        state = await self._api.read_node_state(node)
        message = expired_message(self.namespace, name, beat.renewal)
        patch = not_ready_patch(state, message, self._wall_clock()) if state is not None else None
        if patch is not None and not await self._api.patch_node_state_status(node, patch):
            return False  # the object changed since it was read
        self.monitor.handled(node)
        if patch is not None:
            self.marked += 1
            log.warning(
                "node %s: agent heartbeat expired (last renewal %s, lease %gs); marked Ready=False",
                node,
                beat.renewal.renew_time,
                beat.renewal.duration,
                extra={"node": node, "last_renewal": beat.renewal.renew_time},
            )
        return True
