"""The NodeResourceTopology exporter: the agent's long-running task that keeps this node's object current.

    exporter = NrtExporter(settings, api_client_factory, l3_provider)
    task = asyncio.create_task(exporter.run())
    ...
    exporter.stop(); await task

A refresh reads sysfs (NUMA nodes), the kubelet config (topology manager policy and scope), PodResources
(GetAllocatableResources every time, so devices registered later appear; List), the L3 provider and, for the
with-exclusive-resources pod fingerprint, the pods' QoS classes (nrt/pod_qos.py), computes the object
(nrt/zones.py, nrt/fingerprint.py) and hands it to the publisher, which writes only if the content changed.

Refreshes happen on a kubelet state file change or a pod directory coming or going (nrt/triggers.py), on a
poke (the engine changed cache allocations), on a periodic resync (`nrt_resync_seconds`, which also re-reads
the API object to recreate or repair it), and after a failure (with backoff). Triggers that fire while a
refresh waits or runs are coalesced into the next one, and refreshes start at least
`nrt_min_write_interval_seconds` apart, which bounds the write rate (two writes can be closer by the
difference in how long their refreshes took).

A refresh reads again only what its reasons may have changed (`stale_inputs`): PodResources always (the
client reuses the objects of an unchanged answer), the pods' QoS classes after a pod directory event (only
the entries the watches named, all of them at a resync or when a change went unnamed), the L3 provider
after a poke, sysfs NUMA nodes only at a resync; the kubelet config when its file changed.
When nothing it read changed, the last topology is kept and nothing is computed or published.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from typing import Any

from rmd_agent.cache_ways import guaranteed_pools
from rmd_agent.engine_api import Engine
from rmd_agent.errors import AgentError, ConfigError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.config import KubeletConfig, read_kubelet_config
from rmd_agent.kubelet.podresources import PodResources, PodResourcesClient, pod_resources_client
from rmd_agent.nrt import fingerprint
from rmd_agent.nrt.pod_qos import KubeletPodQoS, pod_directories
from rmd_agent.nrt.publisher import NrtPublisher
from rmd_agent.nrt.triggers import (
    EntryLog,
    RefreshTrigger,
    poll_pod_qos,
    poll_pod_resources,
    watch_kubelet_state,
    watch_pod_directories,
)
from rmd_agent.nrt.zones import (
    ATTRIBUTE_TM_POLICY,
    ATTRIBUTE_TM_SCOPE,
    CacheWays,
    NodeTopology,
    compute_zones,
)
from rmd_agent.observe.caches import read_l3_caches
from rmd_agent.observe.numa import NumaNode, read_numa_nodes
from rmd_agent.power.cgroup_paths import QoS
from rmd_agent.settings import AgentSettings
from rmd_api.kube_time import now_micro_time
from rmd_api.names import NRT_REQUEUE_ANNOTATION, NRT_REQUEUE_SECONDS_ANNOTATION

log = logging.getLogger(__name__)

L3Provider = Callable[[], Awaitable[Sequence[CacheWays]]]


class TopologyUnavailable(AgentError):
    """The node's topology cannot be read (no NUMA information in sysfs)."""


def node_exclusions(entries: Sequence[str], node_name: str) -> tuple[str, ...]:
    """The exclusion patterns for this node: entries are `name` (every node) or `<node>:<name>`, where
    name may be a glob (`hugepages-*`); like RTE's resourceExclude and NFD's excludeList with their `*`."""
    patterns = []
    for entry in entries:
        node, sep, name = entry.rpartition(":")
        if not sep or node in ("", "*", node_name):
            patterns.append(name.strip())
    return tuple(p for p in patterns if p)


def sysfs_l3_provider(fs: HostFS) -> L3Provider:
    """Cache ways with no allocations: every way of every L3 available (the default without an engine)."""
    caches: list[CacheWays] | None = None

    async def provide() -> Sequence[CacheWays]:
        nonlocal caches
        if caches is None:
            found = read_l3_caches(fs)
            caches = (
                []
                if isinstance(found, Unsupported)
                else [CacheWays(c.id, c.cpus, c.ways, c.ways) for c in found]
            )
        return caches

    return provide


