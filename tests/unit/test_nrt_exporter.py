"""The exporter's loop (rmd_agent.nrt.exporter): coalescing, the write-rate bound, periodic verification,
retry after failure, and configuration checks. PodResources and the API are faked here; the real ones are
exercised in tests/e2e/test_nrt.py."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rmd_agent.cache_ways import Holding
from rmd_agent.engine_api import CacheDomainSummary, NodeSummary
from rmd_agent.errors import ConfigError
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.podresources import AllocatableResources, ContainerResources, PodResources
from rmd_agent.nrt import exporter as exporter_module
from rmd_agent.nrt import fingerprint
from rmd_agent.nrt.exporter import NrtExporter, engine_l3_provider, sysfs_l3_provider
from rmd_agent.nrt.zones import CacheWays, NodeTopology
from rmd_agent.settings import AgentSettings
from rmd_api.names import NRT_REQUEUE_ANNOTATION, NRT_REQUEUE_SECONDS_ANNOTATION
from rmd_sim.kubelet import write_atomically


class FakeKubelet:
    async def get_allocatable(self) -> AllocatableResources:
        return AllocatableResources(frozenset({0, 1}))

    async def list(self) -> list[PodResources]:
        return []


class FakePublisher:
    """Records each publish (monotonic time, verified: with verify, or right after read()); fails the first
    `failures` calls."""

    def __init__(self, failures: int = 0) -> None:
        self.calls: list[tuple[float, bool]] = []
        self.failures = failures
        self.reads = 0
        self._read = False

    async def read(self) -> None:
        self.reads += 1
        self._read = True

    async def publish(
        self, topology: NodeTopology, annotations: Mapping[str, str], *, verify: bool = False
    ) -> str:
        self.calls.append((time.monotonic(), verify or self._read))
        self._read = False
        if self.failures:
            self.failures -= 1
            raise RuntimeError("API server unavailable")
        return "unchanged"


@pytest.fixture
def host(make_tree: Callable[[Mapping[str, str]], Path]) -> Path:
    return make_tree(
        {
            "sys/devices/system/node/node0/cpulist": "0-1\n",
            "sys/devices/system/node/node0/meminfo": "Node 0 MemTotal:  1048576 kB\n",
            "sys/devices/system/node/node0/distance": "10\n",
        }
    )


def exporter(host: Path, **settings: Any) -> NrtExporter:
    return NrtExporter(
        AgentSettings(node_name="n1", host_root=host, **settings), api_client_factory=lambda: None
    )


async def until(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


class ChangingKubelet(FakeKubelet):
    """A different List answer at every call, so that every refresh has something to publish (a refresh
    whose inputs did not change publishes nothing)."""

    def __init__(self) -> None:
        self.calls = 0

    async def list(self) -> list[PodResources]:
        self.calls += 1
        return [PodResources("ns", f"pod-{self.calls}", (ContainerResources("c", frozenset({1})),))]


async def run_loop(
    exp: NrtExporter, publisher: FakePublisher, kubelet: FakeKubelet | None = None
) -> asyncio.Task[None]:
    return asyncio.create_task(exp._loop(kubelet or FakeKubelet(), publisher))  # type: ignore[arg-type]


async def stop(exp: NrtExporter, task: asyncio.Task[None]) -> None:
    exp.stop()
    await asyncio.wait_for(task, 5)


async def test_a_burst_of_triggers_is_one_refresh_after_the_interval(host: Path) -> None:
    exp = exporter(host, nrt_min_write_interval_seconds=0.3, nrt_resync_seconds=600.0)
    publisher = FakePublisher()
    task = await run_loop(exp, publisher, ChangingKubelet())
    try:
        await until(lambda: len(publisher.calls) == 1)
        for _ in range(20):
            exp.poke("burst")
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.8)
    finally:
        await stop(exp, task)
    assert [verify for _, verify in publisher.calls] == [True, False]  # start verifies, the burst does not
    assert publisher.calls[1][0] - publisher.calls[0][0] >= 0.3 - 0.01


async def test_refreshes_are_never_closer_than_the_interval(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp = exporter(host, nrt_min_write_interval_seconds=0.1, nrt_resync_seconds=600.0)
    publisher = FakePublisher()
    started: list[float] = []  # when each refresh began (its publish follows by however long it took)
    snapshot = exp.snapshot

    async def timed(*args: Any) -> NodeTopology:
        started.append(time.monotonic())
        return await snapshot(*args)

    monkeypatch.setattr(exp, "snapshot", timed)
    task = await run_loop(exp, publisher, ChangingKubelet())
    try:
        deadline = time.monotonic() + 0.7
        while time.monotonic() < deadline:
            exp.poke("storm")
            await asyncio.sleep(0.003)
    finally:
        await stop(exp, task)
    assert 3 <= len(publisher.calls) <= 8
    assert all(b - a >= 0.1 - 0.01 for a, b in itertools.pairwise(started))


async def test_the_api_is_read_while_the_first_topology_is_computed(host: Path) -> None:
    """The start's reads of the Node and the object overlap with reading the kubelet (each here waits for
    the other to have begun), so the first object is not one round trip after another; a failed read
    fails that refresh, which is retried."""
    exp = exporter(host, nrt_resync_seconds=600.0)
    reading, listing = asyncio.Event(), asyncio.Event()

    class Publisher(FakePublisher):
        async def read(self) -> None:
            reading.set()
            await asyncio.wait_for(listing.wait(), 5)
            if self.reads == 0:
                self.reads += 1
                raise OSError("connection refused")
            await super().read()

    class Kubelet(FakeKubelet):
        async def list(self) -> list[PodResources]:
            listing.set()
            await asyncio.wait_for(reading.wait(), 2)
            return []

    publisher = Publisher()
    task = await run_loop(exp, publisher, Kubelet())
    try:
        await until(lambda: len(publisher.calls) == 1)
    finally:
        await stop(exp, task)
    assert exp.failures == 1 and publisher.reads == 2
    assert publisher.calls[0][1]  # published right after its own read


async def test_resync_verifies_periodically_without_triggers(host: Path) -> None:
    exp = exporter(host, nrt_min_write_interval_seconds=0.0, nrt_resync_seconds=0.2)
    publisher = FakePublisher()
    task = await run_loop(exp, publisher)
    try:
        await until(lambda: len(publisher.calls) >= 4)
    finally:
        await stop(exp, task)
    assert all(verify for _, verify in publisher.calls)


async def test_a_failed_refresh_is_retried_and_verified(host: Path) -> None:
    exp = exporter(host, nrt_min_write_interval_seconds=0.0, nrt_resync_seconds=600.0)
    publisher = FakePublisher(failures=1)
    task = await run_loop(exp, publisher)
    try:
        await until(lambda: len(publisher.calls) >= 2)
    finally:
        await stop(exp, task)
    assert exp.failures == 1 and exp.last_outcome == "unchanged"
    assert publisher.calls[1][1] is True
    assert publisher.calls[1][0] - publisher.calls[0][0] >= 1.0 - 0.01  # backoff


class WritingPublisher:
    """An API server's view: a publish changes the object when the topology or an annotation differs from
    what it holds. Records (monotonic time, verify, annotations) of each publish."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, bool, dict[str, str]]] = []
        self.held: tuple[NodeTopology, dict[str, str]] | None = None
        self._read = False

    async def read(self) -> None:
        self._read = True

    async def publish(
        self, topology: NodeTopology, annotations: Mapping[str, str], *, verify: bool = False
    ) -> str:
        self.calls.append((time.monotonic(), verify or self._read, dict(annotations)))
        self._read = False
        merged = {**(self.held[1] if self.held else {}), **annotations}
        if self.held == (topology, merged):
            return "unchanged"
        outcome = "created" if self.held is None else "replaced"
        self.held = (topology, merged)
        return outcome


