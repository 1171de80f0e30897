"""The agent's cache-ways device plugin against the simulated kubelet's device manager, over real unix
sockets: registration, ListAndWatch with NUMA topology, re-advertising, kubelet restarts, admission. The
plugin is grpclib, the simulated kubelet and the tests' own clients grpcio: the interop the real kubelet
(grpc-go) needs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from rmd_agent.deviceplugin import CacheWaysPlugin, WayPool
from rmd_agent.deviceplugin.devices import ENV_CACHE_IDS, ENV_DEVICES, ENV_WAYS, numa_nodes_of
from rmd_agent.deviceplugin.pools import read_numa_cpus
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.podresources import PodResourcesClient
from rmd_agent.observe.caches import L3Cache, read_l3_caches
from rmd_api.cpuset import parse_cpu_list
from rmd_api.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from rmd_api.names import CACHE_WAYS_RESOURCE as RESOURCE_NAME
from rmd_sim.hosttree import write_host_tree
from rmd_sim.kubelet import STATE_REL, AdmissionError, ContainerSpec, SimKubelet
from rmd_sim.spec import NodeSpec

# 2 sockets x 4 cores x 2 threads: NUMA node n = socket n = L3 cache id n; CPU 0 reserved.
SPEC = NodeSpec(cores_per_socket=4, reserved_cpus="0")
TIMEOUT = 10.0
_PLUGIN_STUB: Any = api_pb2_grpc.DevicePluginStub
_REGISTRATION_STUB: Any = api_pb2_grpc.RegistrationStub


class Pool:
    """The guaranteed pool as the engine would report it; the test changes `ways` (cache id -> ways)."""

    def __init__(self, caches: list[L3Cache], numa_cpus: dict[int, frozenset[int]], ways: dict[int, int]):
        self.caches = caches
        self.numa_cpus = numa_cpus
        self.ways = dict(ways)
        self.error: Exception | None = None  # raised instead of answering, like a busy engine
        self.calls = 0

    async def __call__(self) -> list[WayPool]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return [
            WayPool(c.id, numa_nodes_of(c.cpus, self.numa_cpus), self.ways.get(c.id, 0)) for c in self.caches
        ]


@pytest.fixture
def host(short_tmp: Path) -> Path:
    root = short_tmp / "host"
    write_host_tree(SPEC, root)
    return root


@pytest.fixture
def pool(host: Path) -> Pool:
    fs = HostFS(host)
    caches = read_l3_caches(fs)
    assert isinstance(caches, list)
    return Pool(caches, read_numa_cpus(fs), {0: 3, 1: 3})


@pytest.fixture
async def kubelet(host: Path) -> AsyncIterator[SimKubelet]:
    # No topology manager: these tests are about the device manager's own accounting and answers (with
    # single-numa-node a shortage is refused earlier, as TopologyAffinityError: test_sim_kubelet_admission).
    async with SimKubelet.from_host_tree(host, device_plugins=True, topology_manager_policy="none") as sim:
        yield sim


@contextlib.asynccontextmanager
async def running(plugin: CacheWaysPlugin) -> AsyncIterator[CacheWaysPlugin]:
    task = asyncio.create_task(plugin.run())
    try:
        yield plugin
    finally:
        plugin.stop()
        await asyncio.wait_for(task, 5)
        assert not plugin.socket_path.exists()  # the plugin removes its socket when it stops


def new_plugin(kubelet: SimKubelet, pool: Pool, **options: Any) -> CacheWaysPlugin:
    assert kubelet.device_manager is not None
    return CacheWaysPlugin(pool, kubelet.device_manager.plugin_dir, watch_seconds=0.05, **options)


async def eventually(probe: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while True:
        value = probe()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def ways_in_kubelet(kubelet: SimKubelet) -> dict[str, frozenset[int]]:
    return {d.id: d.numa_nodes for d in kubelet.devices.get(RESOURCE_NAME, ())}


def numa_of_cache(host: Path) -> dict[int, frozenset[int]]:
    """Independently of the plugin: the NUMA nodes of each L3 cache's CPUs, straight from the sysfs files."""
    result: dict[int, frozenset[int]] = {}
    node_dir = host / "sys/devices/system/node"
    for cache_id in range(SPEC.sockets):
        first_cpu = SPEC.cores_per_socket * cache_id  # Linux numbering: socket s starts at s * cores
        index3 = host / f"sys/devices/system/cpu/cpu{first_cpu}/cache/index3"
        assert int((index3 / "id").read_text()) == cache_id
        cpus = parse_cpu_list((index3 / "shared_cpu_list").read_text())
        result[cache_id] = frozenset(
            int(n.name[4:])
            for n in node_dir.glob("node*")
            if parse_cpu_list((n / "cpulist").read_text()) & cpus
        )
    return result


