"""P-state monitors that follow the workloads the engine enforces (docs/pstate.md).

The engine calls `follow()` after every change with the accepted workloads; `PStateSync` starts, changes and
stops their monitors through its `PStateController`. The cpufreq limits as they were before a monitor's first
write (the originals) must outlive a crash, so they live in the engine's state file: `originals_for()` reads
those of CPUs about to get a monitor while the engine writes its intent (write-ahead, docs/durability.md),
and every later change of them is handed to the engine's `save` callback. `restore()` on start writes back
what a previous run left changed; `close()` writes back everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from rmd_agent.engine_api import PstateOutcome
from rmd_agent.errors import AgentError, HostReadError
from rmd_agent.plan.pstate_request import pstate_request
from rmd_agent.plan.workload import Workload
from rmd_agent.pstate.cpufreq_control import CpufreqWriteError
from rmd_agent.pstate.plugin import PStateController, PStateResult, PStateState
from rmd_agent.pstate.policy import FreqLimits

log = logging.getLogger(__name__)

Params = tuple[frozenset[int], float, bool]  # CPUs, ratio, monitoring: what a monitor was started with
SaveOriginals = Callable[[Mapping[int, FreqLimits]], Awaitable[None]]


class PStateSync:
    """Use from the engine's event loop, one call at a time (the engine's lock)."""

    def __init__(self, controller: PStateController, save: SaveOriginals) -> None:
        self.controller = controller
        self._save = save
        self._params: dict[str, Params | None] = {}  # workloads that ask for a P-state; None: no monitor

    def params(self, key: str) -> Params | None:
        return self._params.get(key)

    async def restore(self, saved: Mapping[int, FreqLimits]) -> None:
        """Write back limits a previous run left changed (it may have died with a core pinned)."""
        control = self.controller.control
        control.adopt_originals(saved)
        try:
            await asyncio.to_thread(control.restore_all)
        except CpufreqWriteError as exc:
            log.error("restoring the frequency limits a previous run changed: %s", exc)
        await self._save(control.originals)

    def originals_for(
        self, accepted: Sequence[Workload], saved: Mapping[int, FreqLimits]
    ) -> dict[int, FreqLimits]:
        """The saved original cpufreq limits plus those of CPUs about to get a P-state monitor, read now,
        before the monitor's first write (write-ahead, so a restart restores the true originals). Blocking:
        for the engine's worker thread."""
        originals = dict(saved)
        for w in accepted:
            request = pstate_request(w)
            if request is None or not request[1]:
                continue
            for cpu in sorted(w.core_ids - originals.keys()):
                with contextlib.suppress(HostReadError):  # no cpufreq: the monitor writes nothing
                    originals[cpu] = self.controller.control.read_limits(cpu)
        return originals

    async def follow(self, accepted: Sequence[Workload], saved: Mapping[int, FreqLimits]) -> None:
        """Start, change or stop monitors to match `accepted`, then save the originals."""
        controller = self.controller
        controller.control.adopt_originals(saved)
        wanted: dict[str, Params | None] = {}
        for w in accepted:
            request = pstate_request(w)
            if request is not None:
                ratio, monitoring = request
                wanted[w.key] = (w.core_ids, ratio, True) if monitoring and ratio is not None else None
        for key, params in list(self._params.items()):
            if wanted.get(key, ()) != params:
                try:
                    await controller.remove(key)
                except CpufreqWriteError as exc:
                    log.error("P-state of %s: %s", key, exc)
                del self._params[key]
        for key, params in wanted.items():
            if key in self._params:
                continue
            if params is not None:
                try:
                    await controller.apply(key, *params)
                except AgentError as exc:  # e.g. PStateConflict; the cache part stays enforced
                    log.error("P-state of %s: %s", key, exc)
            self._params[key] = params
        monitored = frozenset().union(*(p[0] for k, p in self._params.items() if p and controller.monitor(k)))
        idle = set(controller.control.originals) - monitored
        if idle:  # read ahead for a monitor that did not start, or left over: nothing to keep
            try:
                await asyncio.to_thread(controller.control.restore, idle)
            except CpufreqWriteError as exc:
                log.error("restoring frequency limits: %s", exc)
        await self._save(controller.control.originals)

    def outcome(self, w: Workload) -> PstateOutcome | None:
        """The P-state part of `w`'s status; None when it asks for none."""
        if pstate_request(w) is None:
            return None
        result = self.controller.results.get(w.key) or PStateResult(PStateState.OFF)
        return PstateOutcome(result.state is not PStateState.UNSUPPORTED, result.reason or result.status)

    async def close(self) -> None:
        """Stop every monitor, write back every limit, save the originals that are left (none, normally)."""
        try:
            await self.controller.close()
        except CpufreqWriteError as exc:
            log.error("restoring frequency limits on close: %s", exc)
        await self._save(self.controller.control.originals)
