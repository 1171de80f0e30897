"""Per-workload RDT metrics: cache ways allocated, and LLC occupancy and memory bandwidth from resctrl
monitoring (`<group>/mon_data/mon_L3_<id>/{llc_occupancy,mbm_total_bytes,mbm_local_bytes}`) where the
CPU and kernel have it.

The workload list comes from a provider (the engine's `list`, async or not); collection itself must not
await or block on the engine, so `refresh()` (run as a task by `run()`) reads everything into an immutable
snapshot and `collect()` only renders the latest one.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from rmd_agent.engine_api import AppliedWorkload
from rmd_agent.hostfs import HostFS, read_small
from rmd_agent.metrics import catalog
from rmd_agent.observe.resctrl import RESCTRL

log = logging.getLogger(__name__)

WorkloadsProvider = Callable[[], Awaitable[Sequence[AppliedWorkload]] | Sequence[AppliedWorkload]]
NAMES = (
    "rmd_workload_cache_ways",
    "rmd_workload_llc_occupancy_bytes",
    "rmd_workload_memory_bandwidth_bytes_total",
    "rmd_agent_rdt_refresh_errors_total",
)
_MON_DOMAIN = re.compile(r"^mon_L3_(\d+)$")


@dataclass(frozen=True)
class GroupMonitoring:
    """One resctrl group's monitoring counters per L3 domain (absent events are left out)."""

    llc_occupancy: dict[int, int] = field(default_factory=dict)
    mbm_total: dict[int, int] = field(default_factory=dict)
    mbm_local: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkloadRdt:
    namespace: str
    name: str
    cos: str
    ways: dict[int, int]  # cache id -> ways in the workload's mask
    monitoring: GroupMonitoring


@dataclass(frozen=True)
class RdtSnapshot:
    workloads: tuple[WorkloadRdt, ...] = ()
    errors: int = 0


def _read_counter(path: str) -> int | None:
    """A monitoring file's value; None when the kernel answers "Unavailable" (RMID not counting yet) or
    the event does not exist on this CPU."""
    try:
        text = read_small(path).strip()  # not open(): its buffered file object costs 3x the read itself
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def read_group_monitoring(fs: HostFS, group: str, resctrl: str = RESCTRL) -> GroupMonitoring | None:
    """Monitoring counters of a resctrl group ("" = the root group); None without mon_data."""
    base = fs.path(f"{resctrl}/{group}/mon_data" if group else f"{resctrl}/mon_data")
    try:
        domains = os.listdir(base)
    except FileNotFoundError:
        return None
    result = GroupMonitoring()
    for domain in domains:
        match = _MON_DOMAIN.match(domain)
        if not match:
            continue
        cache_id = int(match.group(1))
        for event, target in (
            ("llc_occupancy", result.llc_occupancy),
            ("mbm_total_bytes", result.mbm_total),
            ("mbm_local_bytes", result.mbm_local),
        ):
            value = _read_counter(os.path.join(base, domain, event))
            if value is not None:
                target[cache_id] = value
    return result


class RdtCollector(Collector):
    def __init__(self, fs: HostFS, workloads: WorkloadsProvider, *, resctrl: str = RESCTRL) -> None:
        self.fs = fs
        self.workloads = workloads
        self.resctrl = resctrl
        self._snapshot = RdtSnapshot()

    def snapshot(self) -> RdtSnapshot:
        return self._snapshot

    async def refresh(self) -> RdtSnapshot:
        """Read the workloads and their groups' monitoring counters; failures are counted, not raised."""
        errors = self._snapshot.errors
        try:
            listed = self.workloads()
            applied = await listed if inspect.isawaitable(listed) else listed
        except Exception as exc:  # the engine may be restarting; keep the previous figures
            log.warning("RDT metrics: cannot list workloads: %s", exc)
            self._snapshot = RdtSnapshot(self._snapshot.workloads, errors + 1)
            return self._snapshot
        rows: list[WorkloadRdt] = []
        groups: dict[str, GroupMonitoring | None] = {}
        for item in applied:
            if not item.cos_name:
                continue  # no cache or MBA part: nothing RDT to report
            if item.cos_name not in groups:
                try:
                    groups[item.cos_name] = read_group_monitoring(self.fs, item.cos_name, self.resctrl)
                except (OSError, ValueError) as exc:
                    log.debug("RDT monitoring of %s: %s", item.cos_name, exc)
                    errors += 1
                    groups[item.cos_name] = None
            ways = {cache_id: mask.bit_count() for cache_id, mask in item.cache.items()}
            rows.append(
                WorkloadRdt(
                    item.workload.namespace,
                    item.workload.name,
                    item.cos_name,
                    ways,
                    groups[item.cos_name] or GroupMonitoring(),
                )
            )
        self._snapshot = RdtSnapshot(tuple(rows), errors)
        return self._snapshot

    async def run(self, interval: float = 15.0, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.refresh()
            except Exception:
                log.exception("RDT metrics refresh failed")
                self._snapshot = RdtSnapshot(self._snapshot.workloads, self._snapshot.errors + 1)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    def describe(self) -> Iterator[Metric]:
        for name in NAMES:
            yield catalog.family(name)

    def collect(self) -> Iterator[Metric]:
        yield from render(self._snapshot)


def render(snap: RdtSnapshot) -> Iterator[Metric]:
    fam = {name: catalog.family(name) for name in NAMES}

    def add(name: str, labels: list[str], value: float) -> None:
        fam[name].add_metric(labels, value)  # type: ignore[attr-defined]

    for row in snap.workloads:
        for cache_id, ways in sorted(row.ways.items()):
            add("rmd_workload_cache_ways", [row.namespace, row.name, row.cos, str(cache_id)], ways)
        mon = row.monitoring
        for cache_id, value in sorted(mon.llc_occupancy.items()):
            add("rmd_workload_llc_occupancy_bytes", [row.namespace, row.name, row.cos, str(cache_id)], value)
        for scope, counters in (("total", mon.mbm_total), ("local", mon.mbm_local)):
            for cache_id, value in sorted(counters.items()):
                labels = [row.namespace, row.name, row.cos, str(cache_id), scope]
                add("rmd_workload_memory_bandwidth_bytes_total", labels, value)
    add("rmd_agent_rdt_refresh_errors_total", [], snap.errors)
    yield from fam.values()