class SwitchedKubelet(FakeKubelet):
    """The List answer changes when the test says so."""

    def __init__(self) -> None:
        self.pods: list[PodResources] = []

    async def list(self) -> list[PodResources]:
        return list(self.pods)


async def test_a_change_is_echoed_once_after_the_requeue_delay_and_a_quiet_node_writes_nothing(
    host: Path,
) -> None:
    exp = exporter(
        host, nrt_min_write_interval_seconds=0.0, nrt_resync_seconds=600.0, nrt_requeue_seconds=0.2
    )
    publisher, kubelet = WritingPublisher(), SwitchedKubelet()
    task = await run_loop(exp, publisher, kubelet)  # type: ignore[arg-type]
    try:
        await until(lambda: len(publisher.calls) == 1)
        await asyncio.sleep(0.5)  # the start created the object: no allocation changed, no echo
        assert len(publisher.calls) == 1
        kubelet.pods = [PodResources("ns", "pinned", (ContainerResources("c", frozenset({1})),))]
        exp.poke("kubelet-state:cpu_manager_state")
        await until(lambda: len(publisher.calls) == 3)
        await asyncio.sleep(0.6)  # three more delays: no second echo, the object is settled
        exp.poke("nothing changed")  # a refresh that publishes nothing new arms nothing either
        await asyncio.sleep(0.4)
    finally:
        await stop(exp, task)
    (changed, _, first), (echoed, verify, second) = publisher.calls[1], publisher.calls[2]
    assert echoed - changed >= 0.2 - 0.01 and not verify
    assert second.pop(NRT_REQUEUE_ANNOTATION) and second == first
    assert len(publisher.calls) == 3 and exp.echoes == 1  # the last poke's refresh found nothing to write


