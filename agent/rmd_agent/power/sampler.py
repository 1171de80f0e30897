"""The power sampling task: every interval, read RAPL, /proc/stat and pod cgroups, attribute, publish.

Each sample ends in one immutable `PowerSnapshot`; the metrics collector reads whichever snapshot is
current, so a scrape never mixes two intervals. A sample never raises for host problems: a missing or
unreadable RAPL tree, an unreadable cgroup or a vanished pod is counted under `errors` by source and the
sample goes on with what it has (RAPL is looked for again every `rediscover_seconds`). Anything else is
caught by `run()`, counted as "internal", logged, and the loop keeps its schedule: no crash loop.

The snapshot is built when it is first read after a sample (a scrape), not by every sample: at a 1 s
interval and a 15 s scrape, fourteen of fifteen would never be read.

`sample()` runs in the event loop's thread on purpose: it is small file reads and arithmetic, under 10 ms
at 500 pods (bench/power_overhead.py), and running it between other tasks, not beside them,
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
from typing import NamedTuple

from rmd_agent.errors import HostReadError
from rmd_agent.hostfs import HostFS
from rmd_agent.power.attribution import CpuDeltas, EnergyLedger, ZoneKey
from rmd_agent.power.cpu_time import USER_HZ, CgroupCpuReader, PodCpu, PodCpuReading, ProcStat, read_proc_stat
from rmd_agent.power.pod_meta import KubeletLogDirs, PodMeta, PodMetaSource
from rmd_agent.power.rapl_sampler import RaplSampler, host_zone_kinds

log = logging.getLogger(__name__)

POD_OVERHEAD = ""  # container label for a pod's CPU outside its named containers (sandbox, conmon)
ERROR_SOURCES = ("rapl", "proc_stat", "cgroup", "internal")
# a pod's containers are read every 1 to 2 times this (staggered over pods), and for each snapshot
CONTAINER_WINDOW_SECONDS = 5.0
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


class PodEnergy(NamedTuple):  # tuples: a snapshot makes 1,500 of these at 500 pods
    uid: str
    namespace: str
    name: str
    energy_j: Mapping[str, float]  # zone kind -> joules since the agent started
    watts: Mapping[str, float]  # zone kind -> watts over the last interval
    terminated: bool = False


class ContainerEnergy(NamedTuple):
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


@dataclass
class _PodState:
    """What the sampler remembers of a pod between samples."""

    first_seen: float
    new: bool = False  # started since the last complete reading: all its CPU time is this interval's
    usage: int | None = None  # CPU time (ns) at the last sample; None: the next read is a baseline
    split_usage: int | None = None  # CPU time (ns) when its containers were last read
    containers: dict[str, int] = field(default_factory=dict)  # container id -> CPU time (ns) then
    names: dict[str, str] = field(default_factory=dict)  # container id -> name, sticky once known
    # containers without a name (the sandbox, or one whose name is not known yet) are not read: their CPU
    # time is the pod's remainder either way; once named, their first read is only a baseline
    unnamed: set[str] = field(default_factory=set)
    baseline_next: set[str] = field(default_factory=set)  # named since their last read: next read a baseline


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
        containers: bool = True,
    ) -> None:
        self.fs = fs
        self.interval = interval
        self.clock = clock
        self.wall_clock = wall_clock
        self.rediscover_seconds = rediscover_seconds
        self.meta_grace_seconds = meta_grace_seconds
        self.max_terminated = max_terminated
        self.rapl = RaplSampler(fs)
        self.per_container = containers
        # pods are read every interval, their containers every 1 to 2 CONTAINER_WINDOW_SECONDS (and when a
        # snapshot is built): a pod's energy changes from one interval to the next, and a container's share
        # of it is taken over the whole window
        split_every = max(1, int(CONTAINER_WINDOW_SECONDS // interval)) if interval > 0 else 1
        self.cgroups = CgroupCpuReader(fs, split_every, containers=containers)
        self.pod_meta: PodMetaSource = pod_meta if pod_meta is not None else KubeletLogDirs(fs)
        self.ledger = EnergyLedger(remainder=POD_OVERHEAD if containers else None)
        self._lock = threading.Lock()
        self._snapshot = PowerSnapshot(0, "not sampled yet", 0.0, 0.0)
        # a sample since the snapshot was built: the next read builds another (the old one is freed then,
        # by the reader: 8,000 series at 500 pods take a millisecond to free)
        self._stale = False
        self._closed = False  # close() ran: a snapshot reads no file (it would open them again)
        self._stats = SamplerStats()
        self._last_time: float | None = None
        self._interval_seconds = 0.0  # length of the last interval
        self._last_discovery: float | None = None
        self._proc: ProcStat | None = None
        self._pods: dict[str, _PodState] = {}  # every pod of the last reading, readable or not
        self._meta: dict[str, PodMeta] = {}  # sticky once known: uid -> namespace/name
        self._skip_changed = False  # a pod's unnamed containers changed: tell the reader
        self._complete = False
        self._terminated: dict[str, _Terminated] = {}
        self._rapl_errors_logged = False

    # --- reading the result ---

    def snapshot(self) -> PowerSnapshot:
        with self._lock:
            if self._stale:
                self._split_pending()
                self._snapshot = self._build()
                self._stale = False
            return self._snapshot

    def mark_exported(self, uids: set[str]) -> None:
        """Terminated pods a scrape has now seen: they are dropped, from this snapshot on."""
        if not uids:
            return
        with self._lock:
            for uid in uids:
                self._terminated.pop(uid, None)
            snap = self._snapshot
            if self._stale:  # the next build leaves them out
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
            self._closed = True
            self.cgroups.files.close()

    def sample(self) -> None:
        """Take one sample; `snapshot()` shows it. Holds the lock throughout: a scrape thread marking
        terminated pods exported must not interleave with the sample moving pods in and out."""
        with self._lock:
            self._closed = False
            self._sample()
            self._stale = True

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
        self._resolve_meta(reading.pods)
        cpu, new = self._pod_deltas(proc, reading, now)
        self.ledger.track(new, {z.key.kind for z in self.rapl.zones})
        if self._last_time is not None:
            self.ledger.record(seconds, zone_energy, cpu)
        for uid, pod in reading.pods.items():
            if pod.containers is not None:
                self._split(uid, pod)
        self._update_skip()
        if reading.complete:
            gone = [u for u in self._pods if u not in reading.pods and u not in reading.unreadable]
            for uid in gone:
                self._terminate(uid)
            if gone or len(self._meta) > len(self._pods):
                self._meta = {u: m for u, m in self._meta.items() if u in self._pods}
        self._last_time = now
        self._proc = proc if proc is not None else self._proc
        self._complete = reading.complete
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

    def _pod_deltas(
        self, proc: ProcStat | None, reading: PodCpuReading, now: float
    ) -> tuple[CpuDeltas, list[str]]:
        """The interval's CPU time of the node and of every pod read; and the pods seen for the first time."""
        busy = total = 0.0
        if proc is not None and self._proc is not None:
            busy = max(0, proc.busy_ticks - self._proc.busy_ticks) / USER_HZ
            total = max(0, proc.total_ticks - self._proc.total_ticks) / USER_HZ
        # a pod absent from a complete previous reading started since: all its CPU time is new
        new_counts_whole = self._last_time is not None and self._complete
        states = self._pods
        pods: dict[str, float] = {}
        new: list[str] = []
        for uid, pod in reading.pods.items():
            state = states.get(uid)
            if state is None:
                state = states[uid] = _PodState(now, new=new_counts_whole)
                new.append(uid)
            previous = state.usage
            # CPU time never goes down: a lower figure is a read torn by a concurrent update or skewed, so
            # the higher one stays the baseline (taking the lower would credit the difference twice)
            if previous is None:
                pod_ns = pod.usage_ns if state.new else 0
                state.usage = pod.usage_ns
            elif pod.usage_ns > previous:
                pod_ns = pod.usage_ns - previous
                state.usage = pod.usage_ns
            else:
                pod_ns = 0
            pods[uid] = pod_ns / 1e9
        for uid in reading.unreadable:  # seen: when readable again, it starts from a baseline
            if uid not in states:
                states[uid] = _PodState(now)
        return CpuDeltas(busy, total, pods), new

    def _split(self, uid: str, pod: PodCpu) -> None:
        """Share the pod's energy since its last split among its containers, by their CPU time since then
        (`pod.containers`, read now)."""
        state = self._pods[uid]
        assert pod.containers is not None
        if state.split_usage is None:  # the pod's first read: a baseline, or all of a new pod's life
            window = pod.usage_ns if state.new else 0
            started = state.new
            state.split_usage = pod.usage_ns
        else:
            window = max(0, pod.usage_ns - state.split_usage)
            started = True
            state.split_usage = max(pod.usage_ns, state.split_usage)
        # A container not read last time may have started since, or may have run unseen (not listed yet, or
        # left unread without a name), its CPU time in the pod's remainder so far: it is paid at most this
        # window's remainder, never its whole life.
        before_all, names, baseline_next = state.containers, state.names, state.baseline_next
        usage_now: dict[str, int] = {}
        by_name: dict[str, int] = {}
        first_seen: list[tuple[str, int]] = []
        for cid, (_runtime, usage) in pod.containers.items():
            before = before_all.get(cid)
            if cid in baseline_next:  # was left unread: only a baseline now
                baseline_next.discard(cid)
                delta = 0
                usage_now[cid] = usage
            elif before is None:
                delta = 0
                usage_now[cid] = usage
                if started:
                    first_seen.append((cid, usage))
            elif usage > before:
                delta = usage - before
                usage_now[cid] = usage
            else:
                delta = 0
                usage_now[cid] = before
            name = names.get(cid)
            if name is None:
                name = self._container_name(state, cid)
                if name == POD_OVERHEAD and cid not in state.unnamed:
                    state.unnamed.add(cid)
                    self._skip_changed = True
            by_name[name] = by_name.get(name, 0) + delta
        state.containers = usage_now
        if first_seen:
            unpaid = window - sum(by_name.values())
            for cid, usage in first_seen:
                delta = min(usage, max(0, unpaid))
                unpaid -= delta
                name = names.get(cid, POD_OVERHEAD)
                by_name[name] = by_name.get(name, 0) + delta
        remainder = window - sum(by_name.values())
        if remainder > 0:
            by_name[POD_OVERHEAD] = by_name.get(POD_OVERHEAD, 0) + remainder
        if not by_name.get(POD_OVERHEAD) and (uid, POD_OVERHEAD) not in self.ledger.containers:
            by_name.pop(POD_OVERHEAD, None)  # no series for an idle sandbox until it uses CPU
        self.ledger.split(uid, window / 1e9, {name: ns / 1e9 for name, ns in by_name.items()})
        self._name_unread(state, pod)

    def _name_unread(self, state: _PodState, pod: PodCpu) -> None:
        """Containers left unread for want of a name are read from the next split on once they have one
        (their first read a baseline); the pod's unnamed ones are those unread now, or read and unnamed."""
        if not (pod.unread or state.unnamed or state.baseline_next):
            return
        unnamed = {cid for cid in state.unnamed if cid in (pod.containers or ()) and cid not in state.names}
        for cid in pod.unread:
            if self.pod_meta.container_name(cid) is None:
                unnamed.add(cid)
            else:
                state.baseline_next.add(cid)  # until it is read
        state.baseline_next &= {*pod.unread, *(pod.containers or ())}
        if unnamed != state.unnamed:
            state.unnamed = unnamed
            self._skip_changed = True

    def _split_pending(self) -> None:
        """Before a snapshot: every pod's energy since its last split goes to its containers, by their CPU
        time up to now, so the exported containers add up to their pods. (That energy was recorded up to the
        last sample, the CPU time is read now: the CPU time in between is shared with this window's energy,
        and its energy comes in the next window.)"""
        if not self.per_container:
            return
        if not self._closed:
            pods = self.cgroups.read_containers(self.ledger.pending_pods())
            self._resolve_meta(pods)  # a container listed just now gets its name first
            for uid, pod in pods.items():
                if uid in self._pods and pod.containers is not None:
                    self._split(uid, pod)
        self.ledger.settle_all()  # those not read now: by their last shares
        self._update_skip()

    def _update_skip(self) -> None:
        """Tell the reader which containers to leave unread: those without a name so far."""
        if self._skip_changed:
            self._skip_changed = False
            self.cgroups.skip = frozenset(cid for state in self._pods.values() for cid in state.unnamed)

    def _container_name(self, state: _PodState, cid: str) -> str:
        found = self.pod_meta.container_name(cid)
        if found is None:
            return POD_OVERHEAD
        state.names[cid] = found
        return found

    def _resolve_meta(self, pods: Mapping[str, PodCpu]) -> None:
        """Names for new pods and containers, looked up before attribution so a new container's first
        window already lands under its name. Every pod and container still without a name is passed each
        time: the source lists the kubelet's directories for names it was not asked for before (at most once
        a minute for the same ones)."""
        uids = {uid for uid in (*pods, *self._pods) if uid not in self._meta}
        ids = set(self.cgroups.skip)  # every pod's unread containers: no name yet
        for uid, pod in pods.items():
            if pod.containers is None:
                continue
            state = self._pods.get(uid)
            named = state.names if state is not None else {}
            ids.update(cid for cid in (*pod.containers, *pod.unread) if cid not in named)
        self.pod_meta.refresh(uids, ids)
        for uid in uids:
            meta = self.pod_meta.pod(uid)
            if meta is not None:
                self._meta[uid] = meta

    def _revive(self, pods: Mapping[str, object]) -> None:
        """A pod taken for terminated is back (a listing glitch): continue its counters, export it once."""
        for uid in [u for u in self._terminated if u in pods]:
            gone = self._terminated.pop(uid)
            # its CPU time restarts from a baseline, never from zero
            self._pods.setdefault(uid, _PodState(self._last_time or 0.0))
            self.ledger.restore(uid, gone.pod.energy_j, {c.container: c.energy_j for c in gone.containers})
            if gone.pod.namespace or gone.pod.name:
                self._meta[uid] = PodMeta(gone.pod.namespace, gone.pod.name)

    def _exportable(self, uid: str) -> bool:
        """Pods are held back until their name is known (so a pod's series keep one label set), for at
        most meta_grace_seconds; after that they are exported with the uid alone."""
        if uid in self._meta:
            return True
        state = self._pods.get(uid)
        sampled = self._last_time if self._last_time is not None else self.clock()  # as of the last sample
        return state is None or sampled - state.first_seen >= self.meta_grace_seconds

    def _terminate(self, uid: str) -> None:
        watts: dict[str, float] = {}
        meta = self._meta.get(uid, PodMeta("", ""))
        totals, containers = self.ledger.forget_pod(uid)
        state = self._pods.pop(uid, None)
        if state is not None and state.unnamed:
            self._skip_changed = True
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
            if not self._stale:
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


def _watts(watts: Mapping[str, float] | None, energy: Mapping[str, float]) -> Mapping[str, float]:
    """Watts for each kind of `energy` (0 where none). The ledger's own mapping when it has those kinds:
    it is made afresh for each interval and never changed, so a snapshot can share it."""
    if watts is not None and watts.keys() == energy.keys():
        return watts
    return {k: (watts or {}).get(k, 0.0) for k in energy}


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
        energy = dict(ledger.pods[uid])
        pods.append(
            PodEnergy(uid, pod_meta.namespace, pod_meta.name, energy, _watts(power.pods.get(uid), energy))
        )
    for (uid, name), energy in sorted(ledger.containers.items()):
        if uid not in ledger.pods or uid not in meta:
            continue
        pod_meta = meta[uid]
        part_watts = _watts(power.containers.get((uid, name)), energy)
        containers.append(
            ContainerEnergy(uid, pod_meta.namespace, pod_meta.name, name, dict(energy), part_watts)
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