def guaranteed(name: str, cpu: str, ways: int = 0) -> ContainerSpec:
    extra = {RESOURCE_NAME: ways} if ways else {}
    return ContainerSpec(name, cpu, cpu, "1Gi", "1Gi", extra)


# --- registration and ListAndWatch ---


async def test_plugin_registers_and_the_kubelet_gets_one_device_per_way_with_numa_topology(
    kubelet: SimKubelet, pool: Pool, host: Path
) -> None:
    async with running(new_plugin(kubelet, pool)) as plugin:
        devices = await eventually(lambda: ways_in_kubelet(kubelet), "devices in the kubelet")

        assert plugin.registrations == 1
        assert kubelet.device_manager is not None
        assert kubelet.device_manager.resources() == [RESOURCE_NAME]
        expected_numa = numa_of_cache(host)
        assert expected_numa == {0: {0}, 1: {1}}
        assert devices == {f"l3-{c}-way-{w}": expected_numa[c] for c in (0, 1) for w in range(3)}

        # What the plugin sends on the wire, read by a client of our own.
        async with grpc.aio.insecure_channel(f"unix://{plugin.socket_path}") as channel:
            stub = _PLUGIN_STUB(channel)
            options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=2)
            stream = stub.ListAndWatch(api_pb2.Empty())
            first = await asyncio.wait_for(stream.read(), 2)
            stream.cancel()
        assert options.get_preferred_allocation_available and not options.pre_start_required
        assert {(d.ID, d.health, tuple(n.ID for n in d.topology.nodes)) for d in first.devices} == {
            (f"l3-{c}-way-{w}", "Healthy", (c,)) for c in (0, 1) for w in range(3)
        }

        # The kubelet reports them as allocatable through PodResources, one entry per device and NUMA node.
        async with PodResourcesClient(kubelet.socket_path) as client:
            allocatable = await client.get_allocatable()
        reported = {(d.ids, d.numa_nodes) for d in allocatable.devices if d.resource == RESOURCE_NAME}
        assert reported == {((i,), n) for i, n in devices.items()}


@pytest.mark.parametrize("how", ["notify", "poll"])
async def test_a_pool_change_is_advertised_again(kubelet: SimKubelet, pool: Pool, how: str) -> None:
    refresh = 0.1 if how == "poll" else 60.0
    async with running(new_plugin(kubelet, pool, refresh_seconds=refresh)) as plugin:
        await eventually(lambda: len(ways_in_kubelet(kubelet)) == 6, "6 ways")

        pool.ways = {0: 1, 1: 4}
        if how == "notify":
            plugin.notify()

        await eventually(lambda: len(ways_in_kubelet(kubelet)) == 5, "the new pool")
        assert set(ways_in_kubelet(kubelet)) == {"l3-0-way-0"} | {f"l3-1-way-{w}" for w in range(4)}
        assert plugin.registrations == 1  # a new list on the same stream, not a new registration


async def test_provider_failure_keeps_the_last_list(kubelet: SimKubelet, pool: Pool) -> None:
    plugin = new_plugin(kubelet, pool, refresh_seconds=0.05)
    async with running(plugin):
        await eventually(lambda: len(ways_in_kubelet(kubelet)) == 6, "6 ways")
        calls = pool.calls

        pool.error = OSError("resctrl is not mounted")
        await eventually(lambda: pool.calls >= calls + 3, "a few failed refreshes")
        assert len(ways_in_kubelet(kubelet)) == 6
        assert len(plugin.devices) == 6


