"""A gRPC server with the agent's own TLS (rmd_agent.server.tls) and health service, on a thread of its own,
for tests whose other side is synchronous (rmdctl validate, the operator's dialing)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

from grpclib.server import Server

from rmd_agent.server.health import SERVING, HealthService
from rmd_agent.server.tls import server_ssl_context


@contextlib.contextmanager
def agent_tls_server(cert: Path, key: Path, client_ca: Path) -> Iterator[int]:
    """Serve grpc.health.v1 (overall status SERVING) on a loopback port, given while the block runs."""
    context = server_ssl_context(cert, key, client_ca)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()

    async def serve() -> None:
        health = HealthService()
        await health.set("", SERVING)
        server = Server([health])
        await server.start(sock=listener, ssl=context)
        started.set()
        await stop.wait()
        server.close()
        await server.wait_closed()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
