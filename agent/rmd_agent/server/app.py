"""`rmd-agent serve`: the engine behind the gRPC API (mTLS), the gRPC health service, and the HTTP health and
metrics endpoints, with an orderly start and stop.

Start: settings, certificates and ports are checked first (fail fast, before touching the node), the HTTP
endpoints come up (alive, not ready), the engine starts (reconciles with the node), and the gRPC server
opens. Stop (SIGTERM, SIGINT): readiness and gRPC health turn NOT_SERVING, in-flight
calls get shutdown_grace_seconds to finish, then the engine closes and the HTTP endpoints go last.

`serve` opens the one client of the kubelet's PodResources API that the engine (container CPUs, the probe of
its capabilities) and the NodeResourceTopology export share, and closes it after everything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
import socket
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

from grpclib.server import Server
from prometheus_client import CollectorRegistry, ProcessCollector

from rmd_agent.companions import Companions
from rmd_agent.engine_api import ManagedEngine
from rmd_agent.errors import ConfigError
from rmd_agent.heap import START_UP_SECONDS, release_freed_heap
from rmd_agent.kube import create_api_client
from rmd_agent.kubelet.podresources import PodResourcesClient, pod_resources_client
from rmd_agent.server.grpc_service import AgentService, CallGuard
from rmd_agent.server.health import NOT_SERVING, SERVING, HealthService
from rmd_agent.server.http_endpoints import HealthHttpServer
from rmd_agent.server.metrics import GrpcMetrics
from rmd_agent.server.tls import check_allowed_clients, server_ssl_context
from rmd_agent.settings import AgentSettings, split_host_port
from rmd_api.agent.v1 import agent_pb2
from rmd_api.agent_certs import MIN_EXPIRATION_SECONDS

if TYPE_CHECKING:
    from rmd_agent.server.serving_cert import ServingCertificate

log = logging.getLogger(__name__)

AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["Agent"].full_name
_HEALTH_REFRESH_SECONDS = 5.0

# The engine of `serve`, given the agent's one PodResources client (open while the engine runs).
EngineFactory = Callable[[AgentSettings, PodResourcesClient], ManagedEngine]


def create_default_engine(settings: AgentSettings, pods: PodResourcesClient) -> ManagedEngine:
    # Imported late, so the server modules load (and are tested) without the node-side stack.
    engines = importlib.import_module("rmd_agent.engine")
    engine: ManagedEngine = engines.create_engine(settings, pods)
    return engine


def check_serve_settings(settings: AgentSettings) -> ssl.SSLContext | None:
    """ConfigError for settings `serve` cannot run with, unreadable certificates included (checked before
    anything starts, so a misconfigured agent fails at once and never touches the node). Returns the gRPC
    server's TLS context, None with insecure."""
    split_host_port(settings.grpc_listen)
    split_host_port(settings.http_listen)
    if not settings.insecure:
        check_allowed_clients(settings.allowed_clients)
    for name in ("shutdown_grace_seconds", "heartbeat_seconds"):
        if getattr(settings, name) < 0:
            raise ConfigError(f"setting {name} cannot be negative ({getattr(settings, name)})")
    if settings.tls_csr and not settings.insecure:
        if not settings.node_name:
            raise ConfigError("tls_csr needs node_name (or $NODE_NAME): the certificate names the node")
        if settings.tls_csr_expiration_seconds < MIN_EXPIRATION_SECONDS:
            raise ConfigError(
                f"setting tls_csr_expiration_seconds: at least {MIN_EXPIRATION_SECONDS}, not "
                f"{settings.tls_csr_expiration_seconds}"
            )
    if settings.insecure or settings.tls_csr:  # with tls_csr the files come once the certificate is issued
        return None
    return server_ssl_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca)


def bind_port(address: str, what: str) -> socket.socket:
    """A socket bound to `address` (not yet listening: nobody connects before the server serves), or
    ConfigError when it cannot be bound (another process holds it). No SO_REUSEPORT: a second agent on the
    same port fails here instead of silently sharing the traffic."""
    host, port = split_host_port(address)
    bound = None
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        bound = socket.socket(family, kind, proto)
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait for TIME_WAIT
        bound.bind(sockaddr)
    except OSError as exc:
        if bound is not None:
            bound.close()
        raise ConfigError(f"cannot listen on {address} for {what}: {exc.strerror or exc}") from None
    return bound