def engine_l3_provider(engine: Engine, started: asyncio.Event | None = None) -> L3Provider:
    """Cache ways as the engine allocates them: allocatable = the guaranteed pool (rmd_agent.cache_ways, the
    device plugin's devices for that cache, so the zones agree with the Node's allocatable), with what the
    guaranteed workloads hold there; compute_zones takes the devices pods hold from PodResources.

    A domain without a guaranteed pool (no L3 CAT, resctrl not mounted) is left out, and with it the resource.
    `started`: set once the engine has started (what it holds is known only then); awaited before reading.
    """

    async def provide() -> Sequence[CacheWays]:
        if started is not None:
            await started.wait()
        # The real engines give their caches alone: the node summary's capability probe is most of its cost.
        domains = getattr(engine, "cache_domains", None)
        caches = await domains() if domains is not None else (await engine.node()).caches
        return [
            CacheWays(p.cache_id, p.cpus, p.cache_ways, p.size, p.workloads)
            for p in guaranteed_pools(caches, await engine.list())
        ]

    return provide


# Inputs of a refresh that are not read at every refresh (PodResources always is).
NUMA, QOS, L3 = "numa", "qos", "l3"
EVERYTHING = frozenset({NUMA, QOS, L3})


def stale_inputs(reasons: Collection[str] | None, poked: bool) -> frozenset[str]:
    """What a refresh must read again. `reasons` None: a verifying refresh (start, resync, after a failure)
    reads everything. A pod directory event or a List or QoS change seen by polling may bring pods whose QoS
    class is new; a poke (the engine changed allocations) changes the cache ways, and is read as a reason
    to look at the pods again too. sysfs (NUMA nodes, memory, hugepages) changes only with the machine's
    configuration, which the next resync picks up."""
    if reasons is None:
        return EVERYTHING
    stale = {QOS, L3} if poked else set()
    if any(r.startswith("pod") for r in reasons):  # pods:<dir>, pod-qos, podresources(:recovered)
        stale.add(QOS)
    if any(r.endswith((":layout", ":overflow")) for r in reasons):  # something may have been missed
        stale |= {QOS, L3}
    return frozenset(stale)


def _same(a: Sequence[object], b: Sequence[object]) -> bool:
    """Whether two input tuples hold the very same objects (lists compared item by item)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y) or any(i is not j for i, j in zip(x, y, strict=True)):
                return False
        elif x is not y:
            return False
    return True


async def _overlapped(work: Awaitable[NodeTopology], reads: Awaitable[None]) -> NodeTopology:
    """`work`'s result once `reads` (API requests, in a worker thread) are done too: at the start they
    overlap with computing the first topology instead of following it. If either fails, the other is
    cancelled and the failure raised."""
    reading = asyncio.ensure_future(reads)
    try:
        result = await work
    except BaseException:
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        raise
    await reading
    return result


def _annotations(topology: NodeTopology, requeue_seconds: float) -> dict[str, str]:
    """What every write sets besides the topology: the pods fingerprint where older schedulers look for it,
    and the requeue echo's delay (for rmdctl validate)."""
    return {
        fingerprint.ANNOTATION: topology.attribute(fingerprint.ATTRIBUTE) or "",
        NRT_REQUEUE_SECONDS_ANNOTATION: f"{requeue_seconds:g}",
    }


def topology_attributes(config: KubeletConfig, pfp: str, method: str) -> dict[str, str]:
    return {
        ATTRIBUTE_TM_POLICY: config.topology_manager_policy,
        ATTRIBUTE_TM_SCOPE: config.topology_manager_scope,
        fingerprint.ATTRIBUTE: pfp,
        fingerprint.ATTRIBUTE_METHOD: method,
    }


