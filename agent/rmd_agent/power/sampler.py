"""The power sampling task: every interval, read RAPL, /proc/stat and pod cgroups, attribute, publish.

Each sample ends in one immutable `PowerSnapshot`; the metrics collector reads whichever snapshot is
current, so a scrape never mixes two intervals. A sample never raises for host problems: a missing or
unreadable RAPL tree, an unreadable cgroup or a vanished pod is counted under `errors` by source and the
sample goes on with what it has (RAPL is looked for again every `rediscover_seconds`). Anything else is
caught by `run()`, counted as "internal", logged, and the loop keeps its schedule: no crash loop.

The snapshot is built when it is first read after a sample (a scrape), not by every sample: at a 1 s
interval and a 15 s scrape, fourteen of fifteen would never be read.

`sample()` runs in the event loop's thread on purpose: it is small file reads and arithmetic, tens of
milliseconds at 500 pods (bench/power_overhead.py), and running it between other tasks, not beside them,
means a test driving a simulated node from the same loop always sees a consistent node.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rmd_agent.errors import HostReadError
from rmd_agent.hostfs import HostFS
from rmd_agent.power.attribution import CpuDeltas, EnergyLedger, ZoneKey
from rmd_agent.power.cpu_time import USER_HZ, CgroupCpuReader, PodCpuReading, ProcStat, read_proc_stat
from rmd_agent.power.pod_meta import KubeletLogDirs, PodMeta, PodMetaSource
from rmd_agent.power.rapl_sampler import RaplSampler, host_zone_kinds

log = logging.getLogger(__name__)

POD_OVERHEAD = ""  # container label for a pod's CPU outside its named containers (sandbox, conmon)
ERROR_SOURCES = ("rapl", "proc_stat", "cgroup", "internal")
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True)
class NodeZone:
    key: ZoneKey
    energy_j: float
    active_j: float
    idle_j: float
    watts: float
    active_watts: float
    idle_watts: float


@dataclass(frozen=True)
class PodEnergy:
    uid: str
    namespace: str
    name: str
    energy_j: Mapping[str, float]  # zone kind -> joules since the agent started
    watts: Mapping[str, float]  # zone kind -> watts over the last interval
    terminated: bool = False


@dataclass(frozen=True)
class ContainerEnergy:
    uid: str
    namespace: str
    pod: str
    container: str  # POD_OVERHEAD for the pod's own remainder and unidentified containers
    energy_j: Mapping[str, float]
    watts: Mapping[str, float]
    terminated: bool = False


@dataclass(frozen=True)
class SamplerStats:
    samples: int = 0
    errors: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_SOURCES, 0))
    duration_buckets: tuple[int, ...] = (0,) * len(DURATION_BUCKETS)  # cumulative counts per bound
    duration_sum: float = 0.0
    last_duration: float = 0.0
    last_sample_time: float = 0.0  # wall clock (seconds since the epoch) of the last sample


@dataclass(frozen=True)
class PowerSnapshot:
    seq: int  # 0 before the first sample
    rapl_reason: str  # "" when RAPL is read, else why not
    interval_seconds: float  # length of the interval the watts are over (0 before two samples)
    busy_ratio: float
    zones: tuple[NodeZone, ...] = ()
    host_kinds: tuple[str, ...] = ()  # the zone kinds whose sum is the host total (no overlap)
    pods: tuple[PodEnergy, ...] = ()
    containers: tuple[ContainerEnergy, ...] = ()
    system_j: Mapping[str, float] = field(default_factory=dict)
    system_watts: Mapping[str, float] = field(default_factory=dict)
    stats: SamplerStats = field(default_factory=SamplerStats)

    @property
    def rapl_available(self) -> bool:
        return not self.rapl_reason

    def host_energy_j(self) -> float:
        return sum(z.energy_j for z in self.zones if z.key.kind in self.host_kinds)

    def host_watts(self) -> float:
        return sum(z.watts for z in self.zones if z.key.kind in self.host_kinds)


@dataclass
class _Terminated:
    pod: PodEnergy
    containers: tuple[ContainerEnergy, ...]


class PowerSampler:
    """Owns the readers, the ledger and the current snapshot. Call `sample()` or run `run()` as a task."""

    def __init__(
        self,
        fs: HostFS,
        *,
        interval: float = 5.0,
        pod_meta: PodMetaSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rediscover_seconds: float = 60.0,
        meta_grace_seconds: float = 30.0,
        max_terminated: int = 500,
    ) -> None:
        self.fs = fs
        self.interval = interval
        self.clock = clock
        self.wall_clock = wall_clock
        self.rediscover_seconds = rediscover_seconds
        self.meta_grace_seconds = meta_grace_seconds
        self.max_terminated = max_terminated
        self.rapl = RaplSampler(fs)
        self.cgroups = CgroupCpuReader(fs)
        self.pod_meta: PodMetaSource = pod_meta if pod_meta is not None else KubeletLogDirs(fs)
        self.ledger = EnergyLedger()
        self._lock = threading.Lock()
        self._snapshot: PowerSnapshot | None = PowerSnapshot(0, "not sampled yet", 0.0, 0.0)  # None: build
        self._stats = SamplerStats()
        self._last_time: float | None = None
        self._interval_seconds = 0.0  # length of the last interval
        self._last_discovery: float | None = None
        self._proc: ProcStat | None = None
        self._pod_usage: dict[str, int] = {}  # uid -> ns, last reading
        self._container_usage: dict[tuple[str, str], int] = {}  # (uid, container id) -> ns
        self._pods_seen: set[str] = set()
        self._first_seen: dict[str, float] = {}
        self._meta: dict[str, PodMeta] = {}  # sticky once known: uid -> namespace/name
        self._names: dict[tuple[str, str], str] = {}  # sticky: (uid, container id) -> name
        # containers without a name (the sandbox, or one whose name is not known yet) are not read: their
        # CPU time is the pod's remainder either way; once named, the first read is only a baseline
        self._unnamed: set[tuple[str, str]] = set()
        self._named_since: set[tuple[str, str]] = set()
        self._complete = False
        self._terminated: dict[str, _Terminated] = {}
        self._rapl_errors_logged = False

    # --- reading the result ---

    def snapshot(self) -> PowerSnapshot:
        with self._lock:
            if self._snapshot is None:
                self._snapshot = self._build()
            return self._snapshot

    def mark_exported(self, uids: set[str]) -> None:
        """Terminated pods a scrape has now seen: they are dropped, from this snapshot on."""
        if not uids:
            return
        with self._lock:
            for uid in uids:
                self._terminated.pop(uid, None)
            snap = self._snapshot
            if snap is None:  # the next build leaves them out
                return
            self._snapshot = dataclasses.replace(
                snap,
                pods=tuple(p for p in snap.pods if not (p.terminated and p.uid in uids)),
                containers=tuple(c for c in snap.containers if not (c.terminated and c.uid in uids)),
            )

    # --- the task ---

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Sample every `interval` seconds (fixed rate, on the event loop's clock; `clock` only measures
        intervals) until cancelled or `stop` is set; then close the files it keeps open."""
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        try:
            while not stop.is_set():
                try:
                    self.sample()
                except Exception:
                    self._count("internal")
                    log.exception("power sample failed; continuing with the next interval")
                deadline += self.interval
                delay = deadline - loop.time()
                if delay < 0:  # fell behind (suspended, overloaded): resume the schedule from now
                    deadline, delay = loop.time(), 0.0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
        finally:
            self.close()

    def close(self) -> None:
        """Close the cgroup files kept open between samples (a later sample opens them again)."""
        with self._lock:
            self.cgroups.files.close()

    def sample(self) -> None:
        """Take one sample; `snapshot()` shows it. Holds the lock throughout: a scrape thread marking
        terminated pods exported must not interleave with the sample moving pods in and out."""
        with self._lock:
            self._sample()
            self._snapshot = None

    def _sample(self) -> None:
        started = time.perf_counter()
        now = self.clock()
        errors: dict[str, int] = {}
        zone_energy = self._read_rapl(now, errors)
        proc = self._read_proc(errors)
        reading = self.cgroups.read()
        if reading.errors:
            errors["cgroup"] = len(reading.errors)
            log.debug("cgroup read errors: %s", "; ".join(reading.errors[:5]))
        seconds = now - self._last_time if self._last_time is not None else 0.0
        self._interval_seconds = seconds
        self._revive(reading.pods)
        self._resolve_meta(reading)
        cpu, containers_now = self._cpu_deltas(proc, reading)
        for uid in reading.pods:
            self._first_seen.setdefault(uid, now)
        self.ledger.track(reading.pods, containers_now, {z.key.kind for z in self.rapl.zones})
        if self._last_time is not None:
            self.ledger.record(seconds, zone_energy, cpu)
        self._skip_unnamed(reading)
        if reading.complete:
            gone = [u for u in self.ledger.pods if u not in reading.pods and u not in reading.unreadable]
            for uid in gone:
                self._terminate(uid)
            if gone or len(self._meta) > len(self.ledger.pods):
                live = set(self.ledger.pods)
                self._meta = {u: m for u, m in self._meta.items() if u in live}
                self._names = {k: v for k, v in self._names.items() if k[0] in live}
        self._last_time = now
        self._proc = proc if proc is not None else self._proc
        self._complete = reading.complete
        self._pods_seen = set(reading.pods) | set(reading.unreadable)
        self._finish_stats(errors, time.perf_counter() - started)

    # --- steps ---

    def _read_rapl(self, now: float, errors: dict[str, int]) -> dict[ZoneKey, float]:
        if self.rapl.status is not None and (
            self._last_discovery is None or now - self._last_discovery >= self.rediscover_seconds
        ):
            self._last_discovery = now
            if self.rapl.discover() is not None:
                if not self._rapl_errors_logged:
                    log.warning("no RAPL energy on this node: %s", self.rapl.status)
                    self._rapl_errors_logged = True
            else:
                log.info("RAPL zones: %s", ", ".join(f"{z.zone_id}={z.key.kind}" for z in self.rapl.zones))
        if not self.rapl.zones:
            return {}
        deltas, reading = self.rapl.sample()
        if reading.errors:
            errors["rapl"] = len(reading.errors)
            log.debug("RAPL read errors: %s", "; ".join(reading.errors))
        return {key: uj / 1e6 for key, uj in deltas.items()}

    def _read_proc(self, errors: dict[str, int]) -> ProcStat | None:
        try:
            return read_proc_stat(self.fs)
        except HostReadError as exc:
            errors["proc_stat"] = 1
            log.debug("%s", exc)
            return None

    def _cpu_deltas(
        self, proc: ProcStat | None, reading: PodCpuReading
    ) -> tuple[CpuDeltas, list[tuple[str, str]]]:
        busy = total = 0.0
        if proc is not None and self._proc is not None:
            busy = max(0, proc.busy_ticks - self._proc.busy_ticks) / USER_HZ
            total = max(0, proc.total_ticks - self._proc.total_ticks) / USER_HZ
        first = self._last_time is None
        pod_usage, container_usage, names = self._pod_usage, self._container_usage, self._names
        pods: dict[str, float] = {}
        containers: dict[str, dict[str, float]] = {}
        present: list[tuple[str, str]] = []
        for uid, pod in reading.pods.items():
            # A pod absent from a complete previous reading started since: all its CPU time is new.
            new_pod = not first and self._complete and uid not in self._pods_seen
            previous = pod_usage.get(uid)
            # CPU time never goes down: a lower figure is a read torn by a concurrent update or skewed, so
            # the higher one stays the baseline (taking the lower would credit the difference twice)
            if previous is None:
                pod_ns = pod.usage_ns if new_pod else 0
                pod_usage[uid] = pod.usage_ns
            elif pod.usage_ns > previous:
                pod_ns = pod.usage_ns - previous
                pod_usage[uid] = pod.usage_ns
            else:
                pod_ns = 0
            # A container not read last time may have started since (unless nothing was read last time),
            # or may have run unseen (not listed yet, or left unread without a name), its CPU time in the
            # pod's remainder so far: it is paid at most this interval's remainder, never its whole life.
            started = not first and (new_pod or previous is not None)
            by_name: dict[str, int] = {}
            first_seen: list[tuple[str, int]] = []
            for cid, (_runtime, usage) in pod.containers.items():
                key = (uid, cid)
                before = container_usage.get(key)
                if key in self._named_since:  # was left unread: only a baseline now
                    self._named_since.discard(key)
                    before = None
                    delta = 0
                    container_usage[key] = usage
                elif before is None:
                    delta = 0
                    container_usage[key] = usage
                    if started:
                        first_seen.append((cid, usage))
                elif usage > before:
                    delta = usage - before
                    container_usage[key] = usage
                else:
                    delta = 0
                name = names.get(key)
                if name is None:
                    name = self._container_name(uid, cid)
                    if name == POD_OVERHEAD:
                        self._unnamed.add(key)
                by_name[name] = by_name.get(name, 0) + delta
            if first_seen:
                unpaid = pod_ns - sum(by_name.values())
                for cid, usage in first_seen:
                    delta = min(usage, max(0, unpaid))
                    unpaid -= delta
                    name = names.get((uid, cid), POD_OVERHEAD)
                    by_name[name] = by_name.get(name, 0) + delta
            remainder = pod_ns - sum(by_name.values())
            if remainder > 0:
                by_name[POD_OVERHEAD] = by_name.get(POD_OVERHEAD, 0) + remainder
            if not by_name.get(POD_OVERHEAD) and (uid, POD_OVERHEAD) not in self.ledger.containers:
                by_name.pop(POD_OVERHEAD, None)  # no series for an idle sandbox until it uses CPU
            pods[uid] = pod_ns / 1e9
            containers[uid] = {name: ns / 1e9 for name, ns in by_name.items()}
            present.extend([(uid, name) for name in by_name])
        # forget readings of pods and containers that are gone (unreadable pods keep theirs, and nothing
        # is forgotten when the pod root could not be listed at all); every one read now has an entry, so
        # there is something to forget only when there are more entries than that
        if not reading.complete:
            return CpuDeltas(busy, total, pods, containers), present
        if len(pod_usage) > len(reading.pods):
            keep = set(reading.pods) | set(reading.unreadable)
            self._pod_usage = {u: v for u, v in pod_usage.items() if u in keep}
        if len(container_usage) > sum(len(pod.containers) for pod in reading.pods.values()):
            live = {(uid, cid) for uid, pod in reading.pods.items() for cid in pod.containers}
            self._container_usage = {
                k: v for k, v in container_usage.items() if k in live or k[0] in reading.unreadable
            }
        return CpuDeltas(busy, total, pods, containers), present

    def _skip_unnamed(self, reading: PodCpuReading) -> None:
        """Tell the reader which containers to leave unread next time: those without a name so far. An
        unread container that has a name now is read again (its first read a baseline)."""
        unread = 0  # unread and still without a name
        for uid, pod in reading.pods.items():
            unread += len(pod.unread)
            for cid in pod.unread:
                if self.pod_meta.container_name(cid) is not None:
                    self._unnamed.discard((uid, cid))
                    self._named_since.add((uid, cid))  # until it is read
                    unread -= 1
        if reading.complete and self._named_since:
            self._named_since = {key for key in self._named_since if key[0] in reading.pods}
        if reading.complete and len(self._unnamed) > unread:  # some are gone, or read this time
            present = {
                (uid, cid) for uid, pod in reading.pods.items() for cid in (*pod.unread, *pod.containers)
            }
            self._unnamed = {key for key in self._unnamed if key in present and key not in self._names}
        skip = frozenset(cid for _uid, cid in self._unnamed)
        if skip != self.cgroups.skip:
            self.cgroups.skip = skip

    def _container_name(self, uid: str, cid: str) -> str:
        name = self._names.get((uid, cid))
        if name is None:
            found = self.pod_meta.container_name(cid)
            if found is None:
                return POD_OVERHEAD
            self._names[(uid, cid)] = name = found
        return name

    def _resolve_meta(self, reading: PodCpuReading) -> None:
        """Names for new pods and containers, looked up before attribution so a new container's first
        interval already lands under its name."""
        self.pod_meta.refresh(
            [uid for uid in reading.pods if uid not in self._meta],
            [
                cid
                for uid, pod in reading.pods.items()
                for cid in (*pod.containers, *pod.unread)
                if (uid, cid) not in self._names
            ],
        )
        for uid in reading.pods:
            if uid not in self._meta:
                meta = self.pod_meta.pod(uid)
                if meta is not None:
                    self._meta[uid] = meta

    def _revive(self, pods: Mapping[str, object]) -> None:
        """A pod taken for terminated is back (a listing glitch): continue its counters, export it once."""
        for uid in [u for u in self._terminated if u in pods]:
            gone = self._terminated.pop(uid)
            self._pods_seen.add(uid)  # its CPU time restarts from a baseline, never from zero
            self.ledger.pods[uid] = dict(gone.pod.energy_j)
            for part in gone.containers:
                self.ledger.containers[(uid, part.container)] = dict(part.energy_j)
            if gone.pod.namespace or gone.pod.name:
                self._meta[uid] = PodMeta(gone.pod.namespace, gone.pod.name)

    def _exportable(self, uid: str) -> bool:
        """Pods are held back until their name is known (so a pod's series keep one label set), for at
        most meta_grace_seconds; after that they are exported with the uid alone."""
        if uid in self._meta:
            return True
        first = self._first_seen.get(uid)
        sampled = self._last_time if self._last_time is not None else self.clock()  # as of the last sample
        return first is None or sampled - first >= self.meta_grace_seconds

    def _terminate(self, uid: str) -> None:
        watts: dict[str, float] = {}
        meta = self._meta.get(uid, PodMeta("", ""))
        totals, containers = self.ledger.forget_pod(uid)
        self._first_seen.pop(uid, None)
        self._pod_usage.pop(uid, None)
        pod = PodEnergy(uid, meta.namespace, meta.name, totals, watts, terminated=True)
        parts = tuple(
            ContainerEnergy(uid, meta.namespace, meta.name, name, energy, {}, terminated=True)
            for name, energy in sorted(containers.items())
        )
        self._terminated[uid] = _Terminated(pod, parts)
        while len(self._terminated) > self.max_terminated:  # oldest first (dicts keep insertion order)
            del self._terminated[next(iter(self._terminated))]

    # --- stats and snapshot ---

    def _count(self, source: str, n: int = 1) -> None:
        errors = dict(self._stats.errors)
        errors[source] = errors.get(source, 0) + n
        self._stats = dataclasses.replace(self._stats, errors=errors)
        with self._lock:
            if self._snapshot is not None:
                self._snapshot = dataclasses.replace(self._snapshot, stats=self._stats)

    def _finish_stats(self, errors: Mapping[str, int], duration: float) -> None:
        self._stats = next_stats(self._stats, errors, duration, self.wall_clock())

    def _build(self) -> PowerSnapshot:
        return build_snapshot(
            self.ledger,
            seq=self._stats.samples,
            rapl_reason="" if self.rapl.status is None else self.rapl.status.reason,
            interval_seconds=self._interval_seconds,
            meta={
                uid: self._meta.get(uid, PodMeta("", "")) for uid in self.ledger.pods if self._exportable(uid)
            },
            terminated=tuple(self._terminated.values()),
            stats=self._stats,
        )


