"""The agent's heartbeat: a coordination.k8s.io/v1 Lease renewed every heartbeat_seconds, as kubelets renew
their node leases (docs/node-state.md "Heartbeat").

A process killed with -9 writes nothing, so its RmdNodeState would say Ready=True forever. The operator
watches these Leases and, when one is not renewed for its leaseDurationSeconds, marks the node's RmdNodeState
Ready=False (HeartbeatExpired). The holderIdentity is new at every start of the agent (leaseTransitions
counts the starts), which tells the operator that an agent restarted and should be swept for orphans.

When renewals fail (the API server is unreachable, a partition) and then succeed again, `on_recovered` runs:
the RmdNodeState writer re-reads its object then, since the operator may have marked it not ready meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from rmd_agent.errors import ConfigError, KubeApiError
from rmd_agent.kube import KubeObjectClient
from rmd_agent.kube_object_writer import ObjectRef
from rmd_agent.settings import AgentSettings
from rmd_api.node_state import LEASE_LABEL, LEASE_LABEL_VALUE, lease_duration_seconds, lease_name

log = logging.getLogger(__name__)

Obj = dict[str, Any]
LEASES = ("coordination.k8s.io", "v1", "leases", "Lease")
FIELD_MANAGER = "rmd-agent"


def _utcnow() -> datetime:
    return datetime.now(UTC)


def micro_time(now: datetime) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds, in UTC."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_identity() -> str:
    """This start of the agent: its pod (or host) and a random suffix, so a restart is a new holder."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{secrets.token_hex(4)}"


def renewed_lease(
    current: Obj | None, *, node: str, namespace: str, identity: str, duration: int, now: str
) -> Obj:
    """The Lease to write: `current` renewed by `identity`, taken over (a new acquireTime, one more
    transition) when another start of the agent held it, or a new one when there is none."""
    if current is None:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": lease_name(node),
                "namespace": namespace,
                "labels": {LEASE_LABEL: LEASE_LABEL_VALUE},
            },
            "spec": {
                "holderIdentity": identity,
                "leaseDurationSeconds": duration,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
    lease = {**current, "spec": dict(current.get("spec") or {})}
    spec = lease["spec"]
    if spec.get("holderIdentity") != identity:
        spec["holderIdentity"] = identity
        spec["acquireTime"] = now
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
    spec["leaseDurationSeconds"] = duration
    spec["renewTime"] = now
    return lease


class Heartbeat:
    """Renews this node's agent Lease until stop(). `api_client_factory` makes the API client."""

    def __init__(
        self,
        settings: AgentSettings,
        api_client_factory: Callable[[], Any],
        *,
        on_recovered: Callable[[], None] = lambda: None,
        identity: str | None = None,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        if settings.heartbeat_seconds <= 0:
            raise ConfigError("setting heartbeat_seconds must be positive to run the heartbeat")
        self.node = settings.node_name
        self.namespace = settings.node_state_namespace
        self.name = lease_name(self.node)
        self.period = settings.heartbeat_seconds
        self.duration = lease_duration_seconds(self.period)
        self.identity = identity or new_identity()
        self._factory = api_client_factory
        self._on_recovered = on_recovered
        self._clock = clock
        self._wake = asyncio.Event()
        self._stopping = False
        self.renewals = 0  # successful writes, for tests and logs
        self.failures = 0  # failed renewals in a row

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        api_client = await asyncio.to_thread(self._factory)
        # As plain JSON, like the agent's other objects: a typed client that parsed the times into datetimes
        # wrote them back without their microseconds when those were 0, which the API server refuses
        # (MicroTime).
        lease = KubeObjectClient(api_client, ObjectRef(*LEASES, self.name, self.namespace), FIELD_MANAGER)
        current: Obj | None = None
        try:
            while not self._stopping:
                try:
                    current = await self._renew(lease, current)
                except Exception as exc:
                    current = None  # read it again next time
                    self.failures += 1
                    if self.failures == 1 or self.failures % 10 == 0:
                        what = (
                            f"{exc.status} {exc.reason}"
                            if isinstance(exc, KubeApiError) and exc.status
                            else str(exc)
                        )
                        log.warning(
                            "heartbeat Lease %s/%s not renewed (%d in a row): %s",
                            self.namespace,
                            self.name,
                            self.failures,
                            what,
                            extra={"failures": self.failures, "error": what},
                        )
                else:
                    if self.failures:
                        log.info("heartbeat Lease %s renewed after %d failures", self.name, self.failures)
                        self.failures = 0
                        self._on_recovered()
                    self.renewals += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.period)
        finally:
            await asyncio.to_thread(api_client.close)

    async def _renew(self, lease: KubeObjectClient, current: Obj | None) -> Obj:
        """One renewal; after a conflict (someone else wrote the Lease, or deleted it) it reads and tries
        once more."""
        if current is None:
            current = await lease.get()
        try:
            return await self._write(lease, current)
        except KubeApiError as exc:
            if exc.status not in (404, 409):
                raise
        return await self._write(lease, await lease.get())

    async def _write(self, lease: KubeObjectClient, current: Obj | None) -> Obj:
        body = renewed_lease(
            current,
            node=self.node,
            namespace=self.namespace,
            identity=self.identity,
            duration=self.duration,
            now=micro_time(self._clock()),
        )
        return await (lease.create(body) if current is None else lease.replace(body))
