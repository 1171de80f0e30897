"""The agent's long-running tasks beside its gRPC API, each optional: power sampling and the cache metrics
(Prometheus), the cache-ways device plugin (kubelet), the NodeResourceTopology export and the RmdNodeState
(Kubernetes API).

They learn about workload changes through `NotifyingEngine`, which wraps the engine the gRPC service calls.
Without a Kubernetes API (no kubeconfig and not in a pod) the Kubernetes tasks are skipped with a warning,
so the agent still enforces workloads and serves metrics; a kubeconfig that is set but unusable is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from rmd_agent.engine_api import (
    AppliedWorkload,
    CacheDomainSummary,
    ChangeNotifier,
    ContainerCpus,
    ManagedEngine,
    NodeSummary,
)
from rmd_agent.hostfs import HostFS
from rmd_agent.kube import api_client_factory, create_api_client
from rmd_agent.metrics.rdt_collector import RdtCollector
from rmd_agent.plan.workload import Workload
from rmd_agent.settings import AgentSettings

if TYPE_CHECKING:
    from rmd_agent.kubelet.podresources import PodResourcesClient

log = logging.getLogger(__name__)


class NotifyingEngine:
    """An engine that calls `on_change()` after every apply or remove that changed the node (and, when the
    engine is a ChangeNotifier, after every change it reports: reconciles, readiness turning; then
    `notifies_all`), and gives everyone who asks for the node's summary after the same change one reading of
    it, since reading the node (its whole resctrl tree) is dear. (The companions ask for the parts they
    need, `cache_domains` and `node_capabilities`, which the real engine gives without the rest.) A summary
    is reused for at most `summary_max_age` seconds, so what changes without the agent (another tool's
    groups) still shows soon."""

    def __init__(
        self, engine: ManagedEngine, on_change: Callable[[], None], *, summary_max_age: float = 1.0
    ) -> None:
        self.inner = engine
        self.on_change = on_change
        self.summary_max_age = summary_max_age
        self._changes = 0
        self._summary: tuple[int, float, asyncio.Future[NodeSummary]] | None = None
        self.notifies_all = isinstance(engine, ChangeNotifier)
        if isinstance(engine, ChangeNotifier):
            engine.add_change_listener(self._changed)

    def _changed(self) -> None:
        self._changes += 1
        self.on_change()

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def apply(self, workload: Workload) -> tuple[AppliedWorkload, bool]:
        applied, changed = await self.inner.apply(workload)
        if changed and not self.notifies_all:
            self._changed()
        return applied, changed

    async def remove(self, namespace: str, name: str, uid: str = "") -> bool:
        found = await self.inner.remove(namespace, name, uid)
        if found and not self.notifies_all:
            self._changed()
        return found

    async def list(self) -> list[AppliedWorkload]:
        return await self.inner.list()

    async def node(self) -> NodeSummary:
        now = time.monotonic()
        cached = self._summary
        if cached is None or cached[0] != self._changes or now - cached[1] > self.summary_max_age:
            cached = self._summary = (self._changes, now, asyncio.ensure_future(self.inner.node()))
        try:
            return await asyncio.shield(cached[2])  # one caller's cancellation is not the others'
        except Exception:
            if self._summary is cached:
                self._summary = None  # a failed reading is not kept
            raise

    async def cache_domains(self) -> tuple[CacheDomainSummary, ...]:
        """The node's caches without its capabilities (engine.NodeEngine.cache_domains); from the summary
        for engines that cannot give them alone."""
        domains = getattr(self.inner, "cache_domains", None)
        if domains is None:
            return (await self.node()).caches
        caches: tuple[CacheDomainSummary, ...] = await domains()
        return caches

    async def node_capabilities(self) -> dict[str, tuple[bool, str]]:
        """The node's capabilities without its caches (engine.NodeEngine.node_capabilities); from the
        summary for engines that cannot give them alone."""
        capabilities = getattr(self.inner, "node_capabilities", None)
        if capabilities is None:
            return (await self.node()).capabilities
        found: dict[str, tuple[bool, str]] = await capabilities()
        return found

    async def container_cpus(self, namespace: str, pod: str, uid: str, container: str) -> ContainerCpus:
        return await self.inner.container_cpus(namespace, pod, uid, container)

    async def ready(self) -> tuple[bool, str]:
        return await self.inner.ready()


def kubernetes_available(settings: AgentSettings) -> bool:
    """A kubeconfig is set, or the agent runs in a pod (the service account's environment is there)."""
    return bool(settings.kubeconfig) or "KUBERNETES_SERVICE_HOST" in os.environ


def _first_client(client: Any, factory: Callable[[], Any]) -> Callable[[], Any]:
    """A factory giving `client` to its first caller and new clients after: the client made to check the
    kubeconfig is not thrown away (making one, TLS context included, is several ms of the start)."""
    made = [client]

    def make() -> Any:
        return made.pop() if made else factory()

    return make


class Companions:
    """The tasks around `engine`. `pods`: the agent's PodResources client, opened and closed by the caller."""

    def __init__(
        self,
        settings: AgentSettings,
        engine: ManagedEngine,
        registry: CollectorRegistry,
        pods: PodResourcesClient,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.pods = pods
        self.engine = NotifyingEngine(engine, self._changed)
        self._listeners: list[Callable[[], None]] = []
        self._stoppers: list[Callable[[], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._engine_started = asyncio.Event()  # set by start(): the cache ways may be read from then on
        self._api: Callable[[], Any] | None = None  # the API client factory, once start_export() made it
        self._export_tried = False  # start_export() ran (start() runs it if the caller did not)
        self._register_metrics()

    def _register_metrics(self) -> None:
        settings, fs = self.settings, HostFS(self.settings.host_root)
        # Each optional companion's modules are imported only when the settings enable it.
        if settings.power_enabled:
            from rmd_agent.metrics.power_collector import PowerCollector  # noqa: PLC0415  # optional
            from rmd_agent.power.sampler import PowerSampler  # noqa: PLC0415  # optional

            self.sampler = PowerSampler(
                fs, interval=settings.power_interval_seconds, containers=settings.power_containers
            )
            self.registry.register(PowerCollector(self.sampler, containers=settings.power_containers))
        self.rdt = RdtCollector(fs, self.engine.list)
        self.registry.register(self.rdt)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))

    async def start_export(self) -> None:
        """Start the NodeResourceTopology export before the engine starts: its first refresh reads the
        kubelet, sysfs and the API server meanwhile and waits for the engine (`start()`) only for the cache
        ways, so the object is correct sooner after the agent starts. Also checks the kubeconfig."""
        settings = self.settings
        if self._export_tried or not (settings.nrt_enabled or settings.node_state_enabled):
            return
        self._export_tried = True  # once: the warning below is said once
        if not kubernetes_available(settings):
            log.warning(
                "no Kubernetes API (no kubeconfig, not in a pod): not publishing RmdNodeState or "
                "NodeResourceTopology"
            )
            return
        client = await asyncio.to_thread(create_api_client, settings)  # fail fast on an unusable kubeconfig
        self._api = factory = _first_client(client, api_client_factory(settings))
        if settings.nrt_enabled:
            from rmd_agent.nrt.exporter import NrtExporter, engine_l3_provider  # noqa: PLC0415  # optional

            ways = engine_l3_provider(self.engine, self._engine_started)
            exporter = NrtExporter(settings, factory, ways, pods=self.pods)
            self._listeners.append(lambda: exporter.poke("workloads changed"))
            self._stoppers.append(exporter.stop)
            self._spawn("nrt-exporter", exporter.run())

    async def start(self, grpc_port: int) -> None:
        """The rest, once the engine has started (and the export, if start_export() was not called)."""
        settings = self.settings
        self._engine_started.set()
        if settings.power_enabled:
            self._spawn("power-sampler", self.sampler.run(self._stop))
        self._spawn("rdt-metrics", self.rdt.run(settings.rdt_metrics_interval_seconds, self._stop))
        if settings.device_plugin_enabled:
            from rmd_agent.deviceplugin.plugin import CacheWaysPlugin  # noqa: PLC0415  # optional
            from rmd_agent.deviceplugin.pools import engine_pools  # noqa: PLC0415  # optional

            plugin = CacheWaysPlugin(
                engine_pools(self.engine, HostFS(settings.host_root)),
                settings.host_path(settings.kubelet_dir) / "device-plugins",
            )
            self._listeners.append(plugin.notify)
            self._stoppers.append(plugin.stop)
            self._spawn("device-plugin", plugin.run())
        await self.start_export()
        factory = self._api
        if factory is None:  # no Kubernetes API, or neither Kubernetes task wanted
            return
        if settings.node_state_enabled:
            from rmd_agent.node_state import NodeStateWriter, endpoint_from_settings  # noqa: PLC0415  # optional

            endpoint = endpoint_from_settings(settings.advertise_address, settings.grpc_listen, grpc_port)
            writer = NodeStateWriter(
                settings, self.engine, factory, endpoint=endpoint, poll_engine=not self.engine.notifies_all
            )
            self._listeners.append(lambda: writer.notify("workloads changed"))
            self._stoppers.append(writer.stop)
            self._spawn("node-state", writer.run())
            if settings.heartbeat_seconds > 0:
                from rmd_agent.heartbeat import Heartbeat  # noqa: PLC0415  # optional

                heartbeat = Heartbeat(settings, factory, on_recovered=writer.recheck)
                self._stoppers.append(heartbeat.stop)
                self._spawn("heartbeat", heartbeat.run())

    async def stop(self, grace: float = 10.0) -> None:
        """Ask every task to finish (the RmdNodeState writer marks the node not ready); cancel stragglers."""
        self._stop.set()
        for stop in self._stoppers:
            stop()
        if not self._tasks:
            return
        _, pending = await asyncio.wait(self._tasks, timeout=grace)
        for task in pending:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await task
                except Exception:
                    log.exception("background task %s failed", task.get_name())
        self._tasks.clear()