async def test_a_burst_of_changes_is_echoed_once_after_the_last(host: Path) -> None:
    exp = exporter(
        host, nrt_min_write_interval_seconds=0.0, nrt_resync_seconds=600.0, nrt_requeue_seconds=0.3
    )
    publisher = WritingPublisher()
    task = await run_loop(exp, publisher, ChangingKubelet())  # type: ignore[arg-type]
    try:
        await until(lambda: len(publisher.calls) == 1)
        for _ in range(4):  # each 0.1 s apart: every change re-arms the echo
            await asyncio.sleep(0.1)
            exp.poke("changed")
        await until(lambda: exp.echoes == 1)
        await asyncio.sleep(0.5)
    finally:
        await stop(exp, task)
    echoes = [t for t, _, annotations in publisher.calls if NRT_REQUEUE_ANNOTATION in annotations]
    changes = [t for t, _, annotations in publisher.calls if NRT_REQUEUE_ANNOTATION not in annotations]
    assert len(echoes) == 1 and len(changes) == 5  # the start and four changes
    assert echoes[0] - changes[-1] >= 0.3 - 0.01
    # Every write, the echo included, says how long the echo waits (rmdctl validate compares it with the
    # scheduler's cache resync).
    assert {annotations[NRT_REQUEUE_SECONDS_ANNOTATION] for _, _, annotations in publisher.calls} == {"0.3"}


class OnceRefusingPublisher(WritingPublisher):
    """Refuses the second publish (the first change's write), as an API server hiccup would."""

    async def publish(
        self, topology: NodeTopology, annotations: Mapping[str, str], *, verify: bool = False
    ) -> str:
        if len(self.calls) == 1:
            self.calls.append((time.monotonic(), verify or self._read, dict(annotations)))
            self._read = False
            raise OSError("connection reset")
        return await super().publish(topology, annotations, verify=verify)


