"""Simulated load on a simulated node: pods burn CPU, counters advance, energy per pod is known in advance.

`SimLoad` works on a host tree written by `rmd_sim.hosttree`. It gives pods the files a real node has for
them and advances every counter the power telemetry reads, in simulated time (`advance(seconds)`):

* pod and container cgroups in the kubelet's shapes for the tree's cgroup version and driver
  (v2 `cpu.stat` usage_usec, v1 `cpuacct.usage` in ns), one sandbox container per pod as CRI runtimes have;
* `/proc/stat` (USER_HZ ticks): busy time = the pods' CPU rates + `system_cpus`, the rest idle;
* RAPL `energy_uj` per socket and zone from a linear `PowerModel`, wrapping at max_energy_range_uj;
* the kubelet's log layout naming pods and containers (/var/log/pods/<ns>_<name>_<uid>/<container>/,
  /var/log/containers/<pod>_<ns>_<container>-<id>.log), the source the agent takes names from;
* resctrl monitoring counters (`mon_data/mon_L3_XX/{llc_occupancy,mbm_total_bytes,mbm_local_bytes}`) for
  groups given `monitor_group`.

The model is the agent's (docs/power.md): a pod's share of a zone is its CPU rate over the node's CPUs,
so `expected_pod_joules` is exact arithmetic over the same simulated time, independent of the agent's code.
Files are replaced atomically (temp file and rename), so a reader sees the old or the new value.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rmd_sim.hosttree import MAX_ENERGY_RANGE_UJ, RaplZoneDir, rapl_zones
from rmd_sim.spec import NodeSpec, read_tree_spec

USER_HZ = 100
CGROUP = "sys/fs/cgroup"
V1_CPU = f"{CGROUP}/cpu,cpuacct"
POD_LOGS = "var/log/pods"
CONTAINER_LOGS = "var/log/containers"
RESCTRL = "sys/fs/resctrl"
RUNTIME_PREFIX = {"containerd": "cri-containerd", "crio": "crio", "docker": "docker"}
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")


@dataclass(frozen=True)
class PowerModel:
    """Watts of a zone = idle + per_busy_cpu * busy CPUs. Package-class zones are per socket with the
    node's busy CPUs spread evenly over sockets; psys is the whole platform. core + uncore stay inside
    package with the defaults, as on real parts."""

    idle_watts: Mapping[str, float] = field(
        default_factory=lambda: {"package": 40.0, "core": 12.0, "uncore": 3.0, "dram": 6.0, "psys": 110.0}
    )
    per_busy_cpu_watts: Mapping[str, float] = field(
        default_factory=lambda: {"package": 3.0, "core": 2.4, "uncore": 0.2, "dram": 0.4, "psys": 4.0}
    )

    def zone_watts(self, kind: str, busy_cpus: float) -> float:
        return self.idle_watts.get(kind, 0.0) + self.per_busy_cpu_watts.get(kind, 0.0) * busy_cpus


@dataclass
class SimContainer:
    name: str
    id: str
    cpus: float  # CPU rate: 1.5 = one and a half CPUs busy
    usage_ns: float = 0.0


@dataclass
class SimLoadPod:
    namespace: str
    name: str
    uid: str
    qos: str
    runtime: str
    rel_dir: str  # the pod cgroup, relative to the cgroup hierarchy
    containers: dict[str, SimContainer]  # by name; the sandbox is under ""
    restarts: dict[str, int] = field(default_factory=dict)

    @property
    def cpus(self) -> float:
        return sum(c.cpus for c in self.containers.values())


def _zone_kind(zone: RaplZoneDir) -> str:
    return zone.name.rsplit("-", 1)[0] if zone.name.startswith("package-") else zone.name


def _container_id(uid: str, name: str, restart: int) -> str:
    return hashlib.sha256(f"{uid}/{name}/{restart}".encode()).hexdigest()


def _write(path: Path, text: str) -> None:
    """Replace a file atomically: readers see the old or the new content, never a truncated one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


_WIDTH = 19  # digits of every cgroup counter: a file's length never changes while its numbers grow


