"""grpc.health.v1.Health: Check and Watch, for kubelet gRPC probes and grpc_health_probe.

As gRPC's reference servicer: a service never set is NOT_FOUND to Check and SERVICE_UNKNOWN to Watch; Watch
sends the current status, then each change; after enter_graceful_shutdown every service is NOT_SERVING and
stays so.
"""

from __future__ import annotations

import asyncio
from typing import Any

from grpc_health.v1 import health_pb2
from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from rmd_agent.rpc import request_of, unary_stream, unary_unary

_Response = health_pb2.HealthCheckResponse
SERVING: Any = _Response.SERVING
NOT_SERVING: Any = _Response.NOT_SERVING
_UNKNOWN: Any = _Response.SERVICE_UNKNOWN
_PATH = "/grpc.health.v1.Health"


class HealthService:
    def __init__(self) -> None:
        self._statuses: dict[str, Any] = {}
        self._changed = asyncio.Condition()
        self._shut_down = False

    async def set(self, service: str, status: Any) -> None:
        if self._shut_down:
            return
        await self._set(service, status)

    async def enter_graceful_shutdown(self) -> None:
        for service in list(self._statuses):
            await self._set(service, NOT_SERVING)
        self._shut_down = True

    async def _set(self, service: str, status: Any) -> None:
        async with self._changed:
            self._statuses[service] = status
            self._changed.notify_all()

    async def check(self, stream: Stream[Any, Any]) -> None:
        request = await request_of(stream)
        status = self._statuses.get(request.service)
        if status is None:
            raise GRPCError(Status.NOT_FOUND, f"unknown service {request.service!r}")
        await stream.send_message(_Response(status=status))

    async def watch(self, stream: Stream[Any, Any]) -> None:
        request = await request_of(stream)
        service = request.service
        sent = None
        while True:
            async with self._changed:
                while (status := self._statuses.get(service, _UNKNOWN)) == sent:
                    await self._changed.wait()
            await stream.send_message(_Response(status=status))
            sent = status

    def __mapping__(self) -> dict[str, Handler]:
        return {
            f"{_PATH}/Check": unary_unary(self.check, health_pb2.HealthCheckRequest, _Response),
            f"{_PATH}/Watch": unary_stream(self.watch, health_pb2.HealthCheckRequest, _Response),
        }
