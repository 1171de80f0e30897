"""Fuzz campaign (docs/security.md, "Hostile input"): what reaches the agent over its APIs. Any gRPC request,
in fields or as raw bytes, is a workload or an INVALID_ARGUMENT answer; any PodResources answer of the kubelet
converts and is summed into zones; any device plugin request and any HTTP request line gets an answer; all
within the deadline."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from google.protobuf.message import DecodeError
from grpclib.const import Status
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from rmd_agent.cache_ways import Holding
from rmd_agent.deviceplugin.devices import (
    UnknownDevices,
    allocation_envs,
    device_id,
    parse_device_id,
    preferred_ways,
)
from rmd_agent.engine_api import CpuState
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.container_cpus import ContainerCpuLookup
from rmd_agent.kubelet.podresources import AllocatableResources, PodResources, _devices, _memory, _pod
from rmd_agent.nrt.quantity import decimal_si, parse_integer_quantity
from rmd_agent.nrt.zones import CacheWays, NodeTopology, compute_zones
from rmd_agent.observe.numa import NumaNode
from rmd_agent.plan.workload import Workload, WorkloadRejected
from rmd_agent.server import convert
from rmd_agent.server.grpc_service import status_for
from rmd_agent.server.http_endpoints import HealthHttpServer
from rmd_api.agent.v1 import agent_pb2
from rmd_api.cpuset import MAX_CPU_ID
from rmd_api.kubelet.deviceplugin.v1beta1 import api_pb2 as dp_pb2
from rmd_api.kubelet.podresources.v1 import api_pb2 as pr_pb2

FUZZ = settings.get_profile("fuzz")
UINT32 = st.integers(0, 2**32 - 1)

# -- rmd.agent.v1 requests -----------------------------------------------------------------------------------

_CPU_LISTS = st.one_of(
    st.sampled_from(["0", "0-3", "0-3,8", "4294967295", "0-4294967295", f"0-{MAX_CPU_ID}", "3-1", "", "1_0"]),
    st.text("0123456789,- ", max_size=12),
    st.text(max_size=8),
)


@st.composite
def _specs(draw: st.DrawFn) -> agent_pb2.WorkloadSpec:
    spec = agent_pb2.WorkloadSpec(
        core_ids=draw(st.lists(_CPU_LISTS, max_size=3)),
        all_cores=draw(st.booleans()),
        reserved_core_ids=draw(st.lists(_CPU_LISTS, max_size=2)),
        policy=draw(st.sampled_from(["", "gold", "silver", "bronze", "platinum"]) | st.text(max_size=6)),
    )
    if draw(st.booleans()):
        spec.cache.max, spec.cache.min = draw(UINT32), draw(UINT32)
    unit = draw(st.sampled_from([None, "percentage", "mbps"]))
    if unit is not None:
        setattr(spec.mba, unit, draw(UINT32))
    if draw(st.booleans()):
        spec.pstate.ratio = draw(st.floats())  # NaN and infinities included
        if draw(st.booleans()):
            spec.pstate.monitoring = draw(st.booleans())
    return spec


_REFS = st.builds(
    agent_pb2.WorkloadRef,
    namespace=st.sampled_from(["", "ns"]) | st.text(max_size=6),
    name=st.sampled_from(["", "db"]) | st.text(max_size=6),
    uid=st.text(max_size=6),
)
_APPLY = st.builds(agent_pb2.ApplyWorkloadRequest, ref=_REFS, spec=_specs())


def _checked_or_invalid(request: agent_pb2.ApplyWorkloadRequest) -> Workload | None:
    """The workload, or None when the request is refused as the service refuses it: INVALID_ARGUMENT."""
    try:
        workload = convert.workload_from_request(request)
    except WorkloadRejected as exc:
        assert status_for(exc)[0] == Status.INVALID_ARGUMENT
        return None
    assert workload.all_cores or workload.core_ids
    assert all(0 <= cpu <= MAX_CPU_ID for cpu in workload.core_ids | workload.reserved_core_ids)
    assert workload.pstate_ratio is None or math.isfinite(workload.pstate_ratio)
    convert.spec_message(workload)  # what the agent answers with
    return workload


@FUZZ
@given(_APPLY)
def test_any_apply_request_is_a_workload_or_invalid_argument(request: agent_pb2.ApplyWorkloadRequest) -> None:
    _checked_or_invalid(request)


# Wire bytes: random, and valid requests with a few bytes changed (tags, lengths, UTF-8 and varints).
_WIRE = st.one_of(
    st.binary(max_size=80),
    st.tuples(
        _APPLY.map(agent_pb2.ApplyWorkloadRequest.SerializeToString), st.integers(0), st.binary(max_size=3)
    ).map(lambda t: t[0][: t[1] % (len(t[0]) + 1)] + t[2] + t[0][t[1] % (len(t[0]) + 1) + len(t[2]) :]),
)


@FUZZ
@given(_WIRE)
def test_any_bytes_are_a_request_or_a_decode_error(data: bytes) -> None:
    try:
        request = agent_pb2.ApplyWorkloadRequest.FromString(data)
    except DecodeError:
        return  # grpc answers INTERNAL ("Exception deserializing request") before any agent code runs
    _checked_or_invalid(request)
    for parse, read in (
        (agent_pb2.RemoveWorkloadRequest.FromString, convert.remove_ref),
        (agent_pb2.GetContainerCpusRequest.FromString, convert.container_ref),
    ):
        try:
            read(parse(data))
        except DecodeError:
            pass
        except convert.InvalidRequest as exc:
            assert status_for(exc)[0] == Status.INVALID_ARGUMENT


# -- the kubelet's PodResources answers ----------------------------------------------------------------------

NUMA = [
    NumaNode(0, frozenset({0, 1}), 2**30, 2**29, (), {0: 10, 1: 20}),
    NumaNode(1, frozenset({2, 3}), 2**30, 2**29, (), {0: 20, 1: 10}),
]
CACHES = [CacheWays(0, frozenset({0, 1, 2, 3}), 11, 8, (Holding(frozenset({0}), 4),))]  # 4 of 8 held


@st.composite
def _pod_messages(draw: st.DrawFn) -> pr_pb2.PodResources:
    ids = st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 5), max_size=4)
    topology = st.builds(
        pr_pb2.TopologyInfo, nodes=st.lists(st.builds(pr_pb2.NUMANode, ID=st.integers(-3, 3)), max_size=2)
    )
    devices = st.lists(
        st.builds(
            pr_pb2.ContainerDevices,
            resource_name=st.text(max_size=6),
            device_ids=st.lists(st.text(max_size=4), max_size=2),
            topology=topology,
        ),
        max_size=2,
    )
    memory = st.lists(
        st.builds(
            pr_pb2.ContainerMemory,
            memory_type=st.sampled_from(["memory", "hugepages-2Mi", "x"]),
            size=st.integers(0, 2**64 - 1),
            topology=topology,
        ),
        max_size=2,
    )
    containers = st.lists(
        st.builds(
            pr_pb2.ContainerResources,
            name=st.sampled_from(["app", "side"]),
            cpu_ids=ids,
            devices=devices,
            memory=memory,
        ),
        max_size=2,
    )
    return pr_pb2.PodResources(
        name="p", namespace="ns", containers=draw(containers), cpu_ids=draw(ids), memory=draw(memory)
    )


@FUZZ
@given(
    st.lists(_pod_messages(), max_size=2) | st.binary(max_size=60).map(lambda b: list(_list_or_empty(b))),
    st.binary(max_size=60)
    | _pod_messages().map(
        lambda p: pr_pb2.AllocatableResourcesResponse(
            cpu_ids=p.cpu_ids, devices=[d for c in p.containers for d in c.devices], memory=p.memory
        ).SerializeToString()
    ),
)
def test_any_pod_resources_answer_converts_and_sums_into_zones(
    messages: list[pr_pb2.PodResources], allocatable_bytes: bytes
) -> None:
    pods = [_pod(m) for m in messages]
    try:
        answer = pr_pb2.AllocatableResourcesResponse.FromString(allocatable_bytes)
    except DecodeError:
        answer = pr_pb2.AllocatableResourcesResponse()
    allocatable = AllocatableResources(
        frozenset(answer.cpu_ids), _devices(answer.devices), _memory(answer.memory)
    )
    zones = compute_zones(NUMA, allocatable, pods, CACHES)
    assert [zone["name"] for zone in NodeTopology.of(zones, {}).content()["zones"]] == ["node-0", "node-1"]


def _list_or_empty(data: bytes) -> list[pr_pb2.PodResources]:
    try:
        return list(pr_pb2.ListPodResourcesResponse.FromString(data).pod_resources)
    except DecodeError:
        return []


class _FoundPod:
    """A PodLookup that finds one pod (a fuzzed PodResources answer)."""

    def __init__(self, pod: PodResources) -> None:
        self.pod = pod
        self.api = None

    async def find(self, namespace: str, name: str) -> PodResources | None:
        return self.pod


@settings(FUZZ, max_examples=FUZZ.max_examples // 2)  # an event loop per example
@given(_pod_messages())
def test_get_container_cpus_answers_any_pod_resources_with_a_message(message: pr_pb2.PodResources) -> None:
    lookup = ContainerCpuLookup(_FoundPod(_pod(message)), HostFS("/nonexistent"), "var/lib/kubelet")
    result = asyncio.run(lookup.container_cpus("ns", "p", "", "app"))
    answer = convert.container_cpus_message(result)
    assert all(0 <= cpu <= MAX_CPU_ID for cpu in answer.cpus)


def test_cpu_ids_no_cpu_has_are_not_yet_allocated_not_an_internal_error() -> None:
    # int64 in PodResources, int32 in GetContainerCpusResponse: 2**40 made building the answer a ValueError.
    for bad in (2**40, -1):
        message = pr_pb2.PodResources(
            name="p", namespace="ns", containers=[pr_pb2.ContainerResources(name="app", cpu_ids=[2, bad])]
        )
        lookup = ContainerCpuLookup(_FoundPod(_pod(message)), HostFS("/nonexistent"), "var/lib/kubelet")
        result = asyncio.run(lookup.container_cpus("ns", "p", "", "app"))
        assert result.state == CpuState.NOT_YET_ALLOCATED
        assert f"CPU id {bad}" in result.detail
        convert.container_cpus_message(result)


# -- device plugin requests ----------------------------------------------------------------------------------

KNOWN = [device_id(cache, way) for cache in (0, 1) for way in range(4)]
_DEVICE_IDS = st.lists(
    st.sampled_from(KNOWN)
    | st.sampled_from(["l3-٣-way-1", "l3-99999999999999999999-way-0", "gpu0", ""])
    | st.text(max_size=12),
    max_size=6,
)


@FUZZ
@given(st.builds(dp_pb2.ContainerAllocateRequest, devices_ids=_DEVICE_IDS))
def test_any_allocate_request_is_an_environment_or_unknown_devices(
    request: dp_pb2.ContainerAllocateRequest,
) -> None:
    try:
        envs = allocation_envs(list(request.devices_ids), KNOWN)
    except UnknownDevices:
        return
    dp_pb2.ContainerAllocateResponse(envs=envs)
    assert int(envs["RMD_L3_CACHE_WAYS"]) == len(set(request.devices_ids))


@FUZZ
@given(
    st.builds(
        dp_pb2.ContainerPreferredAllocationRequest,
        available_deviceIDs=_DEVICE_IDS,
        must_include_deviceIDs=_DEVICE_IDS,
        allocation_size=st.integers(-(2**31), 2**31 - 1),
    )
)
def test_any_preferred_allocation_request_gets_offered_devices(
    request: dp_pb2.ContainerPreferredAllocationRequest,
) -> None:
    available, required = list(request.available_deviceIDs), list(request.must_include_deviceIDs)
    chosen = preferred_ways(available, required, request.allocation_size)
    assert len(chosen) == len(set(chosen)) <= max(request.allocation_size, len(set(required)), 0)
    assert set(required) <= set(chosen) <= set(available) | set(required)
    assert all(parse_device_id(i) is None or i in available or i in required for i in chosen)


# -- the agent's HTTP endpoints ------------------------------------------------------------------------------

_REQUESTS = st.one_of(
    st.tuples(
        st.sampled_from(["GET", "HEAD", "POST", "get", ""]) | st.text(max_size=5),
        st.sampled_from(["/healthz", "/readyz", "/metrics", "/readyz?x=1", "/", "*"]) | st.text(max_size=10),
        st.sampled_from(["HTTP/1.1", "HTTP/1.0", ""]),
    ).map(lambda parts: " ".join(parts).encode("utf-8", "surrogatepass") + b"\r\n\r\n"),
    st.binary(max_size=60).map(lambda b: b + b"\r\n\r\n"),
    st.binary(max_size=60),
)


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def _exchange(request: bytes) -> bytes:
    async def ready() -> tuple[bool, str]:
        return True, ""

    server = HealthHttpServer(CollectorRegistry(), ready)
    port = await server.start("127.0.0.1:0")
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 5.0)
        writer.close()
        return answer
    finally:
        await server.close()


@settings(FUZZ, max_examples=FUZZ.max_examples // 2)  # a server per example
@given(_REQUESTS)
def test_any_http_request_gets_an_http_answer_or_none(request: bytes) -> None:
    errors = _Errors()
    logging.getLogger("rmd_agent.server.http_endpoints").addHandler(errors)
    try:
        answer = asyncio.run(_exchange(request))
    finally:
        logging.getLogger("rmd_agent.server.http_endpoints").removeHandler(errors)
    assert not errors.records
    if b"\r\n\r\n" not in request:
        assert answer == b""  # no complete request: nothing to answer
    else:
        status = int(answer.split(b" ", 2)[1])
        assert answer.startswith(b"HTTP/1.1 ") and status in (200, 400, 404, 405)


# -- quantities the agent reads back from NodeResourceTopology objects ---------------------------------------


@FUZZ
@given(
    st.one_of(
        st.integers(-(2**70), 2**70),
        st.integers(-(2**70), 2**70).map(decimal_si),
        st.text("0123456789+-kMGTPEi ", max_size=10),
        st.sampled_from(["²", "1_0", "٣", "+-5", "9" * 5000 + "k", "1e3", "1.5"]),
        st.text(max_size=8),
    )
)
def test_any_quantity_is_an_integer_or_a_value_error(text: Any) -> None:
    try:
        value = parse_integer_quantity(text)
    except ValueError:
        return
    assert isinstance(value, int)
    assert parse_integer_quantity(decimal_si(value)) == value