def _write_in_place(path: Path, text: str) -> None:
    """Rewrite a cgroup counter file in place, as the kernel's files change: a reader may keep it open
    and read it again from offset 0 (the agent does). Every counter has a fixed width, so the file never
    shrinks or shifts; a read racing with the write can only mix old and new digits of the same counter."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.pwrite(fd, text.encode(), 0)
    finally:
        os.close(fd)


class SimLoad:
    """Pods with CPU rates on a simulated host tree; `advance()` moves simulated time forward."""

    def __init__(
        self,
        root: Path,
        *,
        model: PowerModel | None = None,
        system_cpus: float = 0.5,
        start_energy_uj: Mapping[str, int] | None = None,
    ) -> None:
        self.root = Path(root)
        self.spec: NodeSpec = read_tree_spec(self.root)
        self.model = model or PowerModel()
        self.system_cpus = system_cpus
        self.now = 0.0  # simulated seconds since the load started
        self.pods: dict[str, SimLoadPod] = {}
        # RAPL zones (the MMIO duplicate mirrors package-0 and advances with it)
        self.zones = [z for z in rapl_zones(self.spec) if not z.zone_id.startswith("intel-rapl-mmio")]
        self._mmio = [z for z in rapl_zones(self.spec) if z.zone_id.startswith("intel-rapl-mmio")]
        start = dict(start_energy_uj or {})
        self.energy_uj: dict[str, float] = {
            z.zone_id: float(start.get(z.zone_id, z.initial_energy_uj)) for z in self.zones
        }
        self.total_uj: dict[str, float] = dict.fromkeys(self.energy_uj, 0.0)  # never wraps
        self.wraps: dict[str, int] = dict.fromkeys(self.energy_uj, 0)
        # /proc/stat ticks
        self.busy_ticks = 0.0
        self.idle_ticks = 0.0
        # expected attribution, exact, accumulated per advance
        self.expected_pod: dict[str, dict[str, float]] = {}
        self.expected_container: dict[tuple[str, str], dict[str, float]] = {}
        self.expected_system: dict[str, float] = {}
        self.expected_idle: dict[str, float] = {}
        self.monitored: dict[str, tuple[tuple[int, ...], int, float, float]] = {}
        self.mbm_bytes: dict[tuple[str, int], tuple[float, float]] = {}
        self._retired_ns: dict[str, float] = {}  # uid -> CPU time of restarted containers
        for zone in self.zones:
            self._write_energy(zone)
        self._write_proc_stat()

    # --- pods ---

    @property
    def cgroup_base(self) -> str:
        return CGROUP if self.spec.cgroup_version == 2 else V1_CPU

    def _pod_rel_dir(self, uid: str, qos: str) -> str:
        if self.spec.cgroup_driver == "systemd":
            escaped = uid.replace("-", "_")
            if qos == "guaranteed":
                return f"kubepods.slice/kubepods-pod{escaped}.slice"
            return f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{escaped}.slice"
        return f"kubepods/pod{uid}" if qos == "guaranteed" else f"kubepods/{qos}/pod{uid}"

    def _container_dir(self, pod: SimLoadPod, container_id: str) -> Path:
        prefix = RUNTIME_PREFIX[pod.runtime]
        if self.spec.cgroup_driver == "systemd":
            name = f"{prefix}-{container_id}.scope"
        else:
            name = container_id if pod.runtime != "crio" else f"{prefix}-{container_id}"
        return self.root / self.cgroup_base / pod.rel_dir / name

    def add_pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        containers: Mapping[str, float],
        *,
        qos: str = "burstable",
        runtime: str = "containerd",
        sandbox_cpus: float = 0.0,
        logs: bool = True,
    ) -> SimLoadPod:
        """A running pod whose containers burn `containers[name]` CPUs each. `logs=False` leaves out the
        kubelet's log directories (the agent then cannot name it). A pod whose cgroup a simulated kubelet
        already made (rmd_sim.kubelet) keeps it, and the QoS class it shows."""
        if uid in self.pods:
            raise ValueError(f"pod uid {uid} already exists")
        if qos not in QOS_CLASSES or runtime not in RUNTIME_PREFIX:
            raise ValueError(f"qos must be one of {QOS_CLASSES}, runtime one of {tuple(RUNTIME_PREFIX)}")
        base = self.root / self.cgroup_base
        qos = next((q for q in QOS_CLASSES if (base / self._pod_rel_dir(uid, q)).is_dir()), qos)
        parts = {"": SimContainer("", _container_id(uid, "", 0), sandbox_cpus)}
        parts.update({n: SimContainer(n, _container_id(uid, n, 0), cpus) for n, cpus in containers.items()})
        pod = SimLoadPod(namespace, name, uid, qos, runtime, self._pod_rel_dir(uid, qos), parts)
        pod_dir = base / pod.rel_dir
        pod_dir.mkdir(parents=True, exist_ok=True)
        (pod_dir / "cgroup.procs").write_text("")
        for part in parts.values():
            self._container_dir(pod, part.id).mkdir()
            (self._container_dir(pod, part.id) / "cgroup.procs").write_text("")
        self.pods[uid] = pod
        self._write_pod(pod)
        if logs:
            for part in parts.values():
                self._write_log_link(pod, part)
        return pod

    def _log_dir(self, pod: SimLoadPod) -> Path:
        return self.root / POD_LOGS / f"{pod.namespace}_{pod.name}_{pod.uid}"

    def _write_log_link(self, pod: SimLoadPod, part: SimContainer) -> None:
        if not part.name:
            return  # the sandbox writes no log
        log_file = self._log_dir(pod) / part.name / f"{pod.restarts.get(part.name, 0)}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log_file.touch()
        link = self.root / CONTAINER_LOGS / f"{pod.name}_{pod.namespace}_{part.name}-{part.id}.log"
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(log_file, link.parent), link)

    def set_rate(self, uid: str, container: str, cpus: float) -> None:
        self.pods[uid].containers[container].cpus = cpus

    def restart_container(self, uid: str, name: str) -> str:
        """The container gets a new id and a fresh cgroup, as a restart does; its old cgroup is removed."""
        pod = self.pods[uid]
        old = pod.containers[name]
        shutil.rmtree(self._container_dir(pod, old.id))
        pod.restarts[name] = pod.restarts.get(name, 0) + 1
        new = SimContainer(name, _container_id(uid, name, pod.restarts[name]), old.cpus)
        pod.containers[name] = new
        self._container_dir(pod, new.id).mkdir()
        self._retired_ns[uid] = self._retired_ns.get(uid, 0.0) + old.usage_ns
        self._write_pod(pod)
        if (self._log_dir(pod)).is_dir():
            self._write_log_link(pod, new)
        return new.id

    def add_container(self, uid: str, name: str, cpus: float) -> str:
        """A container started in a running pod (a sidecar added, an ephemeral container): its cgroup and
        its log link; returns its id."""
        pod = self.pods[uid]
        new = SimContainer(name, _container_id(uid, name, 0), cpus)
        pod.containers[name] = new
        self._container_dir(pod, new.id).mkdir()
        self._write_pod(pod)
        self._write_log_link(pod, new)
        return new.id

    def remove_pod(self, uid: str) -> None:
        """The pod is deleted: its cgroups and log directories go."""
        pod = self.pods.pop(uid)
        shutil.rmtree(self.root / self.cgroup_base / pod.rel_dir, ignore_errors=True)
        shutil.rmtree(self._log_dir(pod), ignore_errors=True)
        for link in (self.root / CONTAINER_LOGS).glob(f"{pod.name}_{pod.namespace}_*.log"):
            link.unlink()
        self._retired_ns.pop(uid, None)

    # --- resctrl monitoring ---

    def monitor_group(
        self, group: str, *, llc_occupancy: int, mbm_total_bps: float, mbm_local_bps: float
    ) -> None:
        """Give resctrl group `group` monitoring data: a fixed LLC occupancy per L3 domain and bandwidth
        counters that advance at the given bytes per second."""
        cache_ids = tuple(range(self.spec.sockets))
        self.monitored[group] = (cache_ids, llc_occupancy, mbm_total_bps, mbm_local_bps)
        for cache_id in cache_ids:
            self.mbm_bytes.setdefault((group, cache_id), (0.0, 0.0))
        self._write_monitoring()

    def _write_monitoring(self) -> None:
        for group, (cache_ids, occupancy, _total, _local) in self.monitored.items():
            for cache_id in cache_ids:
                base = self.root / RESCTRL / group / "mon_data" / f"mon_L3_{cache_id:02d}"
                base.mkdir(parents=True, exist_ok=True)
                total, local = self.mbm_bytes[(group, cache_id)]
                _write(base / "llc_occupancy", f"{occupancy}\n")
                _write(base / "mbm_total_bytes", f"{int(total)}\n")
                _write(base / "mbm_local_bytes", f"{int(local)}\n")

    # --- time ---

    @property
    def busy_cpus(self) -> float:
        return min(float(self.spec.cpus), self.system_cpus + sum(p.cpus for p in self.pods.values()))

    def advance(self, seconds: float) -> None:
        """Move simulated time forward with the current rates and rewrite every counter."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        cpus = self.spec.cpus
        busy = self.busy_cpus
        sockets = self.spec.sockets
        for zone in self.zones:
            kind = _zone_kind(zone)
            if kind == "psys":
                watts = self.model.zone_watts(kind, busy)
            else:
                watts = self.model.zone_watts(kind, busy / sockets)
            joules = watts * seconds
            self._add_energy(zone, joules * 1e6)
            # the model's attribution: active = E * busy/cpus, pod = active * rate/busy = E * rate/cpus
            self.expected_idle[kind] = self.expected_idle.get(kind, 0.0) + joules * (1 - busy / cpus)
            self.expected_system[kind] = (
                self.expected_system.get(kind, 0.0) + joules * self.system_cpus / cpus
            )
            for pod in self.pods.values():
                per_pod = self.expected_pod.setdefault(pod.uid, {})
                per_pod[kind] = per_pod.get(kind, 0.0) + joules * pod.cpus / cpus
                for part in pod.containers.values():
                    per_part = self.expected_container.setdefault((pod.uid, part.name), {})
                    per_part[kind] = per_part.get(kind, 0.0) + joules * part.cpus / cpus
        for zone in self._mmio:
            self._write_energy(zone, self.energy_uj["intel-rapl:0"])
        for pod in self.pods.values():
            for part in pod.containers.values():
                part.usage_ns += part.cpus * seconds * 1e9
            self._write_pod(pod)
        self.busy_ticks += busy * seconds * USER_HZ
        self.idle_ticks += (cpus - busy) * seconds * USER_HZ
        self._write_proc_stat()
        for (group, cache_id), (total, local) in self.mbm_bytes.items():
            _, _, total_bps, local_bps = self.monitored[group]
            self.mbm_bytes[(group, cache_id)] = (total + total_bps * seconds, local + local_bps * seconds)
        if self.monitored:
            self._write_monitoring()
        self.now += seconds

    def _add_energy(self, zone: RaplZoneDir, microjoules: float) -> None:
        self.total_uj[zone.zone_id] += microjoules
        value = self.energy_uj[zone.zone_id] + microjoules
        if value >= MAX_ENERGY_RANGE_UJ:
            self.wraps[zone.zone_id] += int(value // MAX_ENERGY_RANGE_UJ)
            value = math.fmod(value, MAX_ENERGY_RANGE_UJ)
        self.energy_uj[zone.zone_id] = value
        self._write_energy(zone)

    def _write_energy(self, zone: RaplZoneDir, value: float | None = None) -> None:
        uj = self.energy_uj[zone.zone_id] if value is None else value
        _write(self.root / zone.rel_dir / "energy_uj", f"{int(uj)}\n")

    # --- files ---

    def _write_pod(self, pod: SimLoadPod) -> None:
        # the pod cgroup keeps the CPU time of containers that were restarted (their cgroups are gone)
        usage = sum(c.usage_ns for c in pod.containers.values()) + self._retired_ns.get(pod.uid, 0.0)
        self._write_usage(self.root / self.cgroup_base / pod.rel_dir, usage)
        for part in pod.containers.values():
            self._write_usage(self._container_dir(pod, part.id), part.usage_ns)

    def _write_usage(self, directory: Path, usage_ns: float) -> None:
        with contextlib.suppress(FileNotFoundError):  # a directory removed by restart_container
            if self.spec.cgroup_version == 2:
                usec = int(usage_ns // 1000)
                user = usec * 4 // 5
                _write_in_place(
                    directory / "cpu.stat",
                    f"usage_usec {usec:0{_WIDTH}d}\nuser_usec {user:0{_WIDTH}d}\n"
                    f"system_usec {usec - user:0{_WIDTH}d}\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
                )
            else:
                _write_in_place(directory / "cpuacct.usage", f"{int(usage_ns):0{_WIDTH}d}\n")

    def _write_proc_stat(self) -> None:
        cpus = self.spec.cpus
        busy, idle = int(self.busy_ticks), int(self.idle_ticks)

        def line(label: str, busy_part: int, idle_part: int) -> str:
            user = busy_part * 4 // 5
            return f"{label} {user} 0 {busy_part - user} {idle_part} 0 0 0 0 0 0"

        lines = [line("cpu ", busy, idle)]
        for cpu in range(cpus):  # spread evenly; the aggregate line is the exact sum
            lines.append(
                line(f"cpu{cpu}", busy // cpus + (cpu < busy % cpus), idle // cpus + (cpu < idle % cpus))
            )
        lines += ["intr 0", "ctxt 0", "btime 1700000000", "processes 1", "procs_running 1", "procs_blocked 0"]
        path = self.root / "proc/stat"
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, "\n".join(lines) + "\n")

    # --- what the agent should report ---

    def expected_pod_joules(self, uid: str, kind: str) -> float:
        return self.expected_pod.get(uid, {}).get(kind, 0.0)

    def expected_container_joules(self, uid: str, container: str, kind: str) -> float:
        return self.expected_container.get((uid, container), {}).get(kind, 0.0)

    def zone_joules(self, kind: str) -> float:
        """Energy of all zones of a kind since the load started (sum over sockets)."""
        return sum(self.total_uj[z.zone_id] for z in self.zones if _zone_kind(z) == kind) / 1e6