async def test_a_change_written_by_the_retry_after_a_failure_is_echoed(host: Path) -> None:
    exp = exporter(
        host, nrt_min_write_interval_seconds=0.0, nrt_resync_seconds=600.0, nrt_requeue_seconds=0.2
    )
    publisher, kubelet = OnceRefusingPublisher(), SwitchedKubelet()
    task = await run_loop(exp, publisher, kubelet)  # type: ignore[arg-type]
    try:
        await until(lambda: len(publisher.calls) == 1)
        kubelet.pods = [PodResources("ns", "pinned", (ContainerResources("c", frozenset({1})),))]
        exp.poke("kubelet-state:cpu_manager_state")
        await until(lambda: len(publisher.calls) == 3)  # refused, then retried after the backoff (verify)
        await asyncio.sleep(0.5)
    finally:
        await stop(exp, task)
    assert publisher.calls[2][1]  # the retry verifies, and it is what wrote the change
    assert exp.echoes == 1


async def test_no_echo_when_the_requeue_delay_is_zero(host: Path) -> None:
    exp = exporter(
        host, nrt_min_write_interval_seconds=0.0, nrt_resync_seconds=600.0, nrt_requeue_seconds=0.0
    )
    publisher = WritingPublisher()
    task = await run_loop(exp, publisher, ChangingKubelet())  # type: ignore[arg-type]
    try:
        await until(lambda: len(publisher.calls) == 1)
        exp.poke("changed")
        await until(lambda: len(publisher.calls) == 2)
        await asyncio.sleep(0.5)
    finally:
        await stop(exp, task)
    assert len(publisher.calls) == 2 and exp.echoes == 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"node_name": ""}, "node_name is required"),
        ({"nrt_requeue_seconds": -1.0}, "nrt_requeue_seconds must not be negative"),
        ({"nrt_pods_fingerprint_method": "some"}, "nrt_pods_fingerprint_method"),
        ({"nrt_resync_seconds": 0.0}, "nrt_resync_seconds must be positive"),
        ({"nrt_min_write_interval_seconds": -1.0}, "must not be negative"),
    ],
)
def test_bad_settings_are_refused(host: Path, settings: dict[str, Any], message: str) -> None:
    values = {"node_name": "n1", "host_root": host, **settings}
    with pytest.raises(ConfigError, match=message):
        NrtExporter(AgentSettings(**values), api_client_factory=lambda: None)


class FakeEngine:
    def __init__(self, caches: tuple[CacheDomainSummary, ...], held: Sequence[Any] = ()) -> None:
        self.caches = caches
        self.held = list(held)

    async def node(self) -> NodeSummary:
        return NodeSummary("n1", {}, 4, 2, self.caches, 16, 1, 0)

    async def list(self) -> list[Any]:
        return self.held


async def test_engine_provider_reports_the_guaranteed_pool_and_skips_domains_without_one() -> None:
    """Allocatable is the guaranteed pool, free plus held: what the device plugin advertises and the Node's
    capacity shows. (It was the whole cache: on a real node the zone said 11 while the kubelet had 5.) The
    guaranteed workloads' ways come along, for compute_zones to count them once with the pods' devices."""
    holder = SimpleNamespace(
        pool="guaranteed", cache={0: 0b11}, workload=SimpleNamespace(core_ids=frozenset({1}))
    )
    other = SimpleNamespace(
        pool="besteffort", cache={0: 0b100}, workload=SimpleNamespace(core_ids=frozenset({0}))
    )
    engine = FakeEngine(
        (
            CacheDomainSummary(0, frozenset({0, 1}), 11, {"guaranteed": 3, "besteffort": 2, "shared": 2}),
            CacheDomainSummary(1, frozenset({2, 3}), 11, {}),  # no cache allocation on this domain
        ),
        [holder, other],
    )
    assert await engine_l3_provider(engine)() == [  # type: ignore[arg-type]
        CacheWays(0, frozenset({0, 1}), 11, 5, (Holding(frozenset({1}), 2),))
    ]