async def test_plugin_reregisters_after_a_kubelet_restart(kubelet: SimKubelet, pool: Pool) -> None:
    async with running(new_plugin(kubelet, pool)) as plugin:
        await eventually(lambda: plugin.registrations == 1 and ways_in_kubelet(kubelet), "registration")
        assert plugin.registered

        await kubelet.stop()
        await kubelet.start()  # a new kubelet wipes the directory, the plugin's socket included
        assert kubelet.device_manager is not None and kubelet.device_manager.resources() == []

        await eventually(lambda: plugin.registrations == 2, "a second registration")
        await eventually(lambda: len(ways_in_kubelet(kubelet)) == 6, "the devices again")
        assert plugin.socket_path.exists()


async def test_a_kubelet_restart_is_noticed_at_once_without_polling(kubelet: SimKubelet, pool: Pool) -> None:
    """The directory is watched (inotify), not polled: with checks 30 s apart the plugin still registers
    with a restarted kubelet at once."""
    assert kubelet.device_manager is not None
    plugin = CacheWaysPlugin(pool, kubelet.device_manager.plugin_dir, watch_seconds=30.0)
    async with running(plugin):
        await eventually(lambda: plugin.registrations == 1 and ways_in_kubelet(kubelet), "registration")
        await kubelet.stop()
        await kubelet.start()
        restarted = time.monotonic()
        await eventually(lambda: plugin.registrations == 2, "a second registration")
        assert time.monotonic() - restarted < 2.0
        await eventually(lambda: len(ways_in_kubelet(kubelet)) == 6, "the devices again")


async def test_a_plugin_that_goes_away_leaves_unhealthy_devices(kubelet: SimKubelet, pool: Pool) -> None:
    async with running(new_plugin(kubelet, pool)):
        await eventually(lambda: len(ways_in_kubelet(kubelet)) == 6, "6 ways")

    await eventually(lambda: not kubelet.devices[RESOURCE_NAME], "no healthy device")
    assert len(kubelet.unhealthy_devices()[RESOURCE_NAME]) == 6  # still in the capacity
    with pytest.raises(AdmissionError, match="Requested: 1, Available: 0"):
        await kubelet.admit_pod("ns", "p", "uid-p", [guaranteed("app", "1", ways=1)])


