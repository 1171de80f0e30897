"""The simulated kubelet's device manager: the kubelet side of the device plugin API (v1beta1).

What it reproduces of the kubelet's devicemanager:

* at start it empties its directory (`<root>/var/lib/kubelet/device-plugins/`, the checkpoint file
  excepted) and serves Registration on `kubelet.sock` there; a plugin that was registered with a previous
  kubelet has to notice the new socket and register again;
* Register checks the version ("v1beta1") and that the resource is an extended resource name, dials the
  plugin at `<dir>/<endpoint>` and asks for its options; a plugin that cannot be reached fails the call. A
  second registration of the same resource replaces the first plugin;
* every ListAndWatch answer replaces the resource's device list (health and NUMA nodes); when the stream
  ends (the plugin died) its devices turn unhealthy: still in the capacity, out of the allocatable;
* Allocate (and PreStartContainer when the plugin asks for it) during admission, GetPreferredAllocation
  when the plugin offers it (`preferred_among`: the kubelet's admission, rmd_sim.kubelet_admission, ranks
  the free devices; those on the container's NUMA nodes are offered when there are enough).

Every call has a deadline except ListAndWatch, which is meant to last.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from rmd_api.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

PLUGIN_DIR_REL = "var/lib/kubelet/device-plugins"
REGISTRATION_SOCKET = "kubelet.sock"
CHECKPOINT = "kubelet_internal_checkpoint"
SUPPORTED_VERSIONS = ("v1beta1",)
HEALTHY = "Healthy"

_add_registration: Any = api_pb2_grpc.add_RegistrationServicer_to_server  # generated without annotations
_PLUGIN_STUB: Any = api_pb2_grpc.DevicePluginStub
_RESOURCE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


@dataclass(frozen=True)
class Device:
    """A device-plugin device as the kubelet knows it."""

    id: str
    numa: int | None = None  # None: the device plugin reports no topology
    also_numa: frozenset[int] = frozenset()  # further NUMA nodes of a device attached to several

    @classmethod
    def on(cls, device_id: str, numa_nodes: Iterable[int]) -> Device:
        nodes = sorted(set(numa_nodes))
        return cls(device_id, nodes[0], frozenset(nodes[1:])) if nodes else cls(device_id)

    @property
    def numa_nodes(self) -> frozenset[int]:
        return frozenset() if self.numa is None else self.also_numa | {self.numa}


class PluginCallFailed(RuntimeError):
    """A call to a device plugin failed (or there is no plugin for the resource)."""


def is_extended_resource_name(name: str) -> bool:
    """domain/name outside the kubernetes.io domains, as the kubelet requires of plugin resources."""
    if not _RESOURCE_NAME.fullmatch(name):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


@dataclass
class _Endpoint:
    resource: str
    socket: Path
    channel: grpc.aio.Channel
    stub: Any
    options: api_pb2.DevicePluginOptions
    devices: dict[str, tuple[Device, bool]] = field(default_factory=dict)  # id -> (device, healthy)
    task: asyncio.Task[None] | None = None


class DeviceManager:
    """Plugins registered on `<plugin_dir>/kubelet.sock`; `on_change()` runs when a device list changes."""

    def __init__(self, plugin_dir: Path, on_change: Callable[[], None], *, timeout: float = 10.0) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.on_change = on_change
        self.timeout = timeout
        self._endpoints: dict[str, _Endpoint] = {}
        self._server: grpc.aio.Server | None = None

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / REGISTRATION_SOCKET

    def resources(self) -> list[str]:
        return sorted(self._endpoints)

    def devices(self, resource: str, *, healthy: bool) -> tuple[Device, ...]:
        endpoint = self._endpoints.get(resource)
        if endpoint is None:
            return ()
        return tuple(d for d, ok in endpoint.devices.values() if ok == healthy)

    def options(self, resource: str) -> api_pb2.DevicePluginOptions | None:
        endpoint = self._endpoints.get(resource)
        return None if endpoint is None else endpoint.options

    # --- lifecycle ---

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        for entry in self.plugin_dir.iterdir():  # as the kubelet: old sockets mean nothing to a new kubelet
            if entry.name != CHECKPOINT and not entry.is_dir():
                entry.unlink(missing_ok=True)
        server = grpc.aio.server()
        _add_registration(_RegistrationServicer(self), server)
        if server.add_insecure_port(f"unix://{self.socket_path.absolute()}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        await server.start()
        self._server = server
        log.info("device manager: Registration on %s", self.socket_path)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        endpoints = list(self._endpoints.values())
        self._endpoints.clear()
        for endpoint in endpoints:
            await self._close(endpoint)
        self.socket_path.unlink(missing_ok=True)

    # --- registration ---

    async def register(self, request: api_pb2.RegisterRequest) -> None:
        """Connect to the plugin described by `request`; ValueError or PluginCallFailed when it cannot be."""
        if request.version not in SUPPORTED_VERSIONS:
            raise ValueError(
                f"version {request.version!r} of the device plugin API is not supported "
                f"(supported: {', '.join(SUPPORTED_VERSIONS)})"
            )
        if not is_extended_resource_name(request.resource_name):
            raise ValueError(f"invalid extended resource name {request.resource_name!r}")
        if not request.endpoint or "/" in request.endpoint:
            raise ValueError(f"invalid endpoint {request.endpoint!r}: a socket name in {self.plugin_dir}")
        socket = self.plugin_dir / request.endpoint
        channel = grpc.aio.insecure_channel(f"unix://{socket.absolute()}")
        stub = _PLUGIN_STUB(channel)
        try:
            options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            await channel.close(None)
            raise PluginCallFailed(f"failed to dial device plugin {socket}: {exc.details()}") from exc
        endpoint = _Endpoint(request.resource_name, socket, channel, stub, options)
        previous = self._endpoints.get(request.resource_name)
        if previous is not None:
            endpoint.devices = dict(previous.devices)  # kept until the new plugin lists its own
            await self._close(previous)
        self._endpoints[request.resource_name] = endpoint
        endpoint.task = asyncio.create_task(self._list_and_watch(endpoint))
        log.info("device plugin for %s registered (%s)", request.resource_name, socket)

    async def _list_and_watch(self, endpoint: _Endpoint) -> None:
        try:
            async for response in endpoint.stub.ListAndWatch(api_pb2.Empty()):
                endpoint.devices = {
                    d.ID: (Device.on(d.ID, (n.ID for n in d.topology.nodes)), d.health == HEALTHY)
                    for d in response.devices
                }
                log.info(
                    "%s: %d devices, %d healthy",
                    endpoint.resource,
                    len(endpoint.devices),
                    sum(ok for _, ok in endpoint.devices.values()),
                )
                self.on_change()
        except grpc.aio.AioRpcError as exc:
            log.info("ListAndWatch of %s ended: %s", endpoint.resource, exc.details())
        if self._endpoints.get(endpoint.resource) is endpoint:
            endpoint.devices = {i: (d, False) for i, (d, _) in endpoint.devices.items()}
            self.on_change()

    async def _close(self, endpoint: _Endpoint) -> None:
        if endpoint.task is not None:
            endpoint.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await endpoint.task
        await endpoint.channel.close(None)

    # --- calls made during admission ---

    def _endpoint(self, resource: str) -> _Endpoint:
        endpoint = self._endpoints.get(resource)
        if endpoint is None:
            raise PluginCallFailed(f"no device plugin is registered for {resource}")
        return endpoint

    async def preferred(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
                )
            ]
        )
        response = await self._call(resource, "GetPreferredAllocation", request)
        if len(response.container_responses) != 1:
            raise PluginCallFailed(f"GetPreferredAllocation of {resource} answered for the wrong containers")
        return list(response.container_responses[0].deviceIDs)

    async def preferred_among(
        self, resource: str, candidates: Sequence[Device], count: int, numa: frozenset[int]
    ) -> list[Device]:
        """`count` of `candidates` (free devices, best first), as the plugin's GetPreferredAllocation picks
        them when it offers it; the first `count` otherwise, or when its answer is of no use. Only the
        candidates on the container's NUMA nodes `numa` are offered, when there are enough of them."""
        chosen = list(candidates[:count])
        options = self.options(resource)
        if options is None or not options.get_preferred_allocation_available:
            return chosen
        aligned = [d for d in candidates if d.numa_nodes and d.numa_nodes <= numa]
        offer = aligned if len(aligned) >= count else candidates
        try:
            ids = await self.preferred(resource, [d.id for d in offer], [], count)
        except PluginCallFailed as exc:
            log.warning("ignoring the preferred allocation of %s: %s", resource, exc)
            return chosen
        by_id = {d.id: d for d in offer}
        if len(set(ids)) != count or not all(i in by_id for i in ids):
            log.warning(
                "ignoring the preferred allocation of %s: %s is not %d offered devices", resource, ids, count
            )
            return chosen
        return [by_id[i] for i in ids]

    async def allocate(self, resource: str, ids: Sequence[str]) -> dict[str, str]:
        """The environment the plugin wants the container to have for devices `ids`."""
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )
        response = await self._call(resource, "Allocate", request)
        if len(response.container_responses) != 1:
            raise PluginCallFailed(f"Allocate of {resource} answered for the wrong containers")
        return dict(response.container_responses[0].envs)

    async def pre_start(self, resource: str, ids: Sequence[str]) -> None:
        await self._call(resource, "PreStartContainer", api_pb2.PreStartContainerRequest(devices_ids=ids))

    async def _call(self, resource: str, method: str, request: Any) -> Any:
        endpoint = self._endpoint(resource)
        try:
            return await getattr(endpoint.stub, method)(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise PluginCallFailed(
                f"{method} of {resource} failed: rpc error: code = {exc.code().name} desc = {exc.details()}"
            ) from exc


class _RegistrationServicer:
    """Registration over a DeviceManager (the generated base class is untyped, so it is not subclassed)."""

    def __init__(self, manager: DeviceManager) -> None:
        self.manager = manager

    async def Register(  # gRPC method name
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.Empty:
        try:
            await self.manager.register(request)
        except (ValueError, PluginCallFailed) as exc:
            # The kubelet answers with a plain Go error, which clients see as UNKNOWN.
            await context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        return api_pb2.Empty()
