"""The rmd.agent.v1.Agent gRPC service over an Engine, and the guard every call passes through.

The service only converts and delegates: it raises the engine's errors as they come. The guard does what
every method needs, in one place: it refuses callers whose certificate identity is not allowed, turns errors
into status codes (`status_for`), counts and times each call, and, once the server stops, refuses new calls
while it waits for those in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from rmd_agent.engine_api import Engine, EngineUnavailable
from rmd_agent.errors import AgentError, KubeletUnavailable
from rmd_agent.plan.workload import RejectReason, WorkloadRejected
from rmd_agent.rpc import Service, request_of, unary_unary
from rmd_agent.server import convert
from rmd_agent.server.metrics import GrpcMetrics
from rmd_agent.server.tls import NO_DNS_NAME, client_dns_names, is_allowed
from rmd_api.agent.v1 import agent_pb2

log = logging.getLogger(__name__)

_REJECT_CODES = {
    RejectReason.INVALID: Status.INVALID_ARGUMENT,
    RejectReason.CAPACITY: Status.RESOURCE_EXHAUSTED,
    RejectReason.CONFLICT: Status.FAILED_PRECONDITION,
}

_PATH = "/" + agent_pb2.DESCRIPTOR.services_by_name["Agent"].full_name


class CallRefused(Exception):
    """The caller may not call this agent (raised by the identity check, answered with its code)."""

    def __init__(self, code: Status, message: str) -> None:
        super().__init__(message)
        self.code = code


def status_for(exc: Exception) -> tuple[Status, str]:
    """The status code and message answering an exception. Unexpected ones are INTERNAL, with only the
    exception's type in the message (the traceback goes to the log, not to the caller)."""
    if isinstance(exc, WorkloadRejected):
        return _REJECT_CODES[exc.reason], exc.message
    if isinstance(exc, convert.InvalidRequest):
        return Status.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, EngineUnavailable | KubeletUnavailable):
        return Status.UNAVAILABLE, str(exc)
    if isinstance(exc, CallRefused):
        return exc.code, str(exc)
    if isinstance(exc, AgentError):
        return Status.INTERNAL, f"{type(exc).__name__}: {exc}"
    return Status.INTERNAL, f"internal error ({type(exc).__name__}); see the agent's log"


Unary = Callable[[Any], Awaitable[Any]]


