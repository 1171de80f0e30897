"""The simulated kubelet's PodResources v1 gRPC server (PodResourcesLister) on a unix socket, answering from
what the kubelet (rmd_sim.kubelet) holds.

* List = every pod added and not removed (the active pods), containers' `cpu_ids` only the exclusive CPUs;
  GetAllocatableResources = online CPUs minus the reserved set (empty with policy `none`) and all devices;
  Get = one pod, else the error "pod <name> in namespace <ns> not found". The real kubelet returns that as a
  plain Go error (status UNKNOWN); here the status is the kubelet's `not_found_code`. With `get_enabled`
  false, Get answers like a 1.27-1.35 kubelet whose KubeletPodResourcesGet gate is off: status UNKNOWN,
  "PodResources API Get method disabled". Both are read at every call, so tests may flip them while it
  serves (a kubelet restarted with other gates).
* Devices: one entry per (device, NUMA node), as the kubelet's containerDevicesFromResourceDeviceInstances.
  No memory manager: memory blocks are never reported.
* The kubelet's rate limit (100 qps, burst 10, RESOURCE_EXHAUSTED "rejected by rate limit") applies.

`stall()` / `resume()` freeze the server, to exercise client deadlines.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import grpc
import grpc.aio

from rmd_api.kubelet.podresources.v1 import api_pb2, api_pb2_grpc
from rmd_sim.devicemanager import Device
from rmd_sim.kubelet_admission import SimPod

log = logging.getLogger(__name__)

MAX_UNIX_PATH = 107  # sun_path is 108 bytes including the terminating NUL

_add_servicer: Any = api_pb2_grpc.add_PodResourcesListerServicer_to_server  # generated without annotations


class PodSource(Protocol):
    """What the server answers from (a SimKubelet)."""

    not_found_code: grpc.StatusCode
    get_enabled: bool

    @property
    def pods(self) -> list[SimPod]: ...

    @property
    def devices(self) -> dict[str, tuple[Device, ...]]: ...

    def allocatable_cpus(self) -> frozenset[int]: ...

    def find_pod(self, namespace: str, name: str) -> SimPod | None: ...


def unix_address(socket_path: Path) -> str:
    """The absolute path gRPC listens on; ValueError when it does not fit in a unix socket address."""
    path = str(socket_path.absolute())
    if len(path.encode()) > MAX_UNIX_PATH:
        raise ValueError(f"unix socket path is {len(path.encode())} bytes, over {MAX_UNIX_PATH}: {path}")
    return path


def device_messages(devices: Mapping[str, Iterable[Device]]) -> list[api_pb2.ContainerDevices]:
    return [
        api_pb2.ContainerDevices(
            resource_name=resource,
            device_ids=[d.id],
            topology=None if node is None else api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=node)]),
        )
        for resource, devs in sorted(devices.items())
        for d in devs
        for node in (*sorted(d.numa_nodes),) or (None,)
    ]


def pod_message(pod: SimPod) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[
            api_pb2.ContainerResources(
                name=spec.name,
                cpu_ids=sorted(pod.cpus.get(spec.name, ())),
                devices=device_messages(pod.devices.get(spec.name, {})),
            )
            for spec in pod.containers
        ],
    )


class PodResourcesServer:
    """PodResourcesLister for `source` on `socket_path` while started; `rate_limit`: (qps, burst) or None."""

    def __init__(self, source: PodSource, socket_path: Path, rate_limit: tuple[float, int] | None) -> None:
        self.source = source
        self.socket_path = socket_path
        self._limiter = _TokenBucket(*rate_limit) if rate_limit else None
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._server: grpc.aio.Server | None = None

    def stall(self) -> None:
        """Hold every call until resume(); clients see their deadline expire."""
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    async def start(self) -> None:
        path = unix_address(self.socket_path)
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)  # a stale socket from a previous run, as the kubelet does
        server = grpc.aio.server()
        _add_servicer(_Servicer(self), server)
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise OSError(f"cannot listen on {path}")
        await server.start()
        self._server = server
        log.info("simulated kubelet serving PodResources on %s", path)

    async def stop(self, grace: float | None = None) -> None:
        self.resume()  # let stalled calls finish (or be cancelled) instead of hanging shutdown
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    async def admit_call(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await self._resumed.wait()
        if self._limiter is not None and not self._limiter.take():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")


class _TokenBucket:
    """The kubelet's PodResources limiter: `qps` tokens per second, at most `burst` saved up."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.qps)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class _Servicer:
    """PodResourcesLister over a PodResourcesServer (the generated base class is untyped, so it is not
    subclassed)."""

    def __init__(self, server: PodResourcesServer) -> None:
        self.server = server
        self.source = server.source

    async def List(  # gRPC method names
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.ListPodResourcesResponse:
        await self.server.admit_call(context)
        return api_pb2.ListPodResourcesResponse(pod_resources=[pod_message(p) for p in self.source.pods])

    async def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.AllocatableResourcesResponse:
        await self.server.admit_call(context)
        return api_pb2.AllocatableResourcesResponse(
            cpu_ids=sorted(self.source.allocatable_cpus()), devices=device_messages(self.source.devices)
        )

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.GetPodResourcesResponse:
        await self.server.admit_call(context)
        if not self.source.get_enabled:  # the KubeletPodResourcesGet gate is off (default before 1.34)
            await context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        pod = self.source.find_pod(request.pod_namespace, request.pod_name)
        if pod is None:
            await context.abort(
                self.source.not_found_code,
                f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
            )
        assert pod is not None  # abort raises
        return api_pb2.GetPodResourcesResponse(pod_resources=pod_message(pod))
