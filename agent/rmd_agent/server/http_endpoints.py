"""The agent's plain-HTTP endpoints, for the kubelet's probes and Prometheus:

    /healthz   200 while the process serves (liveness)
    /readyz    200 once the engine has reconciled with the node, else 503 with the reason (readiness)
    /metrics   the process's one Prometheus registry, text format

A deliberately small HTTP/1.0-style server on asyncio (one request per connection, GET and HEAD only): these
endpoints need nothing more, and it keeps the agent on one event loop with no extra threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from rmd_agent.errors import ConfigError
from rmd_agent.metrics import exposition
from rmd_agent.settings import split_host_port

log = logging.getLogger(__name__)

ReadyCheck = Callable[[], Awaitable[tuple[bool, str]]]

_HEADER_LIMIT = 16 * 1024
_READ_TIMEOUT = 5.0  # a client that does not send its request in time is dropped
_READY_TIMEOUT = 2.0  # a stuck engine shows as not ready, not as a hung probe connection


def _response(status: HTTPStatus, body: bytes, content_type: str, head: bool) -> bytes:
    lines = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        "",
        "",
    ]
    return "\r\n".join(lines).encode() + (b"" if head else body)


class HealthHttpServer:
    def __init__(self, registry: CollectorRegistry, ready: ReadyCheck) -> None:
        self.registry = registry
        self.ready = ready
        self._server: asyncio.Server | None = None

    async def start(self, address: str) -> int:
        """Listen on `address`; returns the bound port (useful with port 0)."""
        host, port = split_host_port(address)
        try:
            self._server = await asyncio.start_server(self._handle, host, port, limit=_HEADER_LIMIT)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {address} for HTTP: {exc.strerror}") from None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_READ_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            writer.write(await self._answer(head))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a client that went away or never sent a request: nothing to answer
        except Exception:
            log.exception("HTTP request failed")
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, head: bytes) -> bytes:
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3:
            return _response(HTTPStatus.BAD_REQUEST, b"bad request\n", "text/plain", False)
        method, target, _ = parts
        is_head = method == "HEAD"
        if method not in ("GET", "HEAD"):
            return _response(HTTPStatus.METHOD_NOT_ALLOWED, b"GET or HEAD only\n", "text/plain", False)
        path = target.split("?", 1)[0]
        if path == "/healthz":
            return _response(HTTPStatus.OK, b"ok\n", "text/plain", is_head)
        if path == "/readyz":
            ok, reason = await self._readiness()
            status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
            return _response(status, f"{'ok' if ok else reason}\n".encode(), "text/plain", is_head)
        if path == "/metrics":
            return _response(HTTPStatus.OK, exposition.generate(self.registry), CONTENT_TYPE_LATEST, is_head)
        return _response(
            HTTPStatus.NOT_FOUND, b"not found: try /healthz, /readyz or /metrics\n", "text/plain", is_head
        )

    async def _readiness(self) -> tuple[bool, str]:
        try:
            async with asyncio.timeout(_READY_TIMEOUT):
                return await self.ready()
        except TimeoutError:
            return False, f"readiness check did not answer within {_READY_TIMEOUT:g}s"
        except Exception as exc:
            log.exception("readiness check failed")
            return False, f"readiness check failed: {type(exc).__name__}: {exc}"