class AgentService:
    """rmd.agent.v1.Agent. Method names are gRPC's."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __mapping__(self) -> dict[str, Handler]:
        methods: dict[str, tuple[Unary, type, type]] = {
            "ApplyWorkload": (
                self.ApplyWorkload,
                agent_pb2.ApplyWorkloadRequest,
                agent_pb2.ApplyWorkloadResponse,
            ),
            "RemoveWorkload": (
                self.RemoveWorkload,
                agent_pb2.RemoveWorkloadRequest,
                agent_pb2.RemoveWorkloadResponse,
            ),
            "ListWorkloads": (
                self.ListWorkloads,
                agent_pb2.ListWorkloadsRequest,
                agent_pb2.ListWorkloadsResponse,
            ),
            "GetNode": (self.GetNode, agent_pb2.GetNodeRequest, agent_pb2.GetNodeResponse),
            "GetContainerCpus": (
                self.GetContainerCpus,
                agent_pb2.GetContainerCpusRequest,
                agent_pb2.GetContainerCpusResponse,
            ),
        }
        return {
            f"{_PATH}/{name}": unary_unary(_answering(method), request, reply)
            for name, (method, request, reply) in methods.items()
        }

    async def ApplyWorkload(self, request: agent_pb2.ApplyWorkloadRequest) -> agent_pb2.ApplyWorkloadResponse:
        applied, changed = await self.engine.apply(convert.workload_from_request(request))
        return agent_pb2.ApplyWorkloadResponse(workload=convert.workload_message(applied), changed=changed)

    async def RemoveWorkload(
        self, request: agent_pb2.RemoveWorkloadRequest
    ) -> agent_pb2.RemoveWorkloadResponse:
        found = await self.engine.remove(*convert.remove_ref(request))
        return agent_pb2.RemoveWorkloadResponse(found=found)

    async def ListWorkloads(self, request: agent_pb2.ListWorkloadsRequest) -> agent_pb2.ListWorkloadsResponse:
        applied = await self.engine.list()
        return agent_pb2.ListWorkloadsResponse(workloads=[convert.workload_message(a) for a in applied])

    async def GetNode(self, request: agent_pb2.GetNodeRequest) -> agent_pb2.GetNodeResponse:
        return convert.node_message(await self.engine.node())

    async def GetContainerCpus(
        self, request: agent_pb2.GetContainerCpusRequest
    ) -> agent_pb2.GetContainerCpusResponse:
        result = await self.engine.container_cpus(*convert.container_ref(request))
        return convert.container_cpus_message(result)


def _answering(method: Unary) -> Callable[[Stream[Any, Any]], Awaitable[None]]:
    async def handle(stream: Stream[Any, Any]) -> None:
        await stream.send_message(await method(await request_of(stream)))

    return handle


class CallGuard:
    """Wraps the handlers of the services it is given: identity check, error mapping, metrics, draining.

    `allowed` None means no identity check (plaintext, --insecure). Calls with a unary answer count as in
    flight until they end; streams (health Watch) do not, since they end only with the server.
    """

    def __init__(self, allowed: frozenset[str] | None, metrics: GrpcMetrics) -> None:
        self.allowed = allowed
        self.metrics = metrics
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = False

    def guard(self, *services: Service) -> list[Service]:
        """The services with every handler wrapped, as grpclib's Server takes them."""
        return [_Guarded({p: self._wrap(p, h) for p, h in s.__mapping__().items()}) for s in services]

    async def drain(self, grace: float) -> None:
        """Refuse new calls (UNAVAILABLE), then wait up to `grace` seconds for the unary calls in flight."""
        self._stopping = True
        if self._in_flight:
            log.info("waiting up to %gs for %d gRPC call(s) in flight", grace, self._in_flight)
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
        except TimeoutError:
            log.warning("%d gRPC call(s) still running after %gs: cancelled", self._in_flight, grace)

    def _wrap(self, path: str, handler: Handler) -> Handler:
        inner = handler.func
        counted = handler.cardinality is Cardinality.UNARY_UNARY

        async def guarded(stream: Stream[Any, Any]) -> None:
            started = time.perf_counter()
            code = Status.OK
            if counted:
                self._in_flight += 1
                self._idle.clear()
            try:
                if self._stopping:
                    raise CallRefused(Status.UNAVAILABLE, "the agent is shutting down")
                self._authorize(path, stream)
                await inner(stream)
            except GRPCError as exc:  # the handler chose its status itself
                code = exc.status
                raise
            except asyncio.CancelledError:
                code = Status.CANCELLED
                raise
            except Exception as exc:
                code, message = self._failed(path, exc)
                raise GRPCError(code, message) from None
            finally:
                self.metrics.observe(path, code, time.perf_counter() - started)
                if counted:
                    self._in_flight -= 1
                    if not self._in_flight:
                        self._idle.set()

        return handler._replace(func=guarded)

    def _authorize(self, method: str, stream: Stream[Any, Any]) -> None:
        if self.allowed is None:
            return
        names = client_dns_names(stream.peer.cert())
        if is_allowed(names, self.allowed):
            return
        if names:
            code = Status.PERMISSION_DENIED
            reason = f"the client certificate's DNS names are not in allowed_clients: {', '.join(names)}"
        else:
            code, reason = Status.UNAUTHENTICATED, NO_DNS_NAME
        log.warning("refused %s from %s: %s", method, stream.peer.addr(), reason)
        raise CallRefused(code, reason)

    def _failed(self, method: str, exc: Exception) -> tuple[Status, str]:
        code, message = status_for(exc)
        if code is Status.INTERNAL:
            log.error("%s failed", method, exc_info=exc)
        elif isinstance(exc, WorkloadRejected):  # the log has the detail, e.g. another namespace's holder
            logged = f"{exc.workload}: {exc.detail}" if exc.workload else exc.detail
            log.info("%s: %s: %s", method, code.name, logged)
        elif not isinstance(exc, CallRefused):
            log.info("%s: %s: %s", method, code.name, message)
        return code, message


class _Guarded:
    def __init__(self, mapping: dict[str, Handler]) -> None:
        self._mapping = mapping

    def __mapping__(self) -> dict[str, Handler]:
        return self._mapping
