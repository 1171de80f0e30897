"""Runners per NodeConfig: what the operator's handlers drive.

    manager = TelemetryManager(read_secret, cpu_usage=..., report=...)
    await manager.apply("wao-system/worker-0", parse_node_config(ns, name, spec))   # create / update
    await manager.remove("wao-system/worker-0")                                     # delete
    manager.snapshot()                                                              # status and metrics
    await manager.close()                                                           # at exit

`apply` replaces exactly the sources whose spec changed (their runner is stopped and awaited before the new
one starts, its value dropped: it came from another endpoint) and keeps the others running with their values.
Applying an unchanged spec does nothing, so handlers may call it on every event.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from rmd_operator.telemetry import fetchers
from rmd_operator.telemetry.credentials import SecretReader
from rmd_operator.telemetry.errors import INPUTS_UNAVAILABLE, CollectError
from rmd_operator.telemetry.fetchers import PredictorInputs
from rmd_operator.telemetry.runner import Outcome, Report, SourceRunner
from rmd_operator.telemetry.spec import DELTA_P, INLET_TEMP, NodeConfigSpec, Source, SourceKind
from rmd_operator.telemetry.state import DEFAULT_TTL_INTERVALS, Condition, SourceState, Transition

log = logging.getLogger(__name__)

# node name -> the node's CPU usage in percent of its capacity (WAO's predictor input), None if unknown.
CpuUsage = Callable[[str], Awaitable[float | None]]


@dataclass(frozen=True)
class SourceSnapshot:
    """One source of one NodeConfig at one moment. `value` is what is served: None once stale."""

    key: str
    namespace: str
    name: str
    node: str
    kind: SourceKind
    type: str
    value: float | None
    last_value: float | None
    value_time: float | None
    age: float | None
    stale: bool
    ttl: float
    errors_total: Mapping[str, int]
    conditions: tuple[Condition, ...]
    detail: str = ""

    def status(self) -> dict[str, Any]:
        """This source's entry in the NodeConfig's status (camelCase, RFC 3339 times)."""
        entry: dict[str, Any] = {
            "conditions": [
                {
                    "type": c.type,
                    "status": "True" if c.status else "False",
                    "reason": c.reason,
                    "message": c.message,
                    "lastTransitionTime": _rfc3339(c.since or 0.0),
                }
                for c in self.conditions
            ]
        }
        if self.last_value is not None and self.value_time is not None:
            entry["value"] = str(round(self.last_value, 6))  # a string, as quantities are: no float drift
            entry["time"] = _rfc3339(self.value_time)
        return entry


def _rfc3339(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


@dataclass
class _Running:
    source: Source
    state: SourceState
    runner: SourceRunner


@dataclass
class _Config:
    spec: NodeConfigSpec
    sources: dict[str, _Running] = field(default_factory=dict)


class TelemetryManager:
    def __init__(
        self,
        secrets: SecretReader,
        *,
        cpu_usage: CpuUsage | None = None,
        report: Report | None = None,
        ttl_intervals: float = DEFAULT_TTL_INTERVALS,
        wall: Callable[[], float] = time.time,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._secrets = secrets
        self._cpu_usage = cpu_usage
        self._report = report
        self._ttl_intervals = ttl_intervals
        self._wall, self._draw = wall, draw
        self._configs: dict[str, _Config] = {}
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # One pool for every pressure and inference call; no proxy from the environment, like the
            # operator's Kubernetes client: these endpoints sit on the cluster's own networks.
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session

    async def apply(self, key: str, spec: NodeConfigSpec) -> None:
        async with self._lock:
            config = self._configs.get(key)
            if config is not None and config.spec == spec:
                return
            old = config.sources if config is not None else {}
            same_place = config is not None and (config.spec.node_name, config.spec.namespace) == (
                spec.node_name,
                spec.namespace,
            )
            kept = {
                kind: running
                for kind, running in old.items()
                if same_place and spec.source(running.source.kind) == running.source
            }
            for kind, running in old.items():
                if kind not in kept:
                    await running.runner.stop()
            new = _Config(spec, dict(kept))
            self._configs[key] = new
            for source in spec.sources:
                if source.kind not in kept:
                    new.sources[source.kind] = self._start(key, spec, source)
            log.info(
                "telemetry for %s (node %s): %s",
                key,
                spec.node_name,
                ", ".join(sorted(new.sources)) or "none",
            )

    async def remove(self, key: str) -> None:
        async with self._lock:
            config = self._configs.pop(key, None)
            if config is not None:
                await asyncio.gather(*(r.runner.stop() for r in config.sources.values()))

    async def close(self) -> None:
        for key in list(self._configs):
            await self.remove(key)
        if self._session is not None:
            await self._session.close()

    def keys(self) -> list[str]:
        return sorted(self._configs)

    def runner(self, key: str, kind: str) -> SourceRunner | None:
        config = self._configs.get(key)
        running = config.sources.get(kind) if config else None
        return running.runner if running else None

    def _start(self, key: str, spec: NodeConfigSpec, source: Source) -> _Running:
        state = SourceState(ttl=source.interval * self._ttl_intervals)
        fetcher = None
        if source.problem is None:
            fetcher = fetchers.build(
                source,
                namespace=spec.namespace,
                node=spec.node_name,
                secrets=self._secrets,
                session=self._http(),
                inputs=lambda: self._inputs(key),
            )
        runner = SourceRunner(key, source, fetcher, state, self._on_outcome, wall=self._wall, draw=self._draw)
        runner.start()
        return _Running(source, state, runner)

    async def _on_outcome(self, outcome: Outcome) -> None:
        if outcome.transition is not None:
            _log_transition(outcome.key, outcome.source.kind, outcome.transition)
        if self._report is not None:
            result = self._report(outcome)
            if result is not None:
                await result

    def _fresh(self, key: str, kind: str) -> float | None:
        config = self._configs.get(key)
        running = config.sources.get(kind) if config else None
        if running is None or not running.state.fresh(self._wall()):
            return None
        return running.state.value

    async def _inputs(self, key: str) -> PredictorInputs:
        """The predictor's inputs from this NodeConfig's own fresh values and the node's CPU usage."""
        config = self._configs.get(key)
        node = config.spec.node_name if config else ""
        inlet, delta_p = self._fresh(key, INLET_TEMP), self._fresh(key, DELTA_P)
        cpu = await self._cpu_usage(node) if self._cpu_usage is not None else None
        missing = [
            name
            for name, value in (
                ("CPU usage", cpu),
                ("inlet temperature", inlet),
                ("differential pressure", delta_p),
            )
            if value is None
        ]
        if missing or cpu is None or inlet is None or delta_p is None:
            raise CollectError(INPUTS_UNAVAILABLE, f"no fresh {', '.join(missing)} for node {node}")
        return PredictorInputs(cpu, inlet, delta_p)

    def snapshot(self, only: str | None = None) -> list[SourceSnapshot]:
        """Every source's snapshot, or only those of NodeConfig `only` (a status write needs no others)."""
        now = self._wall()
        out = []
        configs = self._configs if only is None else {k: c for k, c in self._configs.items() if k == only}
        for key, config in sorted(configs.items()):
            spec = config.spec
            for _kind, running in sorted(config.sources.items()):
                state = running.state
                fresh = state.fresh(now)
                out.append(
                    SourceSnapshot(
                        key=key,
                        namespace=spec.namespace,
                        name=spec.name,
                        node=spec.node_name,
                        kind=running.source.kind,
                        type=running.source.term.type,
                        value=state.value if fresh else None,
                        last_value=state.value,
                        value_time=state.value_time,
                        age=state.age(now),
                        stale=state.value_time is not None and not fresh,
                        ttl=state.ttl,
                        errors_total=dict(state.errors_total),
                        conditions=state.conditions(now),
                        detail=state.detail,
                    )
                )
        return out


def _log_transition(key: str, kind: str, transition: Transition) -> None:
    level = logging.INFO if transition.kind == "Normal" else logging.WARNING
    log.log(level, "telemetry %s %s: %s: %s", key, kind, transition.reason, transition.message)
