"""The contract between the agent's engine (which enforces workloads on the node) and its front ends (the gRPC
service, the HTTP health endpoints, later the device plugin and RmdNodeState writer).

Front ends speak these types only; protobuf stays in the server layer, kernel I/O stays in the engine.
Errors the engine raises on purpose: WorkloadRejected (invalid / capacity / conflict), EngineUnavailable
(cannot act now, e.g. resctrl not mounted), KubeletUnavailable (PodResources unreachable).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from rmd_agent.errors import AgentError
from rmd_agent.plan.mba import MbaApplied
from rmd_agent.plan.workload import Pool, Workload

GUARANTEED_POOL = str(Pool.GUARANTEED)


class EngineUnavailable(AgentError):
    """The engine cannot act right now (resctrl not mounted, still starting, shutting down); retry later."""


@dataclass(frozen=True)
class PstateOutcome:
    supported: bool
    detail: str  # what was applied, or why P-state is unsupported on this node


@dataclass(frozen=True)
class AppliedWorkload:
    """A workload as enforced on this node. `workload` is resolved: concrete CPUs, policy values filled in."""

    workload: Workload
    id: str  # stable on this node across restarts
    cos_name: str  # the resctrl group holding its CPUs ("" when it has no cache/MBA part)
    pool: str  # guaranteed, besteffort, shared, none
    cache: dict[int, int] = field(default_factory=dict)  # L3 cache id -> capacity bitmask
    mba: dict[int, int] = field(default_factory=dict)  # MB domain -> value written
    pstate: PstateOutcome | None = None  # None when the workload asks for no P-state
    status: str = "Successful"
    mba_applied: MbaApplied | None = None  # its MBA request and the value held (kernel-rounded); None: no MBA


@dataclass(frozen=True)
class CacheDomainSummary:
    cache_id: int
    cpus: frozenset[int]
    ways: int
    free_ways: dict[str, int]  # pool name -> ways still free


@dataclass(frozen=True)
class NodeSummary:
    node_name: str
    capabilities: dict[str, tuple[bool, str]]  # the probe's findings: feature -> (supported, detail)
    cpus: int
    numa_nodes: int
    caches: tuple[CacheDomainSummary, ...]
    closids_total: int
    closids_used: int  # root and foreign groups included
    workloads: int


class CpuState(StrEnum):
    ALLOCATED = "allocated"
    NOT_YET_ALLOCATED = "not-yet-allocated"
    NOT_EXCLUSIVE = "not-exclusive"


@dataclass(frozen=True)
class ContainerCpus:
    state: CpuState
    cpus: frozenset[int] = frozenset()
    detail: str = ""


class Engine(Protocol):
    async def apply(self, workload: Workload) -> tuple[AppliedWorkload, bool]:
        """Enforce (create or update) a workload; returns it and whether anything changed. Idempotent."""
        ...

    async def remove(self, namespace: str, name: str, uid: str = "") -> bool:
        """Release a workload (uid "" matches any); False if the node did not have it."""
        ...

    async def list(self) -> list[AppliedWorkload]: ...

    async def node(self) -> NodeSummary: ...

    async def container_cpus(self, namespace: str, pod: str, uid: str, container: str) -> ContainerCpus:
        """A container's exclusive CPUs from the kubelet (PodResources, cross-checked by pod uid)."""
        ...

    async def ready(self) -> tuple[bool, str]:
        """Whether the engine has reconciled with the node and can serve; the reason when not."""
        ...


ChangeListener = Callable[[], None]


@runtime_checkable
class ChangeNotifier(Protocol):
    """An engine that tells when what it reports changed, so its readers need not poll it."""

    def add_change_listener(self, listener: ChangeListener) -> None:
        """Call `listener()` on the event loop after every change of what list(), node()'s caches and
        ready() answer: a workload applied or removed with an effect, a reconcile, readiness turning."""
        ...


class ManagedEngine(Engine, Protocol):
    """An Engine with a lifecycle: start() reconciles with the node, close() releases what it holds."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...
