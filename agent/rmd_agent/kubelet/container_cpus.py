"""A container's exclusive CPUs, as the operator asks for them (GetContainerCpus): PodResources through
PodLookup, cross-checked by pod uid against the CPU manager's checkpoint, since PodResources names pods by
namespace and name only and would answer for a newer pod of the same name."""

from __future__ import annotations

import asyncio
import logging

from rmd_agent.engine_api import ContainerCpus, CpuState
from rmd_agent.errors import CheckpointError, HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.checkpoints import read_cpu_manager_state
from rmd_agent.kubelet.pod_lookup import PodLookup
from rmd_api.cpuset import MAX_CPU_ID, CpuListError, format_cpu_list, parse_cpu_list
from rmd_api.kubelet.checkpoint import CpuManagerState

log = logging.getLogger(__name__)


class ContainerCpuLookup:
    """Answers `Engine.container_cpus` through `lookup` (whose client the caller opens and closes)."""

    def __init__(self, lookup: PodLookup, fs: HostFS, kubelet_dir: str) -> None:
        self.lookup = lookup
        self.fs = fs
        self.kubelet_dir = kubelet_dir

    async def container_cpus(self, namespace: str, pod: str, uid: str, container: str) -> ContainerCpus:
        """KubeletUnavailable when PodResources cannot answer."""
        found = await self.lookup.find(namespace, pod)
        if found is None:
            api = self.lookup.api
            via = f" (PodResources {api.describe()})" if api.get is False else ""
            return ContainerCpus(
                CpuState.NOT_YET_ALLOCATED, detail=f"the kubelet has no pod {namespace}/{pod}{via}"
            )
        entry = next((c for c in found.containers if c.name == container), None)
        if entry is None:
            return ContainerCpus(
                CpuState.NOT_YET_ALLOCATED,
                detail=f"the kubelet lists no container {container!r} in pod {namespace}/{pod} (yet)",
            )
        if not entry.cpu_ids:
            return ContainerCpus(
                CpuState.NOT_EXCLUSIVE,
                detail=f"container {container!r} of pod {namespace}/{pod} has no exclusive CPUs (it needs a "
                "Guaranteed pod with integer CPUs and the static CPU manager policy)",
            )
        beyond = sorted(cpu for cpu in entry.cpu_ids if not 0 <= cpu <= MAX_CPU_ID)
        if beyond:
            # PodResources ids are int64, the answer's int32: a kubelet's garbage would fail the answer.
            return ContainerCpus(
                CpuState.NOT_YET_ALLOCATED,
                detail=f"the kubelet reports CPU id {beyond[0]} for container {container!r} of pod "
                f"{namespace}/{pod}, which no Linux CPU has (0..{MAX_CPU_ID})",
            )
        if uid:
            problem = await asyncio.to_thread(self._cross_check, uid, container, entry.cpu_ids)
            if problem:
                return ContainerCpus(CpuState.NOT_YET_ALLOCATED, detail=problem)
        return ContainerCpus(CpuState.ALLOCATED, entry.cpu_ids)

    def _cross_check(self, uid: str, container: str, cpus: frozenset[int]) -> str | None:
        try:
            checkpoint = read_cpu_manager_state(self.fs, self.kubelet_dir)
        except (CheckpointError, HostReadError) as exc:
            log.warning("cpu_manager_state is unusable, relying on PodResources alone: %s", exc)
            return None
        if isinstance(checkpoint, Unsupported):
            return None
        return cross_check_cpus(checkpoint, uid, container, cpus)


def cross_check_cpus(state: CpuManagerState, uid: str, container: str, cpus: frozenset[int]) -> str | None:
    """Why the kubelet's checkpoint disagrees that pod `uid`'s `container` holds `cpus`; None if it agrees
    (or cannot tell: a v1 checkpoint is keyed by container ID, which only the kubelet can map)."""
    if not state.entries:
        return None
    recorded = state.entries.get(uid, {}).get(container)
    if recorded is None:
        holders = sorted(
            u
            for u, containers in state.entries.items()
            for text in containers.values()
            if _parse_or_empty(text) & cpus
        )
        where = f"; CPUs {format_cpu_list(cpus)} belong to pod uid {holders[0]} there" if holders else ""
        return f"cpu_manager_state has no CPUs for pod uid {uid} container {container}{where}"
    if _parse_or_empty(recorded) != cpus:
        return (
            f"PodResources reports CPUs {format_cpu_list(cpus)} but cpu_manager_state records {recorded} for "
            f"pod uid {uid} container {container}"
        )
    return None


def _parse_or_empty(text: str) -> frozenset[int]:
    try:
        return parse_cpu_list(text)
    except CpuListError:
        return frozenset()
