"""Asyncio client for the kubelet PodResources v1 API (`<kubelet root>/pod-resources/kubelet.sock`).

Callers get small frozen dataclasses, never protobuf messages. What the kubelet reports (reference notes
numa-topology-podresources.md §1.4): `list()` covers active pods only, and a container's `cpu_ids` are only
its *exclusive* CPUs (empty for shared-pool containers); `get_allocatable()` CPUs are the online CPUs minus
the reserved set, not reduced by allocations; memory blocks appear only with the memory manager's Static
policy.

Errors: every call has a deadline. An unreachable socket or a missed deadline raises KubeletUnavailable;
any other failed call raises PodResourcesCallFailed (also a KubeletUnavailable, carrying the gRPC status).
`get()` returns None for a pod the kubelet does not know, instead of raising, and raises GetUnavailable when
the kubelet does not offer Get at all (rmd_agent.kubelet.pod_lookup then falls back to `list()`).

Turning a List answer of hundreds of pods into dataclasses costs far more CPU than the call itself, so
`list()` and `get_allocatable()` keep their last answer: the same bytes give the same objects without
parsing, and a pod whose message did not change keeps its object (the dataclasses are frozen, so sharing
them is safe). Callers can tell "nothing changed" by identity.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from grpclib.client import Channel, UnaryUnaryMethod
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from rmd_agent.errors import KubeletUnavailable
from rmd_agent.rpc import TRANSPORT_ERRORS, RawCodec
from rmd_api.kubelet.podresources.v1 import api_pb2

if TYPE_CHECKING:
    from rmd_agent.settings import AgentSettings

# grpclib sets no limit on an answer's size, so the 16 MiB the kubelet's own client allows
# (defaultPodResourcesMaxSize) needs no option here.
_SERVICE = "/v1.PodResourcesLister"

# Codes meaning "nobody answered in time", as opposed to "the kubelet answered with an error".
_UNREACHABLE = frozenset({Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED})

# What a kubelet whose KubeletPodResourcesGet feature gate is off (1.27 to 1.35; off by default before 1.34)
# answers Get: a plain Go error, which gRPC sends as status UNKNOWN with exactly this message
# (pkg/kubelet/apis/podresources/server_v1.go). From 1.36 the gate is GA and locked on.
GET_DISABLED_MESSAGE = "PodResources API Get method disabled"


class PodResourcesCallFailed(KubeletUnavailable):
    """The kubelet answered a PodResources call with an error status (rate limit, method disabled, ...).
    `details` is the kubelet's own message."""

    def __init__(self, message: str, code: Status, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class GetUnavailable(PodResourcesCallFailed):
    """The kubelet does not offer Get: its KubeletPodResourcesGet gate is off, or it predates Get (before
    1.27: UNIMPLEMENTED). Not a transient failure: List still answers."""


def get_unavailable(code: Status, details: str) -> bool:
    """Whether a failed Get means "this kubelet does not offer Get" (as opposed to any other failure)."""
    if code == Status.UNIMPLEMENTED:
        return True
    return code == Status.UNKNOWN and details.strip() == GET_DISABLED_MESSAGE


@dataclass(frozen=True)
class DeviceAssignment:
    """Device-plugin devices of one resource. The kubelet sends one entry per (device, NUMA node) pair."""

    resource: str
    ids: tuple[str, ...]
    numa_nodes: frozenset[int]  # empty when the device plugin reports no topology


@dataclass(frozen=True)
class MemoryBlock:
    """Memory-manager block: `memory_type` is "memory", "hugepages-2Mi" or "hugepages-1Gi"; size in bytes."""

    memory_type: str
    size: int
    numa_nodes: frozenset[int]


@dataclass(frozen=True)
class ContainerResources:
    name: str
    cpu_ids: frozenset[int]  # exclusive CPUs only
    devices: tuple[DeviceAssignment, ...] = ()
    memory: tuple[MemoryBlock, ...] = ()


@dataclass(frozen=True)
class PodResources:
    """One pod. The pod-level `cpu_ids`/`memory` are filled only with the PodLevelResourceManagers gate."""

    namespace: str
    name: str
    containers: tuple[ContainerResources, ...]
    cpu_ids: frozenset[int] = frozenset()
    memory: tuple[MemoryBlock, ...] = ()


@dataclass(frozen=True)
class AllocatableResources:
    cpu_ids: frozenset[int]
    devices: tuple[DeviceAssignment, ...] = ()
    memory: tuple[MemoryBlock, ...] = ()


class PodResourcesClient:
    """`async with PodResourcesClient(path) as client: pods = await client.list()`.

    `timeout` is the deadline of each call in seconds. Calls do not wait for the socket to appear, so a
    missing kubelet fails fast instead of using up the deadline.
    """

    def __init__(self, socket_path: Path, timeout: float = 5.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout = timeout
        self._channel: Channel | None = None
        self._methods: dict[str, UnaryUnaryMethod[Any, Any]] = {}
        self._last_list: tuple[bytes, list[PodResources]] | None = None
        self._pods_by_message: dict[bytes, PodResources] = {}
        self._last_allocatable: tuple[bytes, AllocatableResources] | None = None

    async def __aenter__(self) -> Self:
        # grpclib connects on the first call, and again after the kubelet restarted.
        channel = Channel(path=str(self.socket_path.absolute()), codec=RawCodec())
        self._channel = channel
        self._methods = {
            method: UnaryUnaryMethod(channel, f"{_SERVICE}/{method}", request, answer)
            for method, request, answer in (
                # bytes: compared before anything is parsed
                ("List", api_pb2.ListPodResourcesRequest, bytes),
                ("GetAllocatableResources", api_pb2.AllocatableResourcesRequest, bytes),
                ("Get", api_pb2.GetPodResourcesRequest, api_pb2.GetPodResourcesResponse),
            )
        }
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._methods = {}

    async def list(self) -> list[PodResources]:
        """Exclusive resources of every active pod on the node (objects reused while unchanged)."""
        raw: bytes = await self._call("List", api_pb2.ListPodResourcesRequest())
        if self._last_list is not None and self._last_list[0] == raw:
            return list(self._last_list[1])
        known, fresh = self._pods_by_message, {}
        pods = []
        for message in api_pb2.ListPodResourcesResponse.FromString(raw).pod_resources:
            key = message.SerializeToString(deterministic=True)
            pod = known.get(key) or _pod(message)
            fresh[key] = pod
            pods.append(pod)
        self._pods_by_message = fresh
        self._last_list = (raw, pods)
        return list(pods)

    async def get_allocatable(self) -> AllocatableResources:
        """What the kubelet may hand out: CPUs minus the reserved set, healthy devices, allocatable memory."""
        raw: bytes = await self._call("GetAllocatableResources", api_pb2.AllocatableResourcesRequest())
        if self._last_allocatable is not None and self._last_allocatable[0] == raw:
            return self._last_allocatable[1]
        response = api_pb2.AllocatableResourcesResponse.FromString(raw)
        allocatable = AllocatableResources(
            cpu_ids=frozenset(response.cpu_ids),
            devices=_devices(response.devices),
            memory=_memory(response.memory),
        )
        self._last_allocatable = (raw, allocatable)
        return allocatable

    async def get(self, namespace: str, name: str) -> PodResources | None:
        """One pod's resources, or None if the kubelet has no such pod.

        The kubelet reports a missing pod as a plain error "pod <name> in namespace <ns> not found" (status
        UNKNOWN over the wire), so that message is recognised as well as the NOT_FOUND status. A kubelet that
        does not offer Get raises GetUnavailable.
        """
        request = api_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        try:
            response = await self._call("Get", request)
        except PodResourcesCallFailed as exc:
            if exc.code == Status.NOT_FOUND or (
                exc.code == Status.UNKNOWN and _not_found_message(namespace, name) in exc.details
            ):
                return None
            if get_unavailable(exc.code, exc.details):
                raise GetUnavailable(str(exc), exc.code, exc.details) from exc
            raise
        return _pod(response.pod_resources)

    async def _call(self, method: str, request: Any) -> Any:
        if not self._methods:
            raise RuntimeError("PodResourcesClient used outside `async with`")
        where = f"kubelet PodResources {method} on {self.socket_path}"
        try:
            return await self._methods[method](request, timeout=self.timeout)
        except GRPCError as exc:
            code, details = exc.status, exc.message or ""
            if code == Status.DEADLINE_EXCEEDED:
                raise KubeletUnavailable(f"{where}: no answer within {self.timeout:g}s") from exc
            if code in _UNREACHABLE:
                raise KubeletUnavailable(f"{where}: unreachable ({details})") from exc
            raise PodResourcesCallFailed(f"{where}: {code.name}: {details}", code, details) from exc
        except TimeoutError as exc:  # the deadline passed while connecting
            raise KubeletUnavailable(f"{where}: no answer within {self.timeout:g}s") from exc
        except TRANSPORT_ERRORS as exc:
            raise KubeletUnavailable(f"{where}: unreachable ({exc or type(exc).__name__})") from exc


def pod_resources_client(settings: AgentSettings) -> PodResourcesClient:
    """A client (not yet entered) of the kubelet that `settings` name, with their call deadline."""
    return PodResourcesClient(
        settings.host_path(settings.pod_resources_socket), timeout=settings.kubelet_timeout_seconds
    )


def _not_found_message(namespace: str, name: str) -> str:
    return f"pod {name} in namespace {namespace} not found"


def _numa(topology: api_pb2.TopologyInfo) -> frozenset[int]:
    return frozenset(node.ID for node in topology.nodes)


def _devices(entries: Iterable[api_pb2.ContainerDevices]) -> tuple[DeviceAssignment, ...]:
    return tuple(
        DeviceAssignment(resource=d.resource_name, ids=tuple(d.device_ids), numa_nodes=_numa(d.topology))
        for d in entries
    )


def _memory(entries: Iterable[api_pb2.ContainerMemory]) -> tuple[MemoryBlock, ...]:
    return tuple(
        MemoryBlock(memory_type=m.memory_type, size=m.size, numa_nodes=_numa(m.topology)) for m in entries
    )


def _pod(message: api_pb2.PodResources) -> PodResources:
    return PodResources(
        namespace=message.namespace,
        name=message.name,
        containers=tuple(
            ContainerResources(
                name=c.name,
                cpu_ids=frozenset(c.cpu_ids),
                devices=_devices(c.devices),
                memory=_memory(c.memory),
            )
            for c in message.containers
        ),
        cpu_ids=frozenset(message.cpu_ids),
        memory=_memory(message.memory),
    )
