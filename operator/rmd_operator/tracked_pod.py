"""What the pod flow knows of one pod, shared by its parts (pod_flow, pod_cpus, pod_outcomes)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from rmd_operator import pods
from rmd_operator.pod_objects import Obj

log = logging.getLogger(__name__)


@dataclass
class TrackedPod:
    """What this process knows of one pod (by uid)."""

    request: pods.PodRequest
    ref: Obj  # for Events
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # container -> its task
    states: dict[str, str] = field(default_factory=dict)  # container -> last status seen on the node
    written: set[str] = field(default_factory=set)  # containers whose workload this process wrote
    posted: set[tuple[str, str]] = field(default_factory=set)  # (reason, message) of refusals posted
    troubles: set[str] = field(default_factory=set)  # keys of CpuLookupProblems posted
    stopping: bool = False  # terminating or finished: nothing is created any more
    deleting: bool = False  # the flow deleted the pod
    awaiting_kubelet: bool = False  # bound, but its kubelet has not taken it yet (pods.awaiting_kubelet)

    async def nap(self, seconds: float) -> None:
        """Sleep `seconds`, or less if something about the pod or its node's agent changed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), seconds)
        self.wake.clear()


def deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def ways_text(want: pods.ContainerRequest) -> str:
    if want.policy is not None:
        return f"policy {want.policy}"
    low = want.cache_min if want.cache_min is not None else want.ways
    return f"{want.ways} cache ways" if low == want.ways else f"{low}-{want.ways} cache ways (best effort)"


async def guarded(coro: Coroutine[Any, Any, None]) -> None:
    """Run a pod flow job, logging its failure: one pod's trouble must not end the flow."""
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("pod flow job failed")
