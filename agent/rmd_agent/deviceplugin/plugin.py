"""The `intel.com/l3_cache_ways` device plugin: a DevicePlugin gRPC server on a unix socket in the kubelet's
device-plugins directory, registered with the kubelet's Registration service on `kubelet.sock` there. Both
sides are grpclib (rmd_agent.rpc): no grpcio threads in the agent (issue #14).

Lifecycle, as the kubelet expects of a plugin:

* serve first, then register (the kubelet dials the plugin back while handling Register);
* the kubelet wipes its device-plugins directory when it starts and creates a new `kubelet.sock`, so the
  identity (inode, ctime) of `kubelet.sock` is checked whenever an entry of that directory comes or goes
  (inotify; polled every `watch_seconds` where inotify cannot be used) and every `recheck_seconds`: when
  it changed, or the plugin's own socket is gone, the server is restarted on a fresh socket and the plugin
  registers again. A failed registration is retried every `watch_seconds`;
* ListAndWatch sends the full device list at once and again whenever it changes. The list comes from an
  async provider of WayPools (the guaranteed pool per L3 cache), read at once after `notify()` (the agent
  calls it after every change of its engine) and every `refresh_seconds` in case the pool changed without
  one (another tool's resctrl groups); a provider that fails keeps the last list and is asked again every
  `retry_seconds` (the ways are still there, the engine is just busy or restarting).

Allocate answers with environment variables only (devices.allocation_envs); the ways are enforced later,
when the workload asking for them is applied to the container's CPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpclib.client
import grpclib.server
from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream
from h2.exceptions import H2Error

from rmd_agent.deviceplugin.devices import (
    UnknownDevices,
    WayDevice,
    WayPool,
    allocation_envs,
    plan_devices,
    preferred_ways,
)
from rmd_agent.errors import AgentError
from rmd_agent.nrt.triggers import RefreshTrigger, watch_directories
from rmd_agent.rpc import TRANSPORT_ERRORS, RawCodec, request_of, unary_stream, unary_unary
from rmd_api.kubelet.deviceplugin.v1beta1 import api_pb2
from rmd_api.names import CACHE_WAYS_RESOURCE

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_SOCKET_NAME = "rmd-l3-cache-ways.sock"
HEALTHY = "Healthy"
MAX_UNIX_PATH = 107  # sun_path is 108 bytes including the terminating NUL


PoolProvider = Callable[[], Awaitable[Sequence[WayPool]]]

REGISTER_METHOD = "/v1beta1.Registration/Register"


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class CacheWaysPlugin:
    """Run with `await plugin.run()` until stop() or cancellation. `registered` tells whether the current
    kubelet accepted the plugin; `registrations` counts successful Register calls."""

    def __init__(
        self,
        pools: PoolProvider,
        plugin_dir: Path,
        *,
        socket_name: str = DEFAULT_SOCKET_NAME,
        resource_name: str = CACHE_WAYS_RESOURCE,
        refresh_seconds: float = 60.0,  # a safety net: notify() brings the changes
        retry_seconds: float = 5.0,  # after the provider failed
        watch_seconds: float = 0.1,  # see the registration loop
        recheck_seconds: float = 10.0,  # kubelet.sock checked even without a directory event
        timeout: float = 5.0,
    ) -> None:
        self._pools = pools
        self.plugin_dir = Path(plugin_dir)
        self.socket_name = socket_name
        self.resource_name = resource_name
        self.refresh_seconds = refresh_seconds
        self.retry_seconds = retry_seconds
        self.watch_seconds = watch_seconds
        self.recheck_seconds = recheck_seconds
        self.timeout = timeout
        self.registrations = 0
        self.registered = False
        self._devices: tuple[WayDevice, ...] = ()
        self._version = 0  # bumped on every change of _devices; ListAndWatch streams resend on a bump
        self._provider_failed = False
        self.reads = 0  # provider calls, for tests
        self._changed = asyncio.Condition()
        self._wake_refresh = asyncio.Event()
        self._stopping = asyncio.Event()
        self._server: grpclib.server.Server | None = None
        self._servicer: _Servicer | None = None

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    @property
    def devices(self) -> tuple[WayDevice, ...]:
        return self._devices

    def notify(self) -> None:
        """The pool may have changed: read it again now instead of at the next refresh."""
        self._wake_refresh.set()

    def stop(self) -> None:
        """Make run() return: the server stops and the socket is removed (the kubelet then marks the
        devices unhealthy)."""
        self._stopping.set()

    async def run(self) -> None:
        path = str(self.socket_path.absolute())
        if len(path.encode()) > MAX_UNIX_PATH:
            raise ValueError(f"unix socket path is {len(path.encode())} bytes, over {MAX_UNIX_PATH}: {path}")
        self._stopping.clear()
        loops: list[asyncio.Task[None]] = []
        try:
            await self.refresh()
            loops = [
                asyncio.create_task(self._refresh_loop()),
                asyncio.create_task(self._registration_loop()),
                asyncio.create_task(self._until_stopped()),
            ]
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # a loop that failed: raise what it raised
        finally:
            # Also seen by the loops at their next turn: on Python 3.11 a cancel that comes as the awaited
            # wait_for ends is lost (a directory event or notify() at the moment of the stop), and the loop
            # would go on to its next wait.
            self._stopping.set()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._stop_server()

    async def refresh(self) -> bool:
        """Read the pools; True when the device list changed (and was sent to the kubelet)."""
        self.reads += 1
        try:
            pools = await asyncio.wait_for(self._pools(), self.timeout)
        except (AgentError, OSError, TimeoutError) as exc:
            log.warning("cannot read the guaranteed pool, keeping %d devices: %s", len(self._devices), exc)
            self._provider_failed = True
            return False
        self._provider_failed = False
        devices = plan_devices(pools)
        if devices == self._devices:
            return False
        async with self._changed:
            self._devices = devices
            self._version += 1
            self._changed.notify_all()
        per_cache = {c: sum(d.cache_id == c for d in devices) for c in sorted({d.cache_id for d in devices})}
        log.info("advertising %d devices (ways per L3 cache id: %s)", len(devices), per_cache)
        return True

    # --- loops ---

    async def _until_stopped(self) -> None:
        await self._stopping.wait()

    async def _refresh_loop(self) -> None:
        while not self._stopping.is_set():
            wait = (
                min(self.retry_seconds, self.refresh_seconds)
                if self._provider_failed
                else self.refresh_seconds
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_refresh.wait(), wait)
            self._wake_refresh.clear()
            await self.refresh()

    async def _registration_loop(self) -> None:
        # A restarted kubelet posts the Node's status while it starts and then only every 10 s; registering
        # within that first moment brings the ways back with it instead of one status period later (measured
        # on a real kubelet: 10.7 s with a 1 s check). So a new kubelet.sock is noticed at once (inotify on
        # the directory, else polled every watch_seconds), and a failed registration retried as often; a
        # registered plugin otherwise does nothing (a stat every 0.1 s was a fifth of an idle agent's CPU).
        trigger = RefreshTrigger()
        watcher = asyncio.create_task(
            watch_directories({self.plugin_dir: None}, trigger, self.watch_seconds, "device-plugins")
        )
        try:
            await self._register_on_changes(trigger)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _register_on_changes(self, trigger: RefreshTrigger) -> None:
        registered_with: tuple[int, int] | None = None  # identity of the kubelet.sock registered with
        failed_with: tuple[int, int] | None = None  # ... and of the one a registration last failed on
        served_for: tuple[int, int] | None = None  # ... and of the one the server was last started for
        while not self._stopping.is_set():
            kubelet = _identity(self.kubelet_socket)
            if kubelet is None:
                if registered_with is not None:
                    log.info("kubelet socket %s is gone; waiting for it to come back", self.kubelet_socket)
                registered_with = None
                self.registered = False
            elif kubelet != registered_with or not self.socket_path.exists():
                self.registered = False
                try:
                    # A retry with the same kubelet keeps the server: a new socket is a directory event,
                    # which would wake this loop at once and retry without pause (a busy loop; on grpclib,
                    # whose refused connection fails without yielding, one that starves the event loop).
                    if kubelet != served_for or not self.socket_path.exists():
                        await self._restart_server()
                        served_for = kubelet
                    await self._register()
                except (GRPCError, TimeoutError, *TRANSPORT_ERRORS) as exc:
                    detail = _failure(exc)
                    # Once per kubelet socket: a dead kubelet's socket would otherwise log every second.
                    level = logging.DEBUG if kubelet == failed_with else logging.WARNING
                    log.log(level, "registration with %s failed, will retry: %s", self.kubelet_socket, detail)
                    failed_with = kubelet
                else:
                    registered_with = kubelet
                    self.registrations += 1
                    self.registered = True
            retrying = kubelet is not None and not self.registered
            await trigger.wait(self.watch_seconds if retrying else self.recheck_seconds)

    # --- server and registration ---

    async def _restart_server(self) -> None:
        await self._stop_server()
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        servicer = _Servicer(self)
        server = grpclib.server.Server([servicer], codec=RawCodec())
        await server.start(path=str(self.socket_path.absolute()))  # OSError when it cannot listen
        self._server, self._servicer = server, servicer
        log.info("device plugin serving %s on %s", self.resource_name, self.socket_path)

    async def _stop_server(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            if self._servicer is not None:
                self._servicer.closing = True
            try:
                server.close()  # cancels the handlers: ListAndWatch streams never end by themselves
                await server.wait_closed()
            finally:
                self.socket_path.unlink(missing_ok=True)

    async def _register(self) -> None:
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_name,
            resource_name=self.resource_name,
            options=self.options(),
        )
        channel = grpclib.client.Channel(path=str(self.kubelet_socket.absolute()), codec=RawCodec())
        try:
            register = grpclib.client.UnaryUnaryMethod(
                channel, REGISTER_METHOD, api_pb2.RegisterRequest, api_pb2.Empty
            )
            await register(request, timeout=self.timeout)
        finally:
            channel.close()
        log.info("registered %s with the kubelet (%s)", self.resource_name, self.kubelet_socket)

    def options(self) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    # --- answers, used by the servicer ---

    async def device_lists(self) -> AsyncIterator[tuple[WayDevice, ...]]:
        """The device list now, then after every change, forever."""
        seen = -1
        while True:
            async with self._changed:
                while self._version == seen:
                    await self._changed.wait()
                seen, devices = self._version, self._devices
            yield devices


def _failure(exc: Exception) -> str:
    """What a failed call says: the kubelet's message for a gRPC error, else the exception's text (a missing
    or refused socket is an OSError, a deadline `TimeoutError('Deadline exceeded')`)."""
    if isinstance(exc, GRPCError):
        return exc.message or exc.status.name
    return str(exc) or type(exc).__name__


def _device_message(device: WayDevice) -> api_pb2.Device:
    topology = None
    if device.numa_nodes:
        topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in sorted(device.numa_nodes)])
    return api_pb2.Device(ID=device.id, health=HEALTHY, topology=topology)


class _Servicer:
    """DevicePlugin over a CacheWaysPlugin, as grpclib serves it: method paths to handlers (named after the
    gRPC methods), each reading its request from and writing its answer to the call's stream."""

    def __init__(self, plugin: CacheWaysPlugin) -> None:
        self.plugin = plugin
        self.closing = False  # set before the server is closed (which cancels the running handlers)

    def __mapping__(self) -> dict[str, Handler]:
        prefix = "/v1beta1.DevicePlugin/"
        return {
            prefix + "GetDevicePluginOptions": unary_unary(
                self.GetDevicePluginOptions, api_pb2.Empty, api_pb2.DevicePluginOptions
            ),
            prefix + "ListAndWatch": unary_stream(
                self.ListAndWatch, api_pb2.Empty, api_pb2.ListAndWatchResponse
            ),
            prefix + "GetPreferredAllocation": unary_unary(
                self.GetPreferredAllocation,
                api_pb2.PreferredAllocationRequest,
                api_pb2.PreferredAllocationResponse,
            ),
            prefix + "Allocate": unary_unary(
                self.Allocate, api_pb2.AllocateRequest, api_pb2.AllocateResponse
            ),
            prefix + "PreStartContainer": unary_unary(
                self.PreStartContainer, api_pb2.PreStartContainerRequest, api_pb2.PreStartContainerResponse
            ),
        }

    async def GetDevicePluginOptions(
        self, stream: Stream[api_pb2.Empty, api_pb2.DevicePluginOptions]
    ) -> None:
        await stream.recv_message()
        await stream.send_message(self.plugin.options())

    async def ListAndWatch(self, stream: Stream[api_pb2.Empty, api_pb2.ListAndWatchResponse]) -> None:
        await stream.recv_message()
        try:
            async for devices in self.plugin.device_lists():
                await stream.send_message(
                    api_pb2.ListAndWatchResponse(devices=[_device_message(d) for d in devices])
                )
        except asyncio.CancelledError:
            if self.closing:
                await self._end_stream(stream)
            raise  # grpclib ends the call quietly

    async def _end_stream(self, stream: Stream[Any, Any]) -> None:
        # grpclib's Server.close() cancels the handler but neither ends the stream nor closes the
        # connection (grpcio's stop did), so the kubelet would go on waiting on a stream of a plugin that
        # is gone and keep its devices healthy. A status tells it the stream ended; bounded in case the
        # kubelet stopped reading.
        with contextlib.suppress(TimeoutError, H2Error):
            await asyncio.wait_for(
                stream.send_trailing_metadata(
                    status=Status.UNAVAILABLE, status_message="device plugin stopped"
                ),
                self.plugin.timeout,
            )

    async def GetPreferredAllocation(
        self, stream: Stream[api_pb2.PreferredAllocationRequest, api_pb2.PreferredAllocationResponse]
    ) -> None:
        request = await request_of(stream)
        await stream.send_message(
            api_pb2.PreferredAllocationResponse(
                container_responses=[
                    api_pb2.ContainerPreferredAllocationResponse(
                        deviceIDs=preferred_ways(
                            list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size
                        )
                    )
                    for r in request.container_requests
                ]
            )
        )

    async def Allocate(self, stream: Stream[api_pb2.AllocateRequest, api_pb2.AllocateResponse]) -> None:
        request = await request_of(stream)
        known = [d.id for d in self.plugin.devices]
        responses = []
        for container in request.container_requests:
            try:
                envs = allocation_envs(list(container.devices_ids), known)
            except UnknownDevices as exc:
                raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from exc
            responses.append(api_pb2.ContainerAllocateResponse(envs=envs))
        await stream.send_message(api_pb2.AllocateResponse(container_responses=responses))

    async def PreStartContainer(
        self, stream: Stream[api_pb2.PreStartContainerRequest, api_pb2.PreStartContainerResponse]
    ) -> None:
        await stream.recv_message()
        await stream.send_message(api_pb2.PreStartContainerResponse())