class AgentServer:
    """The agent's servers around one engine. `start()` then `stop()`; ports are known after start."""

    def __init__(
        self, settings: AgentSettings, engine: ManagedEngine, registry: CollectorRegistry | None = None
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.registry = registry if registry is not None else CollectorRegistry()
        self.grpc_port = 0
        self.http_port = 0
        self.health = HealthService()
        self._http = HealthHttpServer(self.registry, self.ready)
        self._grpc: Server | None = None
        self._guard = CallGuard(
            None if settings.insecure else frozenset(settings.allowed_clients), GrpcMetrics(self.registry)
        )
        self._engine_started = False
        self._stopping = False
        self._health_task: asyncio.Task[None] | None = None
        self._agent_serving: bool | None = None  # the Agent service's health as last set
        self._certificate: ServingCertificate | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._trim: asyncio.TimerHandle | None = None

    def _serving_certificate(self) -> ServingCertificate:
        # Only with tls_csr: the certificate request needs the `cryptography` package (9 MiB), which an agent
        # given its certificate as files never loads.
        from rmd_agent.server.serving_cert import ServingCertificate  # noqa: PLC0415  # optional

        settings = self.settings
        if self._certificate is None:
            self._certificate = ServingCertificate(
                create_api_client(settings),
                node=settings.node_name,
                name=settings.tls_server_name.replace("{node}", settings.node_name),
                cert_path=settings.tls_cert,
                key_path=settings.tls_key,
                expiration_seconds=settings.tls_csr_expiration_seconds,
            )
        return self._certificate

    async def ready(self) -> tuple[bool, str]:
        if self._stopping:
            return False, "shutting down"
        if not self._engine_started or self._grpc is None:
            return False, "starting"
        return await self.engine.ready()

    async def start(self) -> None:
        """Bring everything up; on failure, whatever started is stopped again and the error raised."""
        settings = self.settings
        credentials = check_serve_settings(settings)
        if settings.tls_csr and not settings.insecure:
            await self._serving_certificate().ensure()
            credentials = server_ssl_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
        # Bound before the engine starts, to fail before touching the node; served once it has started.
        listener = bind_port(settings.grpc_listen, "gRPC")
        try:
            self.http_port = await self._http.start(settings.http_listen)
            await self.engine.start()
            self._engine_started = True
            self._grpc = self._grpc_server()
            self.grpc_port = listener.getsockname()[1]
            await self._grpc.start(sock=listener, ssl=credentials)
            await self._refresh_health()
        except BaseException:
            listener.close()
            await self.stop()
            raise
        self._health_task = asyncio.create_task(self._watch_health(), name="grpc-health")
        self._trim = asyncio.get_running_loop().call_later(START_UP_SECONDS, release_freed_heap)
        if self._certificate is not None:
            self._renewal = asyncio.create_task(self._certificate.renew_forever(), name="tls-renewal")
        log.info(
            "serving gRPC on %s (port %d, %s) and HTTP on %s (port %d)",
            settings.grpc_listen,
            self.grpc_port,
            "PLAINTEXT" if settings.insecure else "mTLS",
            settings.http_listen,
            self.http_port,
        )

    def _grpc_server(self) -> Server:
        if self.settings.insecure:
            log.warning(
                "--insecure: the gRPC API on %s is PLAINTEXT with no client authentication; anyone who "
                "reaches it can change this node's cache, bandwidth and P-state settings",
                self.settings.grpc_listen,
            )
        return Server(self._guard.guard(AgentService(self.engine), self.health))

    async def _refresh_health(self) -> None:
        """Overall health follows the process; the Agent service's follows the engine's readiness. Set only
        when it turns. Asking the engine here is also how it notices a readiness change by itself (resctrl
        unmounted) and tells its readers (engine_api.ChangeNotifier)."""
        ok, _ = await self.ready()
        if ok == self._agent_serving:
            return
        if self._agent_serving is None:
            await self.health.set("", SERVING)
        await self.health.set(AGENT_SERVICE, SERVING if ok else NOT_SERVING)
        self._agent_serving = ok

    async def _watch_health(self) -> None:
        while True:
            await asyncio.sleep(_HEALTH_REFRESH_SECONDS)
            try:
                await self._refresh_health()
            except Exception:
                log.exception("refreshing gRPC health failed")

    async def stop(self) -> None:
        """NOT_SERVING, drain gRPC calls within the grace period, close the engine, then HTTP. Idempotent."""
        self._stopping = True
        if self._trim is not None:
            self._trim.cancel()
        if self._renewal is not None:  # (it may be waiting for a signature: cancel, do not wait)
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal
            self._renewal = None
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        await self.health.enter_graceful_shutdown()
        if self._grpc is not None:
            await self._guard.drain(self.settings.shutdown_grace_seconds)
            self._grpc.close()  # cancels what still runs (health Watch streams)
            # grpclib leaves accepted connections open: on CPython 3.12.1+ asyncio's wait_closed waits for
            # them too, so moving the images past 3.11 needs the connections closed here first.
            await self._grpc.wait_closed()
            self._grpc = None
        if self._engine_started:
            self._engine_started = False
            try:
                await self.engine.close()
            except Exception:
                log.exception("closing the engine failed")
        await self._http.close()


async def serve(
    settings: AgentSettings,
    engine_factory: EngineFactory = create_default_engine,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the agent until SIGTERM/SIGINT (or `stop` is set)."""
    check_serve_settings(settings)
    async with pod_resources_client(settings) as pods:  # shared by the engine, the probe and the NRT export
        await _run(settings, engine_factory(settings, pods), pods, stop or asyncio.Event())
    log.info("stopped")


async def _run(
    settings: AgentSettings, engine: ManagedEngine, pods: PodResourcesClient, stop: asyncio.Event
) -> None:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    companions = Companions(settings, engine, registry, pods)
    server = AgentServer(settings, companions.engine, registry)
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            await companions.start_export()  # the NRT export's reads overlap the engine's start
            await server.start()
            await companions.start(server.grpc_port)
            await stop.wait()
            log.info("stopping: draining gRPC calls for up to %gs", settings.shutdown_grace_seconds)
        finally:
            await companions.stop()
            await server.stop()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
