"""The agent's PodResources client against the simulated kubelet, over a real unix socket."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpclib.const import Status

from rmd_agent.errors import KubeletUnavailable
from rmd_agent.kubelet.pod_lookup import LookupApi, PodLookup
from rmd_agent.kubelet.podresources import (
    GET_DISABLED_MESSAGE,
    AllocatableResources,
    DeviceAssignment,
    GetUnavailable,
    PodResources,
    PodResourcesCallFailed,
    PodResourcesClient,
    get_unavailable,
)
from rmd_api.cpuset import format_cpu_list, parse_cpu_list
from rmd_api.kubelet.checkpoint import decode_cpu_manager_state
from rmd_api.kubelet.podresources.v1 import api_pb2
from rmd_sim.hosttree import write_host_tree as write_generated_tree
from rmd_sim.kubelet import (
    STATE_REL,
    AdmissionError,
    ContainerSpec,
    Device,
    SimKubelet,
    parse_quantity,
    qos_class,
    read_topology,
)
from rmd_sim.kubelet_cli import add_kubelet_command, run_kubelet_command
from rmd_sim.spec import NodeSpec

# Two sockets, each one NUMA node with two cores of two threads; Linux numbering puts the siblings of
# cpus 0-3 at 4-7, so core (socket s, core c) = {2s + c, 2s + c + 4}.
SOCKETS, CORES, THREADS = 2, 2, 2
ALL_CPUS = frozenset(range(SOCKETS * CORES * THREADS))
RESERVED = frozenset({0, 4})  # one whole core on NUMA node 0


def core_of(cpu: int) -> tuple[int, int]:
    first = cpu % (SOCKETS * CORES)
    return first // CORES, first % CORES


def write_host_tree(root: Path) -> None:
    for cpu in sorted(ALL_CPUS):
        socket, core = core_of(cpu)
        topo = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{socket}\n")
        (topo / "core_id").write_text(f"{core}\n")
    (root / "sys/devices/system/cpu/online").write_text(f"0-{len(ALL_CPUS) - 1}\n")
    for node in range(SOCKETS):
        node_dir = root / f"sys/devices/system/node/node{node}"
        node_dir.mkdir(parents=True)
        (node_dir / "cpulist").write_text(
            format_cpu_list(c for c in ALL_CPUS if core_of(c)[0] == node) + "\n"
        )
    config = root / "var/lib/kubelet/config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(f'cpuManagerPolicy: static\nreservedSystemCPUs: "{format_cpu_list(RESERVED)}"\n')


@pytest.fixture
def host_root() -> Iterator[Path]:
    # Unix socket paths must fit in 108 bytes; pytest's tmp_path can be longer.
    root = Path(tempfile.mkdtemp(prefix="rmdpr", dir="/tmp"))
    write_host_tree(root)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def kubelet(host_root: Path) -> AsyncIterator[SimKubelet]:
    async with SimKubelet.from_host_tree(host_root) as sim:
        yield sim


@pytest.fixture
async def client(kubelet: SimKubelet) -> AsyncIterator[PodResourcesClient]:
    async with PodResourcesClient(kubelet.socket_path, timeout=2.0) as c:
        yield c


def guaranteed(name: str, cpu: str, memory: str = "1Gi") -> ContainerSpec:
    return ContainerSpec(name, cpu_request=cpu, cpu_limit=cpu, memory_request=memory, memory_limit=memory)


def by_name(pods: list[PodResources]) -> dict[str, PodResources]:
    return {p.name: p for p in pods}


def read_state(root: Path) -> tuple[str, frozenset[int], dict[str, dict[str, frozenset[int]]]]:
    path = root / STATE_REL
    state = decode_cpu_manager_state(path.read_text(), str(path))  # raises on a checksum mismatch
    assert (state.format_version, state.verified) == ("v2", True)
    entries = {
        uid: {name: parse_cpu_list(cpus) for name, cpus in containers.items()}
        for uid, containers in state.entries.items()
    }
    return state.policy_name, parse_cpu_list(state.default_cpu_set), entries


# --- the host tree and the kubelet config are what the simulator uses ---


def test_topology_is_read_from_the_host_tree(host_root: Path) -> None:
    topology = read_topology(host_root)
    assert topology.ids == ALL_CPUS
    assert set(topology.cores.values()) == {frozenset({c, c + 4}) for c in range(4)}
    assert topology.numa_nodes == {0: frozenset({0, 1, 4, 5}), 1: frozenset({2, 3, 6, 7})}
    sim = SimKubelet.from_host_tree(host_root)
    assert sim.reserved == RESERVED
    assert sim.policy == "static"


def test_topology_and_config_of_the_generated_host_tree(tmp_path: Path) -> None:
    spec = NodeSpec.default()
    write_generated_tree(spec, tmp_path / "node")
    sim = SimKubelet.from_host_tree(tmp_path / "node")
    topology = sim.topology
    assert len(topology.ids) == spec.sockets * spec.cores_per_socket * spec.threads_per_core
    assert len(topology.sockets) == spec.sockets
    assert len(topology.numa_nodes) == spec.numa_nodes
    assert topology.threads_per_core == spec.threads_per_core
    assert sim.reserved == parse_cpu_list(spec.reserved_cpus)
    assert sim.policy == spec.cpu_manager_policy


def test_subcommand_registers_on_a_parser(host_root: Path) -> None:
    parser = argparse.ArgumentParser()
    add_kubelet_command(parser.add_subparsers())
    args = parser.parse_args(["kubelet", "--host-root", str(host_root), "--reserved-cpus", "0-1"])
    assert args.run is run_kubelet_command
    assert (args.host_root, args.reserved_cpus, args.socket) == (host_root, "0-1", None)


# --- List ---


async def test_list_reports_only_exclusive_cpus_of_guaranteed_integer_containers(
    kubelet: SimKubelet, client: PodResourcesClient
) -> None:
    assert await client.list() == []
    kubelet.add_pod("default", "pinned", "uid-pinned", [guaranteed("app", "2"), guaranteed("side", "250m")])
    kubelet.add_pod("default", "fractional", "uid-frac", [guaranteed("app", "1500m")])
    kubelet.add_pod("default", "burstable", "uid-burst", [("app", "1", "2", "1Gi")])
    kubelet.add_pod("other", "besteffort", "uid-be", [ContainerSpec("app")])

    pods = by_name(await client.list())

    assert set(pods) == {"pinned", "fractional", "burstable", "besteffort"}
    assert pods["besteffort"].namespace == "other"
    pinned = {c.name: c for c in pods["pinned"].containers}
    assert len(pinned["app"].cpu_ids) == 2
    assert not pinned["app"].cpu_ids & RESERVED
    assert pinned["app"].cpu_ids == kubelet.find_pod("default", "pinned").cpus["app"]  # type: ignore[union-attr]
    assert pinned["side"].cpu_ids == frozenset()  # fractional container of a Guaranteed pod shares the pool
    for name in ("fractional", "burstable", "besteffort"):
        assert [c.cpu_ids for c in pods[name].containers] == [frozenset()], name


async def test_an_unchanged_list_is_not_converted_again(
    kubelet: SimKubelet, client: PodResourcesClient
) -> None:
    """Converting 500 pods into dataclasses was most of a refresh's CPU: the same answer gives the same
    objects, and after a change only the pods that changed are new."""
    kubelet.add_pod("ns", "a", "uid-a", [guaranteed("c", "1")])
    kubelet.add_pod("ns", "b", "uid-b", [ContainerSpec("c")])
    first = by_name(await client.list())
    again = by_name(await client.list())
    assert all(again[name] is first[name] for name in first)
    kubelet.add_pod("ns", "c", "uid-c", [ContainerSpec("c")])
    third = by_name(await client.list())
    assert third["a"] is first["a"] and third["b"] is first["b"]
    assert third["c"] == PodResources("ns", "c", (dataclasses.replace(third["c"].containers[0]),))
    kubelet.remove_pod("uid-a")
    assert sorted(by_name(await client.list())) == ["b", "c"]


async def test_list_drops_removed_pods_and_their_cpus_return_to_the_pool(
    kubelet: SimKubelet, client: PodResourcesClient
) -> None:
    kubelet.add_pod("ns", "a", "uid-a", [guaranteed("app", "2")])
    kubelet.add_pod("ns", "b", "uid-b", [guaranteed("app", "2")])
    cpus_a = by_name(await client.list())["a"].containers[0].cpu_ids

    kubelet.remove_pod("uid-a")

    assert set(by_name(await client.list())) == {"b"}
    assert cpus_a <= kubelet.shared_pool()
    # The freed CPUs can be pinned again: c takes every CPU that is neither reserved nor b's.
    kubelet.add_pod("ns", "c", "uid-c", [guaranteed("app", "4")])
    cpus_b = kubelet.assignments()[("uid-b", "app")]
    assert by_name(await client.list())["c"].containers[0].cpu_ids == ALL_CPUS - RESERVED - cpus_b


async def test_pod_that_does_not_fit_is_rejected_without_a_trace(
    kubelet: SimKubelet, client: PodResourcesClient
) -> None:
    kubelet.add_pod("ns", "a", "uid-a", [guaranteed("app", "4")])
    state_before = (kubelet.host_root / STATE_REL).read_text()
    with pytest.raises(AdmissionError, match="not enough cpus"):
        kubelet.add_pod("ns", "b", "uid-b", [guaranteed("one", "1"), guaranteed("two", "2")])
    assert set(by_name(await client.list())) == {"a"}
    assert (kubelet.host_root / STATE_REL).read_text() == state_before


# --- GetAllocatableResources ---


async def test_allocatable_is_all_cpus_minus_reserved_and_ignores_allocations(
    kubelet: SimKubelet, client: PodResourcesClient
) -> None:
    assert await client.get_allocatable() == AllocatableResources(cpu_ids=ALL_CPUS - RESERVED)
    kubelet.add_pod("ns", "a", "uid-a", [guaranteed("app", "2")])
    assert (await client.get_allocatable()).cpu_ids == ALL_CPUS - RESERVED


async def test_policy_none_pins_nothing_and_allocates_nothing(host_root: Path) -> None:
    async with SimKubelet.from_host_tree(host_root, cpu_manager_policy="none") as sim:
        sim.add_pod("ns", "a", "uid-a", [guaranteed("app", "2")])
        async with PodResourcesClient(sim.socket_path) as client:
            assert (await client.get_allocatable()).cpu_ids == frozenset()
            assert (await client.list())[0].containers[0].cpu_ids == frozenset()
    assert read_state(host_root) == ("none", frozenset(), {})


# --- Get ---


@pytest.mark.parametrize(
    "not_found_code",
    # NOT_FOUND as asked of the simulator; UNKNOWN is what the real kubelet's plain Go error becomes.
    [grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNKNOWN],
)
async def test_get_returns_one_pod_or_none(host_root: Path, not_found_code: grpc.StatusCode) -> None:
    async with SimKubelet.from_host_tree(host_root, not_found_code=not_found_code) as sim:
        sim.add_pod("ns", "web", "uid-web", [guaranteed("app", "1")])
        sim.add_pod("ns", "db", "uid-db", [guaranteed("app", "2")])
        async with PodResourcesClient(sim.socket_path) as client:
            web = await client.get("ns", "web")
            assert web is not None
            assert (web.namespace, web.name) == ("ns", "web")
            assert web.containers[0].cpu_ids == sim.find_pod("ns", "web").cpus["app"]  # type: ignore[union-attr]
            assert await client.get("ns", "missing") is None
            assert await client.get("elsewhere", "web") is None


async def test_get_disabled_raises_get_unavailable_with_the_kubelets_answer(host_root: Path) -> None:
    # Kubelets with the KubeletPodResourcesGet gate off answer Get with a plain (UNKNOWN) error.
    async with SimKubelet.from_host_tree(host_root, get_enabled=False) as sim:
        sim.add_pod("ns", "web", "uid-web", [guaranteed("app", "1")])
        async with PodResourcesClient(sim.socket_path) as client:
            with pytest.raises(GetUnavailable, match="Get method disabled") as info:
                await client.get("ns", "web")
            assert len(await client.list()) == 1  # List still answers
    assert info.value.code == Status.UNKNOWN
    assert info.value.details == GET_DISABLED_MESSAGE == "PodResources API Get method disabled"
    assert isinstance(info.value, PodResourcesCallFailed)  # callers catching that still do


@pytest.mark.parametrize(
    ("code", "details", "unavailable"),
    [
        # kubelet 1.27-1.35 with the gate off: fmt.Errorf in server_v1.go, UNKNOWN over the wire
        (Status.UNKNOWN, "PodResources API Get method disabled", True),
        # kubelet before 1.27: no such method (grpc-go's answer)
        (Status.UNIMPLEMENTED, "unknown method Get for service v1.PodResourcesLister", True),
        # everything else is a real failure, not "no Get"
        (Status.UNKNOWN, "pod web in namespace ns not found", False),
        (Status.UNKNOWN, "PodResources API GetAllocatableResources disabled", False),
        (Status.UNKNOWN, "", False),
        (Status.INTERNAL, "PodResources API Get method disabled", False),
        (Status.RESOURCE_EXHAUSTED, "rejected by rate limit", False),
        (Status.UNAVAILABLE, "connection refused", False),
        (Status.DEADLINE_EXCEEDED, "Deadline Exceeded", False),
    ],
)
def test_only_the_no_get_answers_count_as_get_unavailable(
    code: Status, details: str, unavailable: bool
) -> None:
    assert get_unavailable(code, details) is unavailable


# --- PodLookup: Get, or List where the kubelet has no Get ---


class CountingClient(PodResourcesClient):
    """Counts the calls PodLookup makes."""

    def __init__(self, socket_path: Path, timeout: float = 2.0) -> None:
        super().__init__(socket_path, timeout)
        self.calls: list[str] = []

    async def list(self) -> list[PodResources]:
        self.calls.append("List")
        return await super().list()

    async def get(self, namespace: str, name: str) -> PodResources | None:
        self.calls.append("Get")
        return await super().get(namespace, name)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_lookup_uses_get_where_the_kubelet_offers_it(kubelet: SimKubelet) -> None:
    kubelet.add_pod("ns", "web", "uid-web", [guaranteed("app", "2")])
    async with CountingClient(kubelet.socket_path) as client:
        lookup = PodLookup(client)
        assert lookup.api == LookupApi(None) and lookup.api.describe() == "not known yet"
        found = await lookup.find("ns", "web")
        assert found is not None and found.containers[0].cpu_ids == kubelet.find_pod("ns", "web").cpus["app"]  # type: ignore[union-attr]
        assert await lookup.find("ns", "missing") is None
        assert client.calls == ["Get", "Get"]
        assert lookup.api == LookupApi(True) and lookup.api.describe() == "Get"


async def test_lookup_falls_back_to_list_and_remembers_it(host_root: Path) -> None:
    clock = Clock()
    sim = SimKubelet.from_host_tree(host_root, get_enabled=False)
    async with sim, CountingClient(sim.socket_path) as client:
        sim.add_pod("ns", "web", "uid-web", [guaranteed("app", "2")])
        sim.add_pod("other", "web", "uid-other", [guaranteed("app", "1")])
        lookup = PodLookup(client, recheck_seconds=600, clock=clock)
        found = await lookup.find("ns", "web")
        assert found is not None and (found.namespace, found.name) == ("ns", "web")
        assert found.containers[0].cpu_ids == sim.find_pod("ns", "web").cpus["app"]  # type: ignore[union-attr]
        assert client.calls == ["Get", "List"]
        assert lookup.api == LookupApi(False, "PodResources API Get method disabled")
        assert lookup.api.describe() == "List (Get disabled: PodResources API Get method disabled)"
        # Later lookups go straight to List, and a pod it does not list is not there.
        client.calls.clear()
        assert await lookup.find("ns", "missing") is None
        other = await lookup.find("other", "web")
        assert other is not None and other.namespace == "other"
        assert client.calls == ["List", "List"]
        # The kubelet restarted with the gate on: noticed once the re-check is due, then Get again.
        sim.get_enabled = True
        clock.now += 599
        await lookup.find("ns", "web")
        assert client.calls[-1] == "List" and lookup.api.get is False
        clock.now += 1
        client.calls.clear()
        assert await lookup.find("ns", "web") is not None
        assert await lookup.find("ns", "web") is not None
        assert client.calls == ["Get", "Get"]
        assert lookup.api == LookupApi(True)
        # ... and restarted with the gate off again: the next lookup falls back at once.
        sim.get_enabled = False
        client.calls.clear()
        assert await lookup.find("ns", "web") is not None
        assert client.calls == ["Get", "List"] and lookup.api.get is False


async def test_a_recheck_that_finds_get_still_disabled_waits_another_interval(host_root: Path) -> None:
    clock = Clock()
    sim = SimKubelet.from_host_tree(host_root, get_enabled=False)
    async with sim, CountingClient(sim.socket_path) as client:
        lookup = PodLookup(client, recheck_seconds=60, clock=clock)
        await lookup.find("ns", "web")
        clock.now += 60
        await lookup.find("ns", "web")  # Get asked again, still disabled
        clock.now += 59
        await lookup.find("ns", "web")
        assert client.calls == ["Get", "List", "Get", "List", "List"]


async def test_real_failures_are_passed_on_and_never_taken_for_no_get(host_root: Path) -> None:
    # A stalled kubelet (deadline), a rate limit, a kubelet gone: errors, and the lookup still asks Get next.
    sim = SimKubelet.from_host_tree(host_root, rate_limit=None)
    async with sim, CountingClient(sim.socket_path, timeout=0.3) as client:
        lookup = PodLookup(client)
        sim.stall()
        with pytest.raises(KubeletUnavailable, match="no answer within") as stalled:
            await lookup.find("ns", "web")
        assert not isinstance(stalled.value, GetUnavailable)
        sim.resume()
        assert lookup.api == LookupApi(None)
        assert client.calls == ["Get"]  # not List: nothing said Get is unavailable
    limited_sim = SimKubelet.from_host_tree(host_root, rate_limit=(0.001, 1))
    async with limited_sim, CountingClient(limited_sim.socket_path) as client:
        await client.list()  # the only token
        lookup = PodLookup(client)
        with pytest.raises(PodResourcesCallFailed, match="rejected by rate limit") as limited:
            await lookup.find("ns", "web")
        assert not isinstance(limited.value, GetUnavailable)
        assert lookup.api == LookupApi(None)
        assert client.calls == ["List", "Get"]
    async with PodResourcesClient(sim.socket_path, timeout=0.3) as gone:  # the servers are stopped
        lookup = PodLookup(gone)
        with pytest.raises(KubeletUnavailable, match="unreachable"):
            await lookup.find("ns", "web")
        with pytest.raises(KubeletUnavailable, match="unreachable"):
            await lookup.check()
        assert lookup.api == LookupApi(None)


async def test_check_finds_out_without_a_lookup(host_root: Path) -> None:
    for enabled in (True, False):
        sim = SimKubelet.from_host_tree(host_root, get_enabled=enabled)
        async with sim, CountingClient(sim.socket_path) as client:
            lookup = PodLookup(client)
            assert (await lookup.check()).get is enabled  # no pod: a made-up name is asked for
            sim.add_pod("ns", "web", "uid-web", [guaranteed("app", "1")])
            client.calls.clear()
            assert (await lookup.check(await client.list())).get is enabled
            assert client.calls == ["List", "Get"]


async def test_lookup_falls_back_on_a_kubelet_without_get(host_root: Path) -> None:
    """A kubelet older than 1.27 has no Get method at all: gRPC answers UNIMPLEMENTED."""

    async def list_pods(request: api_pb2.ListPodResourcesRequest, context: object) -> Any:
        pod = api_pb2.PodResources(
            name="web", namespace="ns", containers=[api_pb2.ContainerResources(name="app", cpu_ids=[3])]
        )
        return api_pb2.ListPodResourcesResponse(pod_resources=[pod])

    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {
            "List": grpc.unary_unary_rpc_method_handler(
                list_pods,
                request_deserializer=api_pb2.ListPodResourcesRequest.FromString,
                response_serializer=api_pb2.ListPodResourcesResponse.SerializeToString,
            )
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    socket_path = host_root / "old-kubelet.sock"
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    try:
        async with PodResourcesClient(socket_path) as client:
            with pytest.raises(GetUnavailable) as info:
                await client.get("ns", "web")
            assert info.value.code == Status.UNIMPLEMENTED
            lookup = PodLookup(client)
            found = await lookup.find("ns", "web")
            assert found is not None and found.containers[0].cpu_ids == frozenset({3})
            assert lookup.api.get is False and lookup.api.kubelet_message == info.value.details
    finally:
        await server.stop(None)


# --- failures ---


async def test_deadline_is_respected_when_the_kubelet_stalls(kubelet: SimKubelet) -> None:
    kubelet.stall()
    async with PodResourcesClient(kubelet.socket_path, timeout=0.3) as client:
        started = time.monotonic()
        with pytest.raises(KubeletUnavailable, match=r"no answer within 0\.3s") as info:
            await asyncio.wait_for(client.list(), 5)  # a client without a deadline fails here, not hangs
        assert time.monotonic() - started < 2.0
        assert str(kubelet.socket_path) in str(info.value)
        kubelet.resume()
        assert await client.list() == []


async def test_unreachable_socket_raises_kubelet_unavailable_naming_it(host_root: Path) -> None:
    missing = host_root / "var/lib/kubelet/pod-resources/kubelet.sock"
    async with PodResourcesClient(missing, timeout=5.0) as client:
        started = time.monotonic()
        for call in (client.list(), client.get_allocatable(), client.get("ns", "x")):
            with pytest.raises(KubeletUnavailable, match="unreachable") as info:
                await call
            assert str(missing) in str(info.value)
            assert not isinstance(info.value, PodResourcesCallFailed)
        assert time.monotonic() - started < 4.0  # fails fast instead of waiting for the socket


async def test_rate_limit_rejection_is_a_call_failure_with_its_status(host_root: Path) -> None:
    sim = SimKubelet.from_host_tree(host_root, rate_limit=(0.001, 2))  # 2 calls, then almost no refill
    async with sim, PodResourcesClient(sim.socket_path) as client:
        await client.list()
        await client.get_allocatable()
        with pytest.raises(PodResourcesCallFailed, match="rejected by rate limit") as info:
            await client.list()
    assert info.value.code == Status.RESOURCE_EXHAUSTED
    assert isinstance(info.value, KubeletUnavailable)


async def test_client_outside_async_with_is_an_error(host_root: Path) -> None:
    with pytest.raises(RuntimeError, match="async with"):
        await PodResourcesClient(host_root / "x.sock").list()


# --- devices ---


async def test_device_plugin_devices_are_reported_per_numa_node(host_root: Path) -> None:
    pool = {"example.com/nic": [Device("nic0", 0), Device("nic1", 1), Device("nic2", None)]}
    async with SimKubelet.from_host_tree(host_root, devices=pool) as sim:
        resources = {"example.com/nic": 1, "intel.com/l3_cache_ways": 2}
        sim.add_pod("ns", "a", "uid-a", [dataclasses.replace(guaranteed("app", "2"), resources=resources)])
        async with PodResourcesClient(sim.socket_path) as client:
            allocatable = await client.get_allocatable()
            container = (await client.list())[0].containers[0]
    assert set(allocatable.devices) == {
        DeviceAssignment("example.com/nic", ("nic0",), frozenset({0})),
        DeviceAssignment("example.com/nic", ("nic1",), frozenset({1})),
        DeviceAssignment("example.com/nic", ("nic2",), frozenset()),
    }
    # One device, on the NUMA node of the container's pinned CPUs; the non-device resource is not reported.
    (device,) = container.devices
    numa_of_cpus = {read_topology(host_root).cpu(c).numa for c in container.cpu_ids}
    assert device.resource == "example.com/nic"
    assert device.numa_nodes == numa_of_cpus


# --- cpu_manager_state ---


async def test_cpu_manager_state_follows_every_change_with_a_valid_checksum(
    kubelet: SimKubelet, host_root: Path
) -> None:
    state_file = host_root / STATE_REL
    assert read_state(host_root) == ("static", ALL_CPUS, {})

    with state_file.open() as first_version:
        kubelet.add_pod("ns", "a", "uid-a", [guaranteed("app", "2"), guaranteed("shared", "100m")])
        kubelet.add_pod("ns", "b", "uid-b", [("app", "1", "1", "1Gi")])
        kubelet.add_pod("ns", "burst", "uid-burst", [("app", "1", "2", "1Gi")])
        # Replaced by rename, never rewritten in place: the file opened before still holds the first version.
        assert os.fstat(first_version.fileno()).st_ino != state_file.stat().st_ino
        assert '"defaultCpuSet":"0-7"' in first_version.read()

    policy, default, entries = read_state(host_root)
    exclusive = kubelet.assignments()
    assert policy == "static"
    assert entries == {
        "uid-a": {"app": exclusive[("uid-a", "app")]},
        "uid-b": {"app": exclusive[("uid-b", "app")]},
    }
    assert default == ALL_CPUS - exclusive[("uid-a", "app")] - exclusive[("uid-b", "app")]
    assert default >= RESERVED  # the shared pool keeps the reserved CPUs

    kubelet.remove_pod("uid-a")
    _, default, entries = read_state(host_root)
    assert entries == {"uid-b": {"app": exclusive[("uid-b", "app")]}}
    assert default == ALL_CPUS - exclusive[("uid-b", "app")]
    # No temp file is left behind.
    assert sorted(p.name for p in state_file.parent.iterdir()) == [
        "config.yaml",
        "cpu_manager_state",
        "pod-resources",
    ]


def test_state_write_is_atomic_rename_from_the_same_directory(
    host_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = SimKubelet.from_host_tree(host_root)
    renames: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        renames.append((str(src), str(dst)))
        assert Path(src).read_text() != ""  # complete before it becomes visible
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    sim.add_pod("ns", "a", "uid-a", [guaranteed("app", "1")])
    ((src, dst),) = renames
    assert Path(dst) == host_root / STATE_REL
    assert Path(src).parent == Path(dst).parent
    assert not Path(src).exists()


# --- pure helpers of the simulator ---


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", 2),
        ("500m", 0.5),
        ("1.5", 1.5),
        ("2000m", 2),
        ("1Gi", 2**30),
        ("512Mi", 2**29),
        ("1k", 1000),
        ("1e3", 1000),
    ],
)
def test_quantities(text: str, value: float) -> None:
    assert parse_quantity(text) == value


def test_bad_quantity_is_rejected() -> None:
    with pytest.raises(ValueError, match="invalid resource quantity"):
        parse_quantity("two")


@pytest.mark.parametrize(
    ("containers", "qos"),
    [
        ([guaranteed("a", "1"), guaranteed("b", "500m")], "Guaranteed"),
        ([ContainerSpec("a", cpu_limit="2", memory_limit="1Gi")], "Guaranteed"),  # requests default to limits
        ([("a", "2000m", "2", "1024Mi")], "Guaranteed"),  # equal quantities, different spelling
        ([guaranteed("a", "1"), ContainerSpec("b")], "Burstable"),
        ([ContainerSpec("a", cpu_request="1", cpu_limit="1")], "Burstable"),  # no memory limit
        ([ContainerSpec("a", "1", "2", "1Gi", "1Gi")], "Burstable"),
        ([ContainerSpec("a"), ContainerSpec("b", resources={"intel.com/l3_cache_ways": 2})], "BestEffort"),
    ],
)
def test_qos_class_like_kubernetes(containers: list[ContainerSpec | tuple[str, ...]], qos: str) -> None:
    assert qos_class(ContainerSpec.of(c) for c in containers) == qos


# --- standalone server ---


@pytest.mark.parametrize("get_disabled", [False, True], ids=["get", "get-disabled"])
async def test_standalone_server_serves_until_terminated(host_root: Path, get_disabled: bool) -> None:
    socket_path = host_root / "var/lib/kubelet/pod-resources/kubelet.sock"
    flags = ("--get-disabled",) if get_disabled else ()
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "rmd_sim.kubelet_cli"),
        *("--host-root", str(host_root), "--reserved-cpus", "1,5"),
        *flags,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        async with PodResourcesClient(socket_path) as client:
            while True:  # until the server has started
                assert proc.returncode is None, "server exited early"
                try:
                    allocatable = await client.get_allocatable()
                    break
                except KubeletUnavailable:
                    assert time.monotonic() < deadline, "server did not answer within 20s"
                    await asyncio.sleep(0.1)
            if get_disabled:
                with pytest.raises(GetUnavailable, match="PodResources API Get method disabled"):
                    await client.get("ns", "web")
            else:
                assert await client.get("ns", "web") is None
        assert allocatable.cpu_ids == ALL_CPUS - {1, 5}
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 0, stderr.decode()
    assert not socket_path.exists()