async def test_the_engine_provider_waits_for_the_engine_to_have_started() -> None:
    """At the agent's start the export begins before the engine has started (what it holds is known only
    then): the provider asks the engine nothing until told the engine has started."""
    asked: list[str] = []

    class Engine:
        async def cache_domains(self) -> tuple[CacheDomainSummary, ...]:
            asked.append("caches")
            return (CacheDomainSummary(0, frozenset({0, 1}), 11, {"guaranteed": 3}),)

        async def list(self) -> list[object]:
            asked.append("list")
            return []

    started = asyncio.Event()
    reading = asyncio.create_task(engine_l3_provider(Engine(), started)())  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert asked == [] and not reading.done()
    started.set()
    assert await reading == [CacheWays(0, frozenset({0, 1}), 11, 3)]
    assert asked == ["caches", "list"]


async def test_sysfs_provider_reports_every_way_free(make_tree: Callable[[Mapping[str, str]], Path]) -> None:
    cache = "sys/devices/system/cpu/cpu{}/cache/index3/"
    files = {"sys/devices/system/cpu/online": "0-1\n"}
    for cpu in (0, 1):
        base = cache.format(cpu)
        files |= {
            base + "level": "3\n",
            base + "id": "0\n",
            base + "shared_cpu_list": "0-1\n",
            base + "ways_of_associativity": "12\n",
            base + "size": "16384K\n",
        }
    assert await sysfs_l3_provider(HostFS(make_tree(files)))() == [CacheWays(0, frozenset({0, 1}), 12, 12)]


# --- what wakes the exporter up, and what a refresh reads (issue 14: idle cost, one refresh per change) ---

POD_UID = "6f1d2c9e-7d3a-4f0a-9b1e-3c2d4e5f6a7b"


class CountingKubelet(FakeKubelet):
    """PodResources answering `pods`, counting List calls."""

    def __init__(self) -> None:
        self.pods: list[PodResources] = []
        self.lists = 0

    async def list(self) -> list[PodResources]:
        self.lists += 1
        return list(self.pods)


@pytest.fixture
def node_host(make_tree: Callable[[Mapping[str, str]], Path]) -> Path:
    """One NUMA node, the kubelet's directory, a cgroup v2 pod root (systemd driver) and the pod logs."""
    return make_tree(
        {
            "sys/devices/system/node/node0/cpulist": "0-1\n",
            "sys/devices/system/node/node0/meminfo": "Node 0 MemTotal:  1048576 kB\n",
            "sys/devices/system/node/node0/distance": "10\n",
            "sys/fs/cgroup/cgroup.controllers": "cpu\n",
            "sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/cgroup.procs": "",
            "sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/cgroup.procs": "",
            "var/lib/kubelet/cpu_manager_state": "{}",
            "var/log/pods/.keep": "",
        }
    )


async def running(
    exp: NrtExporter, kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch
) -> tuple[asyncio.Task[None], FakePublisher]:
    """The whole exporter (its triggers too) with `kubelet` and a fake publisher, after its first refresh."""
    publisher = FakePublisher()
    monkeypatch.setattr(exporter_module, "NrtPublisher", lambda api, node: publisher)
    exp._pods = kubelet  # type: ignore[assignment]
    task = asyncio.create_task(exp.run())
    await until(lambda: exp.refreshes >= 1)
    await asyncio.sleep(0.2)  # the watches are set up
    return task, publisher


