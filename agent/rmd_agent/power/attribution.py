"""Energy attribution. Pure: numbers in, numbers out, no I/O.

Per interval and RAPL zone (docs/power.md has the reasoning):

    busy ratio r   = node busy CPU time / node CPU time            (from /proc/stat)
    active         = zone energy * r              idle = zone energy - active
    pod i          = active * cpu_i / max(busy CPU time, Σ cpu)   (cgroup CPU time of the pod)
    system         = active - Σ pods              (processes outside pods: kubelet, runtime, kernel, …)
    container j    = pod i * cpu_j / max(cpu_i, Σ cpu of the pod's containers)

so idle + system + Σ pods is the zone's energy, and a pod's containers add up to the pod when the caller
lists the pod's own remainder (sandbox, conmon) as a container too. The ledger applies the container line
to a window of intervals at once (a pod's joules since its containers were last read, by their CPU time
over that window), because containers are read less often than pods. Using max(…) in the denominators keeps
the parts inside the whole when readings taken at different moments disagree.
Remainders are clamped at zero: a counter must never go down, and the clamp only ever drops rounding noise.

Skew carry: a sample reads /proc/stat and a thousand cgroup files over tens of milliseconds while they
move, so in one interval the pods' CPU time can exceed the node's busy time and in the next fall short by
as much. Clamping the first and not the second would lose pods' energy on every such pair (1.3 % of it at
500 pods, issue #14). So CPU time the clamp leaves unpaid is carried to the pod's next interval, where the
shortfall makes room for it; the carry is bounded by the interval's busy time, so a node whose counters
disagree for good loses the excess as before instead of piling it up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

_K = TypeVar("_K")


@dataclass(frozen=True, order=True)
class ZoneKey:
    """A node zone: kind ("package", "dram", …) and socket ("0", "1", …; "" for the platform's psys)."""

    kind: str
    socket: str


@dataclass(frozen=True)
class CpuDeltas:
    """CPU time (seconds, summed over CPUs) spent during one interval."""

    busy: float  # node busy time: everything but idle and iowait
    total: float  # node time: busy + idle + iowait
    pods: Mapping[str, float] = field(default_factory=dict)  # pod uid -> CPU time of the pod cgroup
    containers: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # uid -> container -> time


@dataclass(frozen=True)
class Shares:
    """Fractions computed once per interval and applied to every zone."""

    busy_ratio: float
    pods: Mapping[str, float]  # fraction of the active energy
    containers: Mapping[str, Mapping[str, float]]  # fraction of the pod's energy
    carry: Mapping[str, float] = field(default_factory=dict)  # pod CPU seconds left unpaid, for next time


def busy_ratio(busy: float, total: float) -> float:
    if total <= 0 or busy <= 0:
        return 0.0
    return min(1.0, busy / total)


def cpu_shares(cpu: CpuDeltas, carry: Mapping[str, float] | None = None) -> Shares:
    """`carry`: the previous interval's `Shares.carry` (CPU seconds per pod that the clamp left unpaid)."""
    pod_cpu = {uid: max(0.0, t) for uid, t in cpu.pods.items()}
    owed = {uid: t + max(0.0, (carry or {}).get(uid, 0.0)) for uid, t in pod_cpu.items()}
    claimed = math.fsum(owed.values())
    denominator = max(cpu.busy, claimed)
    pods = {uid: (t / denominator if denominator > 0 else 0.0) for uid, t in owed.items()}
    unpaid = min(claimed - cpu.busy, cpu.busy) if claimed > cpu.busy > 0 else 0.0
    left = {uid: t * unpaid / claimed for uid, t in owed.items() if t > 0} if unpaid > 0 else {}
    containers: dict[str, dict[str, float]] = {}
    for uid, parts in cpu.containers.items():
        if uid not in pod_cpu:
            continue
        part_cpu = {name: max(0.0, t) for name, t in parts.items()}
        whole = max(pod_cpu[uid], math.fsum(part_cpu.values()))
        containers[uid] = {name: (t / whole if whole > 0 else 0.0) for name, t in part_cpu.items()}
    return Shares(busy_ratio(cpu.busy, cpu.total), pods, containers, left)


@dataclass(frozen=True)
class ZoneSplit:
    """One zone's energy for one interval, in joules."""

    energy: float
    active: float
    idle: float
    system: float
    pods: Mapping[str, float]
    containers: Mapping[str, Mapping[str, float]]


def split_energy(energy: float, shares: Shares) -> ZoneSplit:
    energy = max(0.0, energy)
    active = energy * shares.busy_ratio
    pods = {uid: active * fraction for uid, fraction in shares.pods.items()}
    containers = {
        uid: {name: pods[uid] * fraction for name, fraction in parts.items()}
        for uid, parts in shares.containers.items()
    }
    system = max(0.0, active - math.fsum(pods.values()))
    return ZoneSplit(energy, active, energy - active, system, pods, containers)


@dataclass
class NodeZoneTotals:
    energy: float = 0.0
    active: float = 0.0
    idle: float = 0.0


@dataclass(frozen=True)
class IntervalPower:
    """Watts over the last interval (energy / seconds); empty before the first interval."""

    node: Mapping[ZoneKey, NodeZoneTotals]  # energy, active and idle fields hold watts here
    pods: Mapping[str, Mapping[str, float]]  # uid -> kind -> W
    containers: Mapping[tuple[str, str], Mapping[str, float]]  # (uid, container) -> kind -> W
    system: Mapping[str, float]  # kind -> W
    busy_ratio: float


def _add(target: dict[str, float], kind: str, joules: float) -> None:
    target[kind] = target.get(kind, 0.0) + joules


def _start_at_zero(totals: dict[_K, dict[str, float]], keys: Iterable[_K], kinds: list[str]) -> None:
    for key in keys:
        entry = totals.get(key)
        if entry is None:
            totals[key] = dict.fromkeys(kinds, 0.0)
        elif len(entry) < len(kinds):
            for kind in kinds:
                entry.setdefault(kind, 0.0)


class EnergyLedger:
    """Cumulative joules since the agent started, per node zone, pod, container and the system bucket.

    Node zones stay per socket; pods, containers and the system bucket are per zone kind, summed over
    sockets, because cgroups do not say on which socket a pod's CPU time was spent.

    `record` runs every sample (once a second at 500 pods), so it adds each pod's joules in one pass without
    building a `ZoneSplit` per kind, and leaves the interval's watts (`power`) to be worked out only when
    something reads them (a scrape, every 15 s or so). A pod's joules since its last split are pending until
    `split` shares them among its containers by their CPU time over the window they were recorded in (a
    sampler reads containers less often than pods): the window's own shares, applied once, so a container's
    total is what it used, not what its share was at some other time. Split after every interval, the ledger
    gives exactly what `split_energy` gives, to the last bit (tests/unit/test_power_attribution.py).
    """

    def __init__(self, remainder: str | None = None) -> None:
        """`remainder`: the container that gets a pod's joules when it has never been split (no container
        used CPU yet); None: such joules stay pending."""
        self.remainder = remainder
        self.node: dict[ZoneKey, NodeZoneTotals] = {}
        self.pods: dict[str, dict[str, float]] = {}
        self.containers: dict[tuple[str, str], dict[str, float]] = {}
        self.system: dict[str, float] = {}
        self._split_at: dict[str, dict[str, float]] = {}  # uid -> kind -> the pod's joules at its last split
        self.fractions: dict[str, Mapping[str, float]] = {}  # uid -> container -> share, of the last split
        self.carry: Mapping[str, float] = {}  # Shares.carry of the last interval
        self._kinds: list[str] = []
        self._power: IntervalPower | None = IntervalPower({}, {}, {}, {}, 0.0)
        self._interval: tuple[float, Shares, dict[str, float]] = (0.0, Shares(0.0, {}, {}), {})
        self._node_power: dict[ZoneKey, NodeZoneTotals] = {}
        self._system_power: dict[str, float] = {}

    def track(self, pods: Iterable[str], kinds: Iterable[str]) -> None:
        """Start counters at zero for pods present now, so idle ones are exported too; a zone kind found
        late is added at zero to every counter."""
        kind_list = sorted(kinds)
        if kind_list != self._kinds:
            self._kinds = kind_list
            pods = [*self.pods, *pods]
            _start_at_zero(self.containers, list(self.containers), kind_list)
        _start_at_zero(self.pods, pods, kind_list)

    def record(self, seconds: float, zone_energy: Mapping[ZoneKey, float], cpu: CpuDeltas) -> Shares:
        """Add one interval: `zone_energy` in joules per node zone, `cpu` the interval's CPU time of the node
        and the pods (`cpu.containers` is not looked at: `split` shares a pod's joules among them)."""
        shares = cpu_shares(cpu, self.carry)
        self.carry = shares.carry
        by_kind: dict[str, float] = {}
        node_power: dict[ZoneKey, NodeZoneTotals] = {}
        for key, joules in zone_energy.items():
            joules = max(0.0, joules)
            active = joules * shares.busy_ratio
            totals = self.node.setdefault(key, NodeZoneTotals())
            totals.energy += joules
            totals.active += active
            totals.idle += joules - active
            by_kind[key.kind] = by_kind.get(key.kind, 0.0) + joules
            if seconds > 0:
                node_power[key] = NodeZoneTotals(
                    joules / seconds, active / seconds, (joules - active) / seconds
                )
        # what split_energy does, for every kind at once: active = energy * r, pod = active * its fraction,
        # system = active - the pods
        active_by_kind = {kind: max(0.0, joules) * shares.busy_ratio for kind, joules in by_kind.items()}
        kinds = list(active_by_kind.items())
        pods_by_kind: dict[str, list[float]] = {kind: [] for kind in active_by_kind}
        pods = self.pods
        for uid, fraction in shares.pods.items():
            entry = pods.get(uid)
            if entry is None:
                entry = pods[uid] = {}
            for kind, active in kinds:
                pod_joules = active * fraction
                entry[kind] = entry.get(kind, 0.0) + pod_joules
                pods_by_kind[kind].append(pod_joules)
        system_power: dict[str, float] = {}
        for kind, active in kinds:
            system = max(0.0, active - math.fsum(pods_by_kind[kind]))
            _add(self.system, kind, system)
            if seconds > 0:
                system_power[kind] = system / seconds
        self._interval = (seconds, shares, active_by_kind)
        self._node_power, self._system_power = node_power, system_power
        self._power = None
        return shares

    def split(self, uid: str, pod_cpu: float, parts: Mapping[str, float]) -> None:
        """Share the pod's pending joules among its containers by `parts`, their CPU seconds over the
        window the pending joules were recorded in (`pod_cpu`: the pod's over the same window)."""
        if uid not in self.pods:
            return
        part_cpu = {name: max(0.0, t) for name, t in parts.items()}
        whole = max(pod_cpu, math.fsum(part_cpu.values()))
        self._settle(uid, {name: (t / whole if whole > 0 else 0.0) for name, t in part_cpu.items()})

    def _pending(self, uid: str) -> dict[str, float]:
        """The pod's joules since its last split, per kind (not in any container yet)."""
        totals = self.pods.get(uid, {})
        at = self._split_at.get(uid, {})
        return {kind: max(0.0, joules - at.get(kind, 0.0)) for kind, joules in totals.items()}

    def pending_pods(self) -> list[str]:
        """The pods with joules not split among their containers yet."""
        split_at = self._split_at
        out = []
        for uid, totals in self.pods.items():
            at = split_at.get(uid)
            if totals != at if at is not None else any(totals.values()):
                out.append(uid)
        return out

    def _settle(self, uid: str, fractions: Mapping[str, float]) -> None:
        """Add the pod's pending joules to its containers by `fractions`; when no container used CPU in the
        window, by the last split's shares, else to `remainder`, else they stay pending."""
        waiting = self._pending(uid)
        settle = True
        if any(fractions.values()):
            self.fractions[uid] = fractions
        elif any(waiting.values()):
            last = self.fractions.get(uid)
            if last is not None:
                fractions = last
            elif self.remainder is not None:
                fractions = {**fractions, self.remainder: 1.0}
            else:
                settle = False
        containers = self.containers
        for name, fraction in fractions.items():
            entry = containers.get((uid, name))
            if entry is None:
                entry = containers[(uid, name)] = dict.fromkeys([*self._kinds, *waiting], 0.0)
            if settle:
                for kind, pod_joules in waiting.items():
                    entry[kind] = entry.get(kind, 0.0) + pod_joules * fraction
        if settle:
            self._split_at[uid] = dict(self.pods.get(uid, {}))

    def settle_all(self) -> None:
        """Split every pod's pending joules by its last shares (or to `remainder`)."""
        for uid in self.pending_pods():
            self._settle(uid, {})

    @property
    def power(self) -> IntervalPower:
        """The last interval's watts, worked out on first use after each `record`; a container's are its
        pod's by the pod's last split."""
        if self._power is None:
            seconds, shares, active_by_kind = self._interval
            pod_power: dict[str, dict[str, float]] = {}
            container_power: dict[tuple[str, str], dict[str, float]] = {}
            if seconds > 0:
                for uid, fraction in shares.pods.items():
                    pod_power[uid] = {
                        kind: active * fraction / seconds for kind, active in active_by_kind.items()
                    }
                for uid, parts in self.fractions.items():
                    watts = pod_power.get(uid)
                    if watts is None:
                        continue
                    for name, part_fraction in parts.items():
                        container_power[(uid, name)] = {kind: w * part_fraction for kind, w in watts.items()}
            self._power = IntervalPower(
                self._node_power, pod_power, container_power, self._system_power, shares.busy_ratio
            )
        return self._power

    def restore(
        self, uid: str, pod: Mapping[str, float], containers: Mapping[str, Mapping[str, float]]
    ) -> None:
        """Put back the totals `forget_pod` returned (a pod taken for gone is back); what its containers do
        not hold of the pod's joules is pending again."""
        self.pods[uid] = dict(pod)
        held = {kind: math.fsum(parts.get(kind, 0.0) for parts in containers.values()) for kind in pod}
        self._split_at[uid] = {kind: min(joules, held[kind]) for kind, joules in pod.items()}
        for name, totals in containers.items():
            self.containers[(uid, name)] = dict(totals)

    def forget_pod(self, uid: str) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """Drop a pod's counters (its pending joules split first); returns its final totals (per kind, and
        per container per kind)."""
        self._settle(uid, {})
        self._split_at.pop(uid, None)
        self.fractions.pop(uid, None)
        pod = self.pods.pop(uid, {})
        containers = {name: self.containers.pop((u, name)) for u, name in list(self.containers) if u == uid}
        return pod, containers
