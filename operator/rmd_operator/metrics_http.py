"""The operator's Prometheus endpoint: GET /metrics on the metrics_listen address (docs/metrics.md).

Served by aiohttp on kopf's event loop (kopf already depends on it; no thread, no second server library). The
registry holds the node-telemetry collector (telemetry/metrics.py); each scrape renders the collectors'
snapshot of that moment.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from rmd_operator.errors import ConfigError


def split_listen(address: str) -> tuple[str, int]:
    """host:port (an IPv6 host in brackets; checked by the settings) -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class MetricsServer:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)

    async def start(self, address: str) -> int:
        """Listen on `address`; returns the bound port (useful with port 0)."""
        host, port = split_listen(address)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigError(f"cannot listen on {address} for metrics: {exc.strerror}") from None
        server = site._server  # aiohttp keeps the bound sockets there only
        sockets = getattr(server, "sockets", None) or ()
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def close(self) -> None:
        await self._runner.cleanup()

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