async def test_an_idle_exporter_asks_the_kubelet_nothing(
    node_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing changes, so nothing is read: no PodResources List polling (it was most of the idle CPU)."""
    exp = exporter(
        node_host, nrt_poll_seconds=0.02, nrt_min_write_interval_seconds=0.0, nrt_resync_seconds=600
    )
    kubelet = CountingKubelet()
    task, _ = await running(exp, kubelet, monkeypatch)
    try:
        before = kubelet.lists
        await asyncio.sleep(0.5)  # 25 poll intervals
        assert kubelet.lists == before
        assert exp.refreshes == 1
    finally:
        await stop(exp, task)


async def test_a_kubelet_change_is_refreshed_once(node_host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The state file the kubelet replaces wakes the exporter, which reads List once; nothing refreshes the
    same change again a poll later (it did, using up the write interval the next change then waited for)."""
    exp = exporter(
        node_host, nrt_poll_seconds=0.05, nrt_min_write_interval_seconds=0.1, nrt_resync_seconds=600
    )
    kubelet = CountingKubelet()
    task, _ = await running(exp, kubelet, monkeypatch)
    try:
        before = exp.refreshes
        kubelet.pods = [PodResources("ns", "pinned", (ContainerResources("c", frozenset({1})),))]
        write_atomically(node_host / "var/lib/kubelet/cpu_manager_state", '{"entries": 1}')
        await until(lambda: exp.refreshes == before + 1)
        await asyncio.sleep(0.5)
        assert exp.refreshes == before + 1
        assert exp.last_topology is not None and exp.last_topology.zones[0].resources[0].available == 1
    finally:
        await stop(exp, task)


async def test_a_pod_cgroup_and_log_directory_appearing_refresh_the_fingerprint(
    node_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Guaranteed pod without exclusive CPUs changes no state file; its class shows when the kubelet makes
    its cgroup and log directory, which are watched (no polling: the poll interval is an hour here)."""
    exp = exporter(
        node_host, nrt_poll_seconds=3600, nrt_min_write_interval_seconds=0.0, nrt_resync_seconds=3600
    )
    kubelet = CountingKubelet()
    kubelet.pods = [PodResources("ns", "half", (ContainerResources("c", frozenset()),))]
    task, _ = await running(exp, kubelet, monkeypatch)
    try:
        assert exp.last_topology is not None
        empty = exp.last_topology.attribute(fingerprint.ATTRIBUTE)
        (node_host / f"sys/fs/cgroup/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice").mkdir()
        (node_host / f"var/log/pods/ns_half_{POD_UID}").mkdir()
        expected = fingerprint.fingerprint([("ns", "half")])
        await until(
            lambda: (
                exp.last_topology is not None
                and exp.last_topology.attribute(fingerprint.ATTRIBUTE) == expected
            )
        )
        assert empty != expected
    finally:
        await stop(exp, task)


async def test_a_refresh_whose_inputs_did_not_change_computes_nothing(
    node_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sysfs NUMA nodes are read at a verifying refresh only; the same inputs give the same topology object,
    which needs no publishing."""
    reads: list[int] = []
    real = exporter_module.read_numa_nodes
    monkeypatch.setattr(exporter_module, "read_numa_nodes", lambda fs: reads.append(1) or real(fs))
    exp = exporter(node_host)
    kubelet = CountingKubelet()
    first = await exp.snapshot(kubelet)  # type: ignore[arg-type]
    again = await exp.snapshot(kubelet, reasons=frozenset({"kubelet-state:cpu_manager_state"}))  # type: ignore[arg-type]
    assert again is first and len(reads) == 1
    kubelet.pods = [PodResources("ns", "pinned", (ContainerResources("c", frozenset({1})),))]
    changed = await exp.snapshot(kubelet, reasons=frozenset({"kubelet-state:cpu_manager_state"}))  # type: ignore[arg-type]
    assert changed != first and len(reads) == 1
    verified = await exp.snapshot(kubelet)  # type: ignore[arg-type]
    assert verified == changed and len(reads) == 2


async def test_engine_provider_asks_for_the_caches_alone_where_the_engine_can() -> None:
    """The node summary also probes the node's capabilities, most of its cost, at every resync; the cache
    ways need the caches only."""

    class CachesOnly(FakeEngine):
        async def node(self) -> NodeSummary:
            raise AssertionError("node() probes the capabilities")

        async def cache_domains(self) -> tuple[CacheDomainSummary, ...]:
            return self.caches

    engine = CachesOnly((CacheDomainSummary(0, frozenset({0, 1}), 11, {"guaranteed": 3}),))
    assert await engine_l3_provider(engine)() == [CacheWays(0, frozenset({0, 1}), 11, 3)]  # type: ignore[arg-type]