def next_stats(stats: SamplerStats, errors: Mapping[str, int], duration: float, at: float) -> SamplerStats:
    """`stats` after one more sample that took `duration` seconds, finished at wall time `at`."""
    counts = dict(stats.errors)
    for source, n in errors.items():
        counts[source] = counts.get(source, 0) + n
    buckets = tuple(
        count + (1 if duration <= bound else 0)
        for count, bound in zip(stats.duration_buckets, DURATION_BUCKETS, strict=True)
    )
    return SamplerStats(
        samples=stats.samples + 1,
        errors=counts,
        duration_buckets=buckets,
        duration_sum=stats.duration_sum + duration,
        last_duration=duration,
        last_sample_time=at,
    )


def build_snapshot(
    ledger: EnergyLedger,
    *,
    seq: int,
    rapl_reason: str,
    interval_seconds: float,
    meta: Mapping[str, PodMeta],
    terminated: Sequence[_Terminated],
    stats: SamplerStats,
) -> PowerSnapshot:
    """The snapshot of the ledger's totals and last interval's power. Pods (and their containers) are
    exported only when `meta` has them: the caller holds back pods whose name is not known yet."""
    power = ledger.power
    zones = []
    for key in sorted(ledger.node):
        totals = ledger.node[key]
        watts = power.node.get(key)
        zones.append(
            NodeZone(
                key,
                totals.energy,
                totals.active,
                totals.idle,
                watts.energy if watts else 0.0,
                watts.active if watts else 0.0,
                watts.idle if watts else 0.0,
            )
        )
    pods: list[PodEnergy] = []
    containers: list[ContainerEnergy] = []
    for uid in sorted(ledger.pods):
        if uid not in meta:
            continue
        pod_meta = meta[uid]
        pod_watts = power.pods.get(uid, {})
        energy = dict(ledger.pods[uid])
        pods.append(
            PodEnergy(
                uid, pod_meta.namespace, pod_meta.name, energy, {k: pod_watts.get(k, 0.0) for k in energy}
            )
        )
    for (uid, name), energy in sorted(ledger.containers.items()):
        if uid not in ledger.pods or uid not in meta:
            continue
        pod_meta = meta[uid]
        part_watts = power.containers.get((uid, name), {})
        containers.append(
            ContainerEnergy(
                uid,
                pod_meta.namespace,
                pod_meta.name,
                name,
                dict(energy),
                {k: part_watts.get(k, 0.0) for k in energy},
            )
        )
    for gone in terminated:
        pods.append(gone.pod)
        containers.extend(gone.containers)
    kinds = {z.key.kind for z in zones}
    return PowerSnapshot(
        seq=seq,
        rapl_reason=rapl_reason,
        interval_seconds=interval_seconds,
        busy_ratio=power.busy_ratio,
        zones=tuple(zones),
        host_kinds=host_zone_kinds(kinds),
        pods=tuple(pods),
        containers=tuple(containers),
        system_j=dict(ledger.system),
        system_watts=dict(power.system),
        stats=stats,
    )
