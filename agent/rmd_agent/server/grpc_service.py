"""The rmd.agent.v1.Agent gRPC service over an Engine, and the interceptor every call passes through.

The servicer only converts and delegates: it raises the engine's errors as they come. The interceptor does
what every method needs, in one place: it refuses callers whose certificate identity is not allowed, turns
errors into status codes (`status_for`), and counts and times each call.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from rmd_agent.engine_api import Engine, EngineUnavailable
from rmd_agent.errors import AgentError, KubeletUnavailable
from rmd_agent.plan.workload import RejectReason, WorkloadRejected
from rmd_agent.server import convert
from rmd_agent.server.metrics import GrpcMetrics
from rmd_agent.server.tls import NO_DNS_NAME, client_dns_names, is_allowed
from rmd_api.agent.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

_REJECT_CODES = {
    RejectReason.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    RejectReason.CAPACITY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    RejectReason.CONFLICT: grpc.StatusCode.FAILED_PRECONDITION,
}

_add_servicer: Any = agent_pb2_grpc.add_AgentServicer_to_server  # generated without annotations


class CallRefused(Exception):
    """The caller may not call this agent (raised by the identity check, answered with its code)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def status_for(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code and message answering an exception. Unexpected ones are INTERNAL, with only the
    exception's type in the message (the traceback goes to the log, not to the caller)."""
    if isinstance(exc, WorkloadRejected):
        return _REJECT_CODES[exc.reason], exc.message
    if isinstance(exc, convert.InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, EngineUnavailable | KubeletUnavailable):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if isinstance(exc, CallRefused):
        return exc.code, str(exc)
    if isinstance(exc, AgentError):
        return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
    return grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); see the agent's log"


class AgentService:
    """rmd.agent.v1.Agent. Method names are gRPC's."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def register(self, server: grpc.aio.Server) -> None:
        _add_servicer(self, server)

    async def ApplyWorkload(
        self, request: agent_pb2.ApplyWorkloadRequest, context: Context
    ) -> agent_pb2.ApplyWorkloadResponse:
        applied, changed = await self.engine.apply(convert.workload_from_request(request))
        return agent_pb2.ApplyWorkloadResponse(workload=convert.workload_message(applied), changed=changed)

    async def RemoveWorkload(
        self, request: agent_pb2.RemoveWorkloadRequest, context: Context
    ) -> agent_pb2.RemoveWorkloadResponse:
        found = await self.engine.remove(*convert.remove_ref(request))
        return agent_pb2.RemoveWorkloadResponse(found=found)

    async def ListWorkloads(
        self, request: agent_pb2.ListWorkloadsRequest, context: Context
    ) -> agent_pb2.ListWorkloadsResponse:
        applied = await self.engine.list()
        return agent_pb2.ListWorkloadsResponse(workloads=[convert.workload_message(a) for a in applied])

    async def GetNode(self, request: agent_pb2.GetNodeRequest, context: Context) -> agent_pb2.GetNodeResponse:
        return convert.node_message(await self.engine.node())

    async def GetContainerCpus(
        self, request: agent_pb2.GetContainerCpusRequest, context: Context
    ) -> agent_pb2.GetContainerCpusResponse:
        result = await self.engine.container_cpus(*convert.container_ref(request))
        return convert.container_cpus_message(result)


Behaviour = Callable[[Any, Context], Any]


class AgentInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Wraps every registered handler: identity check, error mapping, metrics.

    `allowed` None means no identity check (plaintext, --insecure). Handlers are wrapped once per method and
    cached. Only the shapes this server has are wrapped: coroutine handlers of unary requests, answering
    one response or writing a stream with context.write (the Agent API, grpc.health.v1 Check and Watch). A
    handler of another shape is not served rather than served unchecked.
    """

    def __init__(self, allowed: frozenset[str] | None, metrics: GrpcMetrics) -> None:
        self.allowed = allowed
        self.metrics = metrics
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any] | None] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method
        if method not in self._wrapped:
            handler = await continuation(handler_call_details)
            if handler is None:  # unknown method: not cached, so callers cannot grow the cache
                return handler
            self._wrapped[method] = self._wrap(method, handler)
        # None makes grpc answer UNIMPLEMENTED; the stubs do not admit it.
        return self._wrapped[method]  # type: ignore[return-value]

    def _wrap(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        args = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        # grpc-stubs types handlers with the synchronous context; on this server they are coroutines.
        if handler.unary_unary is not None:
            unary: Behaviour = handler.unary_unary  # type: ignore[assignment]
            return grpc.unary_unary_rpc_method_handler(self._unary(method, unary), **args)
        stream: Behaviour | None = handler.unary_stream  # type: ignore[assignment]
        if stream is not None and not inspect.isasyncgenfunction(stream):  # writes with context.write
            return grpc.unary_stream_rpc_method_handler(self._unary(method, stream), **args)
        log.error("not serving %s: the agent's interceptor does not wrap handlers of its shape", method)
        return None

    def _unary(self, method: str, inner: Behaviour) -> Behaviour:
        async def behaviour(request: Any, context: Context) -> Any:
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                self._authorize(method, context)
                return await inner(request, context)
            except grpc.aio.AbortError:  # the handler chose its status itself
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception as exc:
                code, message = self._failed(method, exc)
                await context.abort(code, message)
            finally:
                self.metrics.observe(method, code, time.perf_counter() - started)

        return behaviour

    def _authorize(self, method: str, context: Context) -> None:
        if self.allowed is None:
            return
        names = client_dns_names(context.auth_context())
        if is_allowed(names, self.allowed):
            return
        if names:
            code = grpc.StatusCode.PERMISSION_DENIED
            reason = f"the client certificate's DNS names are not in allowed_clients: {', '.join(names)}"
        else:
            code, reason = grpc.StatusCode.UNAUTHENTICATED, NO_DNS_NAME
        log.warning("refused %s from %s: %s", method, context.peer(), reason)
        raise CallRefused(code, reason)

    def _failed(self, method: str, exc: Exception) -> tuple[grpc.StatusCode, str]:
        code, message = status_for(exc)
        if code is grpc.StatusCode.INTERNAL:
            log.error("%s failed", method, exc_info=exc)
        elif isinstance(exc, WorkloadRejected):  # the log has the detail, e.g. another namespace's holder
            logged = f"{exc.workload}: {exc.detail}" if exc.workload else exc.detail
            log.info("%s: %s: %s", method, code.name, logged)
        elif not isinstance(exc, CallRefused):
            log.info("%s: %s: %s", method, code.name, message)
        return code, message
