"""gRPC clients of the node agents (rmd.agent.v1.Agent): one channel per node, mTLS, a deadline on every call.

TLS is always on unless insecure_agents is set (then a warning says so at start; there is no silent
downgrade). The operator checks two things about an agent: its certificate chains to agent_ca, and it carries
the identity of the node the RmdNodeState named (`agent_server_name`, e.g. DNS SAN "rmd-agent.worker-1"),
so an endpoint written into another node's RmdNodeState cannot pass for that node's agent. The operator in
turn presents client_cert, whose identity the agents check against their allow list.

Channels are cached per node and replaced when the endpoint changes, when the certificate files change
(Secret rotation), and after a call could not reach the agent (a fresh channel connects at once instead of
waiting out gRPC's own reconnect backoff). Retired channels finish their calls in flight before closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio

from rmd_api.agent.v1 import agent_pb2, agent_pb2_grpc
from rmd_operator.errors import ConfigError, OperatorError
from rmd_operator.settings import OperatorSettings

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_CREDENTIAL_CHECK_SECONDS = 30.0
_new_stub: Any = agent_pb2_grpc.AgentStub  # generated without annotations


class CallFailure(OperatorError):
    """An agent call that did not succeed: the gRPC status code's name and the agent's message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class _Stub(Protocol):
    """The generated AgentStub's methods, typed (grpcio-tools emits no annotations for them)."""

    def ApplyWorkload(
        self, request: agent_pb2.ApplyWorkloadRequest, *, timeout: float
    ) -> Awaitable[agent_pb2.ApplyWorkloadResponse]: ...

    def RemoveWorkload(
        self, request: agent_pb2.RemoveWorkloadRequest, *, timeout: float
    ) -> Awaitable[agent_pb2.RemoveWorkloadResponse]: ...

    def ListWorkloads(
        self, request: agent_pb2.ListWorkloadsRequest, *, timeout: float
    ) -> Awaitable[agent_pb2.ListWorkloadsResponse]: ...

    def GetContainerCpus(
        self, request: agent_pb2.GetContainerCpusRequest, *, timeout: float
    ) -> Awaitable[agent_pb2.GetContainerCpusResponse]: ...


@dataclass(frozen=True)
class TlsMaterial:
    ca: bytes
    cert: bytes
    key: bytes
    fingerprint: tuple[tuple[int, int], ...]  # (mtime_ns, size) per file: detects rotation


def _read_pem(path: Path, what: str) -> tuple[bytes, tuple[int, int]]:
    try:
        data = path.read_bytes()
        st = path.stat()
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{what} {path} holds no PEM block")
    return data, (st.st_mtime_ns, st.st_size)


def read_tls_material(settings: OperatorSettings) -> TlsMaterial:
    """The CA bundle and client key pair from their files (blocking: call in a thread)."""
    ca, f1 = _read_pem(settings.agent_ca, "agent CA bundle (agent_ca)")
    cert, f2 = _read_pem(settings.client_cert, "client certificate (client_cert)")
    key, f3 = _read_pem(settings.client_key, "client key (client_key)")
    return TlsMaterial(ca, cert, key, (f1, f2, f3))


def _fingerprint(settings: OperatorSettings) -> tuple[tuple[int, int], ...] | None:
    try:
        stats = [p.stat() for p in (settings.agent_ca, settings.client_cert, settings.client_key)]
    except OSError:
        return None
    return tuple((st.st_mtime_ns, st.st_size) for st in stats)


@dataclass
class _Channel:
    endpoint: str
    generation: int  # of the credentials it was made with
    channel: grpc.aio.Channel
    stub: _Stub
    limit: asyncio.Semaphore