class NrtExporter:
    """Keeps this node's NodeResourceTopology current until stop() (see the module docstring)."""

    def __init__(
        self,
        settings: AgentSettings,
        api_client_factory: Callable[[], Any],
        l3_provider: L3Provider | None = None,
        pods: PodResourcesClient | None = None,
    ) -> None:
        if not settings.node_name:
            raise ConfigError("node_name is required to export the NodeResourceTopology")
        if settings.nrt_pods_fingerprint_method not in fingerprint.METHODS:
            raise ConfigError(
                f"setting nrt_pods_fingerprint_method: {settings.nrt_pods_fingerprint_method!r} must be "
                f"one of {', '.join(fingerprint.METHODS)}"
            )
        for name in ("nrt_resync_seconds", "nrt_poll_seconds"):
            if getattr(settings, name) <= 0:
                raise ConfigError(f"setting {name} must be positive")
        for name in ("nrt_min_write_interval_seconds", "nrt_requeue_seconds"):
            if getattr(settings, name) < 0:
                raise ConfigError(f"setting {name} must not be negative")
        self.settings = settings
        self.fs = HostFS(settings.host_root)
        self.exclude = node_exclusions(settings.nrt_exclude, settings.node_name)
        self._api_client_factory = api_client_factory
        self._l3 = l3_provider or sysfs_l3_provider(self.fs)
        self._pods = pods  # the agent's (opened and closed by it); None: run() opens one of its own
        self._trigger = RefreshTrigger()
        self._stopping = False
        self._config_warned = False
        exclusive = settings.nrt_pods_fingerprint_method == fingerprint.METHOD_EXCLUSIVE
        self.pod_qos = KubeletPodQoS(self.fs, settings.kubelet_config) if exclusive else None
        self._pod_entries = EntryLog()  # pod directory entries seen since the classes were read
        self._qos_problems: tuple[str, ...] = ()
        self._qos_unknown: set[fingerprint.PodKey] = set()  # pods logged as having no QoS class
        # What the last refresh read (kept between refreshes, see stale_inputs) and computed from it.
        self._poked = False
        self._numa: list[NumaNode] | None = None
        self._caches: Sequence[CacheWays] | None = None
        self._classes: dict[fingerprint.PodKey, QoS] | None = None
        self._config: tuple[tuple[int, int, int] | None, KubeletConfig] | None = None
        self._computed: tuple[tuple[object, ...], NodeTopology] | None = None
        self.refreshes = 0  # completed refresh attempts, successful or not (tests wait on it)
        self.echoes = 0  # requeue writes made
        self.failures = 0
        self.last_topology: NodeTopology | None = None
        self.last_outcome = ""  # created, replaced, unchanged, or failed
        self.publisher: NrtPublisher | None = None

    def stop(self) -> None:
        self._stopping = True
        self._trigger.fire("stop")

    def poke(self, reason: str = "requested") -> None:
        """Ask for a refresh soon (e.g. after the engine changed cache allocations)."""
        self._poked = True
        self._trigger.fire(reason)

    async def run(self) -> None:
        """Export until stop() or cancellation. Errors of one refresh are logged and retried, not raised."""
        settings = self.settings
        api_client = await asyncio.to_thread(self._api_client_factory)
        try:
            self.publisher = NrtPublisher(api_client, settings.node_name)
            async with contextlib.AsyncExitStack() as owned:
                podres = self._pods
                if podres is None:
                    podres = await owned.enter_async_context(pod_resources_client(settings))
                watchers = [asyncio.create_task(coro) for coro in self._watchers(podres)]
                try:
                    await self._loop(podres, self.publisher)
                finally:
                    for task in watchers:
                        task.cancel()
                    await asyncio.gather(*watchers, return_exceptions=True)
        finally:
            close = getattr(api_client, "close", None)
            if close is not None:
                await asyncio.to_thread(close)

    def _watchers(self, podres: PodResourcesClient) -> list[Coroutine[Any, Any, None]]:
        """The triggers (nrt/triggers.py): the kubelet's state files and the pods' directories; where the
        pod directories cannot be found, polling of List and of the pods' QoS classes instead."""
        settings, trigger, poll = self.settings, self._trigger, self.settings.nrt_poll_seconds
        watchers: list[Coroutine[Any, Any, None]] = [
            watch_kubelet_state(settings.host_path(settings.kubelet_dir), trigger, poll)
        ]
        dirs = pod_directories(self.fs, settings.kubelet_config)
        if not isinstance(dirs, Unsupported):
            paths = [self.fs.path(d) for d in dirs]
            # the entries are for updating the QoS classes; without classes (fingerprint method all) nothing
            # would take() them and they would pile up
            entries = self._pod_entries if self.pod_qos is not None else None
            watchers.append(watch_pod_directories(paths, trigger, poll, entries))
            return watchers
        log.info("pod directories not found (%s): polling PodResources every %gs instead", dirs, poll)
        watchers.append(poll_pod_resources(podres.list, trigger, poll))
        if self.pod_qos is not None:
            read = self.pod_qos.read
            watchers.append(poll_pod_qos(lambda: read().classes, trigger, poll))
        return watchers

    async def _loop(self, podres: PodResourcesClient, publisher: NrtPublisher) -> None:
        settings = self.settings
        self._trigger.fire("start")
        next_resync = time.monotonic()  # the first refresh verifies against the API server
        requeue_at = float("inf")  # when the echo of the last change is due (docs/topology.md)
        # A trigger other than the start fired and its refresh has not published yet: the write that follows
        # echoes, even when a resync or the retry after a failure is what makes it.
        change_pending = False
        last_refresh = float("-inf")
        backoff = 0.0
        while not self._stopping:
            reasons = await self._trigger.wait(max(0.0, min(next_resync, requeue_at) - time.monotonic()))
            if self._stopping:
                break
            if not reasons and requeue_at <= time.monotonic() < next_resync:
                requeue_at = float("inf")
                await self._echo(publisher)
                continue
            # Bound the refresh (and so the write) rate; what fires meanwhile joins this refresh.
            while (delay := last_refresh + settings.nrt_min_write_interval_seconds - time.monotonic()) > 0:
                reasons |= await self._trigger.wait(delay)
                if self._stopping:
                    return
            change_pending |= bool(reasons - {"start"})
            verify = time.monotonic() >= next_resync or backoff > 0
            if verify:
                next_resync = time.monotonic() + settings.nrt_resync_seconds
            last_refresh = time.monotonic()
            try:
                if verify:  # read the Node and the object while the topology is computed
                    topology = await _overlapped(self.snapshot(podres, None), publisher.read())
                else:
                    topology = await self.snapshot(podres, reasons)
                if topology is self.last_topology and not verify:
                    self.last_outcome = "unchanged"  # as published (a resync checks the object itself)
                else:
                    annotations = _annotations(topology, settings.nrt_requeue_seconds)
                    self.last_outcome = await publisher.publish(topology, annotations)
                    # An allocation changed (not a start or a repair): echo it, a burst re-arms the echo.
                    echo = change_pending and settings.nrt_requeue_seconds > 0
                    if echo and self.last_outcome != "unchanged":
                        requeue_at = time.monotonic() + settings.nrt_requeue_seconds
                self.last_topology = topology
                change_pending = False
                backoff = 0.0
                log.debug("refresh (%s): %s", ", ".join(sorted(reasons)) or "resync", self.last_outcome)
            except Exception as exc:  # a long-running exporter must survive any one failed refresh
                self.failures += 1
                self.last_outcome = "failed"
                backoff = min(settings.nrt_resync_seconds, max(1.0, backoff * 2))
                log.warning("NodeResourceTopology refresh failed (retry in %gs): %s", backoff, exc)
                next_resync = min(next_resync, time.monotonic() + backoff)
            finally:
                self.refreshes += 1

    async def _echo(self, publisher: NrtPublisher) -> None:
        """Write the published object once more, only our requeue annotation changed: the update event makes
        the scheduler retry the pods it rejected from its cache, which has resynced since the change. A new
        value every time, since a replace that changes nothing sends no event. A failure is only logged: the
        echo is a hint, and the object itself is correct."""
        topology = self.last_topology
        if topology is None:
            return
        annotations = _annotations(topology, self.settings.nrt_requeue_seconds)
        annotations[NRT_REQUEUE_ANNOTATION] = now_micro_time()
        try:
            await publisher.publish(topology, annotations, verify=False)
            self.echoes += 1
        except Exception as exc:  # see the docstring
            log.warning("NodeResourceTopology requeue write failed: %s", exc)

    async def snapshot(
        self, podres: PodResourcesClient, reasons: Collection[str] | None = None
    ) -> NodeTopology:
        """The object's content from the inputs; `reasons` (what woke this refresh) say which inputs to read
        again (stale_inputs), None reads all. The same object as last time when no input changed."""
        stale = stale_inputs(reasons, self._poked)
        self._poked = False
        if NUMA in stale or self._numa is None:
            numa = read_numa_nodes(self.fs)
            if isinstance(numa, Unsupported):
                raise TopologyUnavailable(str(numa))
            self._numa = numa
        # Both calls in flight at once: one round trip to the kubelet per refresh, not two.
        allocatable, pods = await asyncio.gather(podres.get_allocatable(), podres.list())
        if QOS in stale or self._classes is None:
            self._classes = self._read_pod_classes(full=reasons is None)
        config = self._kubelet_config(force=reasons is None)
        if L3 in stale or self._caches is None:  # last: at the agent's start, it waits for the engine
            self._caches = await self._l3()
        inputs = (self._numa, allocatable, pods, self._caches, self._classes, config)
        if self._computed is not None and _same(inputs, self._computed[0]):
            self._log_unknown_classes(pods, self._classes)
            return self._computed[1]
        zones = compute_zones(self._numa, allocatable, pods, self._caches, self.exclude)
        method = self.settings.nrt_pods_fingerprint_method
        listed = {r.name for zone in zones for r in zone.resources}  # what the scheduler calls the NRT's
        self._log_unknown_classes(pods, self._classes)
        pfp = fingerprint.pods_fingerprint(pods, method, self._classes, listed)
        topology = NodeTopology.of(zones, topology_attributes(config, pfp, method))
        if self._computed is not None and topology == self._computed[1]:
            topology = self._computed[1]  # equal content: keep the object, so the exporter skips publishing
        self._computed = (inputs, topology)
        return topology

    def _read_pod_classes(self, full: bool) -> dict[fingerprint.PodKey, QoS]:
        """The QoS classes of the pods (with-exclusive-resources only): updated from the pod directory entries
        the watches named since the last reading, read in full when `full`, when one may be missing or
        nothing was read yet. An unreadable source is logged once as a warning."""
        if self.pod_qos is None:
            return {}
        entries = self._pod_entries.take()
        update = None if full or entries is None else self.pod_qos.update(entries)
        reading = update if update is not None else self.pod_qos.read()
        if reading.problems and reading.problems != self._qos_problems:
            log.warning(
                "pod QoS classes unknown (%s): the pod fingerprint may not match the scheduler's for "
                "Guaranteed pods without exclusive CPUs",
                "; ".join(reading.problems),
            )
        self._qos_problems = reading.problems
        return reading.classes

    def _log_unknown_classes(
        self, pods: Sequence[PodResources], classes: Collection[fingerprint.PodKey]
    ) -> None:
        """Pods without a QoS class are decided from PodResources alone; each is logged once at debug."""
        if self.pod_qos is None:
            return
        unknown = {(p.namespace, p.name) for p in pods} - set(classes)
        for key in sorted(unknown - self._qos_unknown):
            log.debug("no QoS class for pod %s/%s: fingerprint decided from PodResources", *key)
        self._qos_unknown = unknown

    def _kubelet_config(self, force: bool = False) -> KubeletConfig:
        """Read again whenever its file changed, so a changed topology manager policy shows (NFD #1256,
        RTE #162); the same object while it did not."""
        try:
            st = os.stat(self.fs.path(self.settings.kubelet_config))
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = None
        if not force and self._config is not None and self._config[0] == stamp and stamp is not None:
            return self._config[1]
        config = self._read_kubelet_config()
        if self._config is not None and config == self._config[1]:
            config = self._config[1]
        self._config = (stamp, config)
        return config

    def _read_kubelet_config(self) -> KubeletConfig:
        config = read_kubelet_config(self.fs, self.settings.kubelet_config)
        if isinstance(config, Unsupported):
            if not self._config_warned:
                log.warning("kubelet config unreadable, publishing the kubelet defaults: %s", config)
            self._config_warned = True
            return KubeletConfig()
        self._config_warned = False
        return config