async def test_stopping_the_plugin_ends_list_and_watch_with_unavailable_and_logs_no_error(
    kubelet: SimKubelet, pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """grpclib cancels the running handlers when the server closes; the plugin then ends its ListAndWatch
    streams with a status, so a client hears that the plugin is gone, and nothing is logged as an error (a
    client that goes away first is no error either)."""
    caplog.set_level(logging.INFO)
    plugin = new_plugin(kubelet, pool)
    async with running(plugin):
        await eventually(lambda: plugin.registrations == 1, "registration")
        async with grpc.aio.insecure_channel(f"unix://{plugin.socket_path}") as channel:
            stub = _PLUGIN_STUB(channel)
            leaving = stub.ListAndWatch(api_pb2.Empty())
            staying = stub.ListAndWatch(api_pb2.Empty())
            for stream in (leaving, staying):
                assert len((await asyncio.wait_for(stream.read(), 2)).devices) == 6
            leaving.cancel()
            await asyncio.sleep(0.1)  # the plugin sees the reset

            plugin.stop()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(staying.read(), 2)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.value.details() == "device plugin stopped"
    noisy = [
        r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith(("grpclib", "rmd_"))
    ]
    assert noisy == []


async def test_a_refused_registration_is_logged_once_with_the_kubelets_reason_and_retried(
    kubelet: SimKubelet, pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="rmd_agent.deviceplugin.plugin")
    plugin = new_plugin(kubelet, pool, resource_name="kubernetes.io/ways")
    async with running(plugin):
        failures = lambda: [r for r in caplog.records if "failed, will retry" in r.getMessage()]  # noqa: E731
        await eventually(lambda: len(failures()) >= 3, "a few attempts")
        assert not plugin.registered and plugin.registrations == 0
    first, *retries = failures()
    assert first.levelno == logging.WARNING
    assert first.getMessage() == (
        f"registration with {plugin.kubelet_socket} failed, will retry: "
        "invalid extended resource name 'kubernetes.io/ways'"
    )
    assert {r.levelno for r in retries} == {logging.DEBUG}  # once per kubelet socket


@pytest.mark.parametrize(
    ("kubelet_socket", "reason"),
    [("silent", "Deadline exceeded"), ("stale", "[Errno 111] Connection refused")],
)
async def test_registration_with_a_kubelet_socket_that_does_not_answer_is_retried_every_watch_seconds(
    short_tmp: Path, pool: Pool, caplog: pytest.LogCaptureFixture, kubelet_socket: str, reason: str
) -> None:
    """A kubelet that accepts the connection but never answers fails the call at the deadline; a socket
    left behind by a dead kubelet refuses it at once. Either way the plugin logs why and tries again every
    watch_seconds: not at once, as its own server's socket, made anew for each try, used to wake it (a busy
    loop, which on grpclib, where the refusal comes without a pause, starved the event loop)."""
    caplog.set_level(logging.DEBUG, logger="rmd_agent.deviceplugin.plugin")
    plugin_dir = short_tmp / "device-plugins"
    plugin_dir.mkdir()
    kubelet_sock = plugin_dir / "kubelet.sock"
    failures = lambda: [r for r in caplog.records if "failed, will retry" in r.getMessage()]  # noqa: E731
    with socket.socket(socket.AF_UNIX) as kubelet:
        kubelet.bind(str(kubelet_sock))
        if kubelet_socket == "silent":
            kubelet.listen()  # never accepted nor answered
        else:
            kubelet.close()  # the file stays, nobody listens
        plugin = CacheWaysPlugin(pool, plugin_dir, watch_seconds=0.05, timeout=0.3)
        async with running(plugin):
            await eventually(lambda: len(failures()) >= 2, "two attempts")
            before = len(failures())
            await asyncio.sleep(0.5)
            attempts = len(failures()) - before
            kubelet_sock.unlink()  # so that even a busy loop lets the plugin stop
            assert not plugin.registered
    assert attempts <= 0.5 / 0.05 + 2
    first, *retries = failures()
    assert (first.levelno, first.getMessage()) == (
        logging.WARNING,
        f"registration with {kubelet_sock} failed, will retry: {reason}",
    )
    assert {r.levelno for r in retries} == {logging.DEBUG}


async def test_stop_returns_at_once_even_with_the_directory_changing(kubelet: SimKubelet, pool: Pool) -> None:
    """On Python 3.11 a cancellation that meets the end of the awaited `wait_for` is lost: the loops must
    still see the stop, not go on to their next wait (recheck_seconds, refresh_seconds)."""
    assert kubelet.device_manager is not None
    plugin_dir = kubelet.device_manager.plugin_dir
    for attempt in range(5):
        plugin = new_plugin(kubelet, pool)
        task = asyncio.create_task(plugin.run())
        await eventually(lambda: plugin.registered, "registration")  # noqa: B023
        (plugin_dir / f"other-{attempt}.sock").touch()  # an event for the watch, as the stop comes
        plugin.notify()
        plugin.stop()
        await asyncio.wait_for(task, 2)


async def test_register_refuses_a_wrong_version_or_resource_name(kubelet: SimKubelet) -> None:
    assert kubelet.device_manager is not None
    socket = kubelet.device_manager.socket_path
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = _REGISTRATION_STUB(channel)
        for version, resource, message in [
            ("v1alpha", RESOURCE_NAME, "not supported"),
            ("v1beta1", "l3_cache_ways", "invalid extended resource name"),
            ("v1beta1", "kubernetes.io/ways", "invalid extended resource name"),
            ("v1beta1", RESOURCE_NAME, "failed to dial"),  # nobody serves the endpoint
        ]:
            request = api_pb2.RegisterRequest(version=version, endpoint="x.sock", resource_name=resource)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Register(request, timeout=5)
            assert info.value.code() == grpc.StatusCode.UNKNOWN
            assert message in str(info.value.details())
    assert kubelet.device_manager.resources() == []


# --- the plugin's process ---

# Run in a child process (this one runs grpcio for the simulated kubelet): a plugin registers with the
# kubelet at argv[1], serves until a line comes on stdin, then prints its threads' names and the gRPC modules
# it loaded as JSON and stops.
PLUGIN_PROCESS = r"""
import asyncio, json, sys
from pathlib import Path

from rmd_agent.deviceplugin import CacheWaysPlugin, WayPool


async def pools():
    return [WayPool(0, frozenset({0}), 3), WayPool(1, frozenset({1}), 3)]


async def main():
    plugin = CacheWaysPlugin(pools, Path(sys.argv[1]), watch_seconds=0.05)
    task = asyncio.create_task(plugin.run())
    stdin = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin
    )
    await stdin.readline()
    threads = sorted((task / "comm").read_text().strip() for task in Path("/proc/self/task").iterdir())
    grpc = sorted(m for m in sys.modules if m.partition(".")[0] == "grpc" or m.endswith("_pb2_grpc"))
    print(json.dumps({"threads": threads, "grpc": grpc}), flush=True)
    plugin.stop()
    await task


asyncio.run(main())
"""


async def test_the_plugin_process_runs_no_grpc_core_threads(kubelet: SimKubelet) -> None:
    """Issue #14: grpcio's core threads (event_engine, grpc_global_timer) wake ~1,700 times a minute in an
    idle agent; on grpclib the plugin serves from the event loop, so its process has none of them."""
    assert kubelet.device_manager is not None
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PLUGIN_PROCESS,
        str(kubelet.device_manager.plugin_dir),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        await eventually(lambda: len(ways_in_kubelet(kubelet)) == 6, "the child's 6 ways")
        # Served every kind of call: Register, GetDevicePluginOptions, ListAndWatch, GetPreferredAllocation
        # and Allocate (admission).
        pod = await kubelet.admit_pod("ns", "p", "uid-p", [guaranteed("app", "1", ways=2)])
        assert pod.envs["app"][ENV_WAYS] == "2"
        child.stdin.write(b"report\n")
        report = json.loads(await asyncio.wait_for(child.stdout.readline(), TIMEOUT))
        assert await asyncio.wait_for(child.wait(), TIMEOUT) == 0
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert [t for t in report["threads"] if t.startswith(("event_engine", "grpc_global_tim"))] == []
    await eventually(lambda: not kubelet.devices[RESOURCE_NAME], "the stopped child's devices unhealthy")


# --- admission ---


async def test_admission_takes_ways_of_the_cache_next_to_the_container_cpus(
    kubelet: SimKubelet, pool: Pool, host: Path
) -> None:
    async with running(new_plugin(kubelet, pool)):
        await eventually(lambda: len(ways_in_kubelet(kubelet)) == 6, "6 ways")
        numa_of = {c: n for c, nodes in numa_of_cache(host).items() for n in nodes}
        cache_of_numa = {n: c for c, n in numa_of.items()}

        # Fill NUMA node 0 (7 CPUs besides the reserved one), so the next pod's CPUs are on node 1.
        filler = await kubelet.admit_pod("ns", "filler", "uid-filler", [guaranteed("app", "7")])
        pod = await kubelet.admit_pod("ns", "web", "uid-web", [guaranteed("app", "2", ways=2)])

        cpu_numa = {kubelet.topology.cpu(c).numa for c in pod.cpus["app"]}
        assert cpu_numa == {1}
        assert {kubelet.topology.cpu(c).numa for c in filler.cpus["app"]} == {0}
        ways = pod.devices["app"][RESOURCE_NAME]
        assert len(ways) == 2
        assert {d.numa_nodes for d in ways} == {frozenset(cpu_numa)}
        ids = sorted(d.id for d in ways)
        assert all(i.startswith(f"l3-{cache_of_numa[1]}-way-") for i in ids)
        # What the plugin's Allocate answered is what the container gets.
        assert pod.envs["app"] == {
            ENV_WAYS: "2",
            ENV_DEVICES: ",".join(ids),
            ENV_CACHE_IDS: str(cache_of_numa[1]),
        }

        async with PodResourcesClient(kubelet.socket_path) as client:
            listed = await client.get("ns", "web")
        assert listed is not None
        (container,) = listed.containers
        assert container.cpu_ids == pod.cpus["app"]
        assert {(d.resource, d.ids, d.numa_nodes) for d in container.devices} == {
            (RESOURCE_NAME, (i,), frozenset(cpu_numa)) for i in ids
        }


async def test_ways_taken_are_not_given_twice_and_come_back_on_removal(
    kubelet: SimKubelet, pool: Pool
) -> None:
    async with running(new_plugin(kubelet, pool)):
        await eventually(lambda: len(ways_in_kubelet(kubelet)) == 6, "6 ways")
        a = await kubelet.admit_pod("ns", "a", "uid-a", [guaranteed("app", "1", ways=3)])
        b = await kubelet.admit_pod("ns", "b", "uid-b", [guaranteed("app", "1", ways=3)])
        taken = [d.id for p in (a, b) for d in p.devices["app"][RESOURCE_NAME]]
        assert sorted(taken) == sorted(ways_in_kubelet(kubelet))  # all six, none twice

        with pytest.raises(AdmissionError, match="Requested: 1, Available: 0"):
            await kubelet.admit_pod("ns", "c", "uid-c", [guaranteed("app", "1", ways=1)])

        kubelet.remove_pod("uid-a")
        c = await kubelet.admit_pod("ns", "c", "uid-c", [guaranteed("app", "1", ways=3)])
        assert {d.id for d in c.devices["app"][RESOURCE_NAME]} == {
            d.id for d in a.devices["app"][RESOURCE_NAME]
        }


async def test_a_pod_asking_for_more_ways_than_exist_is_rejected_without_a_trace(
    kubelet: SimKubelet, pool: Pool
) -> None:
    async with running(new_plugin(kubelet, pool)):
        await eventually(lambda: len(ways_in_kubelet(kubelet)) == 6, "6 ways")
        state_before = (kubelet.host_root / STATE_REL).read_text()

        with pytest.raises(AdmissionError, match="Requested: 7, Available: 6") as info:
            await kubelet.admit_pod("ns", "big", "uid-big", [guaranteed("app", "2", ways=7)])

        assert info.value.reason == "UnexpectedAdmissionError"
        assert kubelet.pods == []
        assert (kubelet.host_root / STATE_REL).read_text() == state_before


async def test_allocate_of_a_device_the_plugin_no_longer_has_rejects_the_pod(
    kubelet: SimKubelet, pool: Pool
) -> None:
    plugin = new_plugin(kubelet, pool)
    async with running(plugin):
        await eventually(lambda: len(ways_in_kubelet(kubelet)) == 6, "6 ways")
        # The pool shrinks in the plugin; admission picks its devices before the kubelet can hear of it
        # (no await in between), so Allocate names ways the plugin no longer has.
        pool.ways = {0: 0, 1: 0}
        assert await plugin.refresh()
        assert len(ways_in_kubelet(kubelet)) == 6
        with pytest.raises(AdmissionError, match=r"Allocate failed due to .*not advertised by this plugin"):
            await kubelet.admit_pod("ns", "late", "uid-late", [guaranteed("app", "1", ways=1)])
        assert kubelet.pods == []


async def test_preferred_allocation_and_allocate_answers_on_the_wire(kubelet: SimKubelet, pool: Pool) -> None:
    async with running(new_plugin(kubelet, pool)) as plugin:
        await eventually(lambda: plugin.registrations == 1, "registration")
        async with grpc.aio.insecure_channel(f"unix://{plugin.socket_path}") as channel:
            stub = _PLUGIN_STUB(channel)
            preferred = await stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=["l3-0-way-2", "l3-1-way-0", "l3-1-way-1", "l3-1-way-2"],
                            allocation_size=2,
                        )
                    ]
                ),
                timeout=2,
            )
            allocated = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(devices_ids=["l3-1-way-2", "l3-1-way-0"]),
                        api_pb2.ContainerAllocateRequest(devices_ids=["l3-0-way-0"]),
                    ]
                ),
                timeout=2,
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Allocate(
                    api_pb2.AllocateRequest(
                        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["l3-7-way-0"])]
                    ),
                    timeout=2,
                )
    # Both from the cache that offers the most ways, so the container's ways sit in one cache.
    assert list(preferred.container_responses[0].deviceIDs) == ["l3-1-way-0", "l3-1-way-1"]
    assert [dict(r.envs) for r in allocated.container_responses] == [
        {ENV_WAYS: "2", ENV_DEVICES: "l3-1-way-0,l3-1-way-2", ENV_CACHE_IDS: "1"},
        {ENV_WAYS: "1", ENV_DEVICES: "l3-0-way-0", ENV_CACHE_IDS: "0"},
    ]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "l3-7-way-0" in str(info.value.details())