class AgentClients:
    """Calls to the agents. Create it with `await AgentClients.create(settings)` in the operator's loop (gRPC
    aio channels belong to the loop that made them) and `await close()` it at exit."""

    def __init__(self, settings: OperatorSettings, tls: TlsMaterial | None) -> None:
        if tls is None and not settings.insecure_agents:
            raise ConfigError("TLS material is required unless insecure_agents is set")
        self._settings = settings
        self._tls = tls
        self._credentials = self._make_credentials(tls)
        self._generation = 0
        self._channels: dict[str, _Channel] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._checked_at = time.monotonic()

    @classmethod
    async def create(cls, settings: OperatorSettings) -> AgentClients:
        if settings.insecure_agents:
            log.warning(
                "insecure_agents is set: calling agents in PLAINTEXT, without verifying who they are and "
                "without proving who the operator is; anyone on the network path can read and forge the "
                "calls. Never use this outside development."
            )
            return cls(settings, None)
        return cls(settings, await asyncio.to_thread(read_tls_material, settings))

    @staticmethod
    def _make_credentials(tls: TlsMaterial | None) -> grpc.ChannelCredentials | None:
        if tls is None:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
        )

    # -- channels

    @property
    def channel_count(self) -> int:
        return len(self._channels)

    def _open(self, node: str, endpoint: str) -> _Channel:
        s = self._settings
        options: list[tuple[str, Any]] = [
            # A lost agent is retried by the operator's own backoff; keep gRPC's reconnects in the same range.
            ("grpc.initial_reconnect_backoff_ms", int(s.retry_initial_seconds * 1000)),
            ("grpc.max_reconnect_backoff_ms", int(s.retry_max_seconds * 1000)),
        ]
        if self._credentials is None:
            channel = grpc.aio.insecure_channel(endpoint, options=options)
        else:
            # The endpoint is an address; the name checked against the agent's certificate is the node's
            # agent identity, so the agent must prove it serves this node.
            options.append(("grpc.ssl_target_name_override", s.server_name(node)))
            channel = grpc.aio.secure_channel(endpoint, self._credentials, options=options)
        stub: _Stub = _new_stub(channel)
        log.debug(
            "channel to the agent of node %s opened (%s, %s)",
            node,
            endpoint,
            "plaintext" if self._credentials is None else f"TLS, expecting {s.server_name(node)}",
            extra={"node": node, "endpoint": endpoint, "tls": self._credentials is not None},
        )
        return _Channel(endpoint, self._generation, channel, stub, asyncio.Semaphore(s.agent_max_calls))

    def _channel(self, node: str, endpoint: str) -> _Channel:
        current = self._channels.get(node)
        if current is not None and (current.endpoint != endpoint or current.generation != self._generation):
            self._retire(node, current)
            current = None
        if current is None:
            current = self._channels[node] = self._open(node, endpoint)
        return current

    def _retire(self, node: str, entry: _Channel) -> None:
        if self._channels.get(node) is entry:
            del self._channels[node]
        # Calls in flight on it get their deadline to finish; then it closes.
        task = asyncio.get_running_loop().create_task(
            entry.channel.close(grace=self._settings.agent_call_timeout_seconds)
        )
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def forget(self, node: str) -> None:
        """Drop the node's channel (its agent moved or went away)."""
        entry = self._channels.get(node)
        if entry is not None:
            self._retire(node, entry)

    async def refresh_credentials(self) -> bool:
        """Re-read the certificate files if they changed (checked at most every 30 s); True if reloaded.
        Channels switch to the new credentials on their next call."""
        if self._tls is None or time.monotonic() - self._checked_at < _CREDENTIAL_CHECK_SECONDS:
            return False
        self._checked_at = time.monotonic()
        fingerprint = await asyncio.to_thread(_fingerprint, self._settings)
        if fingerprint is None or fingerprint == self._tls.fingerprint:
            return False
        try:
            tls = await asyncio.to_thread(read_tls_material, self._settings)
        except ConfigError as exc:
            log.warning("certificate files changed but cannot be read; keeping the old ones: %s", exc)
            return False
        self._tls = tls
        self._credentials = self._make_credentials(tls)
        self._generation += 1
        log.info("certificate files changed: new agent connections use them")
        return True

    async def close(self) -> None:
        for node, entry in list(self._channels.items()):
            self._retire(node, entry)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

    # -- calls

    async def _call(self, node: str, endpoint: str, call: Callable[[_Stub], Awaitable[_T]]) -> _T:
        entry = self._channel(node, endpoint)
        async with entry.limit:
            try:
                return await call(entry.stub)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.UNAVAILABLE:
                    self._retire(node, entry)  # reconnect afresh on the next attempt
                raise CallFailure(code.name, exc.details() or "") from None
            except grpc.aio.UsageError as exc:  # the channel was closed under the call (retired)
                raise CallFailure("UNAVAILABLE", f"channel closed: {exc}") from None

    async def apply(
        self, node: str, endpoint: str, ref: agent_pb2.WorkloadRef, spec: agent_pb2.WorkloadSpec
    ) -> tuple[agent_pb2.Workload, bool]:
        """ApplyWorkload; (the workload as the agent holds it, whether anything changed). CallFailure."""
        request = agent_pb2.ApplyWorkloadRequest(ref=ref, spec=spec)
        timeout = self._settings.agent_call_timeout_seconds
        response = await self._call(node, endpoint, lambda stub: stub.ApplyWorkload(request, timeout=timeout))
        return response.workload, response.changed

    async def remove(self, node: str, endpoint: str, ref: agent_pb2.WorkloadRef) -> bool:
        """RemoveWorkload; whether the agent had it. CallFailure."""
        request = agent_pb2.RemoveWorkloadRequest(ref=ref)
        timeout = self._settings.agent_call_timeout_seconds
        response = await self._call(
            node, endpoint, lambda stub: stub.RemoveWorkload(request, timeout=timeout)
        )
        return response.found

    async def list_workloads(self, node: str, endpoint: str) -> Sequence[agent_pb2.Workload]:
        """ListWorkloads. CallFailure."""
        request = agent_pb2.ListWorkloadsRequest()
        timeout = self._settings.agent_call_timeout_seconds
        response = await self._call(node, endpoint, lambda stub: stub.ListWorkloads(request, timeout=timeout))
        return list(response.workloads)

    async def container_cpus(
        self, node: str, endpoint: str, *, namespace: str, pod: str, uid: str, container: str
    ) -> agent_pb2.GetContainerCpusResponse:
        """GetContainerCpus: the exclusive CPUs the node's kubelet gave the container. CallFailure."""
        request = agent_pb2.GetContainerCpusRequest(
            pod_namespace=namespace, pod_name=pod, pod_uid=uid, container=container
        )
        timeout = self._settings.agent_call_timeout_seconds
        return await self._call(node, endpoint, lambda stub: stub.GetContainerCpus(request, timeout=timeout))


async def close_quietly(clients: AgentClients | None) -> None:
    if clients is not None:
        with contextlib.suppress(Exception):
            await clients.close()
