"""Benchmark: our NodeResourceTopology export against resource-topology-exporter (RTE), same node, same run.

Builds RTE from the Go module proxy into the binary cache (outside the repository, keyed by version), starts
a real control plane (etcd, kube-apiserver with the NRT CRD), writes the `large` simulated node (256 CPUs,
8 NUMA nodes) and serves it with a simulated kubelet (PodResources over gRPC, cpu_manager_state replaced
by rename, pod cgroups and log directories) holding 500 pods. Then runs, one after the other on that node:

    ours            `rmd-agent serve` with the NRT export on (power, device plugin, RmdNodeState and heartbeat
                    off: those are not NRT work), default settings
    RTE notify+10s  RTE the way numaresources-operator runs it: notify file touched by a hook after every
                    change, a 10 s periodic update, fingerprint with-exclusive-resources, node refresh
    RTE 10s         the same, periodic only (no notify file)

Each contender publishes under its own object name and goes through the same phases:

    start    its object deleted, the process spawned; time until a watch sees the object correct (zones'
             available CPUs and the pod fingerprint as the simulated kubelet holds them)
    idle     IDLE seconds with nothing changing: process CPU, API writes (the API server's own counters),
             RSS at the end
    churn    CHANGES changes, one every CHANGE_INTERVAL seconds (but never before the previous one was
             published): a Guaranteed pod with 2 exclusive CPUs admitted, then removed again. Per change, the
             time from the kubelet's write to the watch seeing the object updated; process CPU per change

Then every semantic difference between our object and RTE's (same kubelet state) is listed. The figures to
compare across machines are the ratios: both ran on the same machine in the same run.

    python bench/nrt_vs_rte.py [--pods 500] [--changes 30] [--idle 60] [--repeat 1] [--json] [--keep]
    python bench/nrt_vs_rte.py --profile   # also py-spy our agent in idle and churn (needs py-spy)

Targets (issue 14): CPU per change and idle CPU <= RTE's (notify+10s); change -> object p50 <= 0.1 s and
p99 <= 0.25 s; start -> correct object <= 0.5 s; no API write at idle; our RSS <= 1.3x RTE's.
Exit status 1 when one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import yaml
from kubernetes.client.exceptions import ApiException
from operator_bench_common import (
    GO_ENV,
    WatchThread,
    api_requests,
    attributes,
    cache_root,
    cpu_seconds,
    go_env,
    machine,
    machine_line,
    peak_rss_mib,
    percentile,
    progress,
    rss_mib,
    run_and_report,
)

from rmd_agent.nrt.fingerprint import fingerprint
from rmd_agent.nrt.quantity import parse_integer_quantity
from rmd_api.names import NODE_RESOURCE_TOPOLOGY as NRT
from rmd_sim.control_plane import ControlPlane, find_bin_dir, repo_root
from rmd_sim.hosttree import write_host_tree
from rmd_sim.kubelet import ContainerSpec, SimKubelet
from rmd_sim.netutil import free_port
from rmd_sim.spec import NodeSpec

RTE_MODULE = "github.com/k8stopologyawareschedwg/resource-topology-exporter"
RTE_VERSION = "v0.24.0"
RTE_PERIOD = "10s"  # numaresources-operator's default infoRefreshPeriod
CHANGE_TIMEOUT = 30.0  # a change not published within this counts as this long
START_TIMEOUT = 60.0
SETTLE = 5.0  # after the start, before idle is measured
NRT_CRD = "noderesourcetopologies.topology.node.k8s.io.yaml"
PFP = "nodeTopologyPodsFingerprint"
Obj = dict[str, Any]


# -- building RTE ------------------------------------------------------------------------------------------


def build_rte(version: str = RTE_VERSION, quiet: bool = False) -> Path:
    """RTE's binary, built from the module proxy once per (version, Go version, recipe) and cached.

    `go install module@version` refuses modules whose go.mod has replace directives (RTE's has), so the
    module is downloaded and built from its own directory, where the replaces apply."""
    go_version = subprocess.run(["go", "version"], capture_output=True, text=True, check=True).stdout
    recipe = f"{RTE_MODULE}@{version} {go_version} {sorted(GO_ENV.items())} -trimpath -s -w"
    key = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    binary = cache_root() / f"rte-{version}-{key}" / "resource-topology-exporter"
    if binary.is_file():
        return binary
    progress(quiet, f"building RTE {version} from the Go module proxy into {binary.parent} (minutes)")
    with tempfile.TemporaryDirectory(prefix="rte-build-") as tmp:
        info = json.loads(
            subprocess.run(
                ["go", "mod", "download", "-json", f"{RTE_MODULE}@{version}"],
                capture_output=True,
                text=True,
                check=True,
                env=go_env(),
                cwd=tmp,
            ).stdout
        )
        src = Path(tmp) / "src"
        shutil.copytree(info["Dir"], src)  # the module cache is read-only
        for path in src.rglob("*"):
            path.chmod(path.stat().st_mode | 0o200)
        partial = binary.with_name(binary.name + ".partial")
        partial.parent.mkdir(parents=True, exist_ok=True)
        ldflags = f"-s -w -X {RTE_MODULE}/pkg/version.version={version}"
        subprocess.run(
            [
                "go",
                "build",
                "-trimpath",
                "-ldflags",
                ldflags,
                "-o",
                str(partial),
                "./cmd/resource-topology-exporter",
            ],
            check=True,
            env=go_env(),
            cwd=src,
        )
        partial.rename(binary)
    return binary


# -- the node ----------------------------------------------------------------------------------------------


def pod_containers(i: int) -> list[ContainerSpec]:
    """The standing pods, 2 containers each: 1 in 5 Guaranteed with an exclusive CPU, 1 in 5 Guaranteed with
    fractional CPUs, 2 in 5 Burstable, 1 in 5 BestEffort."""
    kind = i % 5
    if kind == 0:
        return [
            ContainerSpec("app", "1", "1", "256Mi", "256Mi"),
            ContainerSpec("log", "100m", "100m", "64Mi", "64Mi"),
        ]
    if kind == 1:
        return [
            ContainerSpec("app", "500m", "500m", "256Mi", "256Mi"),
            ContainerSpec("log", "100m", "100m", "64Mi", "64Mi"),
        ]
    if kind in (2, 3):
        return [
            ContainerSpec("app", "250m", "2", "128Mi", "1Gi"),
            ContainerSpec("log", "10m", None, "32Mi", None),
        ]
    return [ContainerSpec("app"), ContainerSpec("log")]


def pod_uid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench/{name}"))


CHURN_POD = [ContainerSpec("app", "2", "2", "512Mi", "512Mi")]


@dataclass
class Node:
    root: Path
    spec: NodeSpec
    kubelet: SimKubelet

    def expected_cpu(self) -> dict[str, int]:
        """Zone -> available CPUs: allocatable minus exclusive, as every correct exporter publishes it."""
        allocatable = self.kubelet.allocatable_cpus()
        exclusive = frozenset().union(*self.kubelet.assignments().values())
        return {
            f"node-{n}": len((allocatable & frozenset(self.spec.cpus_of_node(n))) - exclusive)
            for n in range(self.spec.numa_nodes)
        }

    def expected_pfp(self, rule: str) -> str:
        """The pod fingerprint: "scheduler" counts what the NUMA scheduler counts (Guaranteed pods), "rte" the
        pods PodResources shows exclusive resources for (RTE's rule)."""
        pods = self.kubelet.pods
        chosen = [p for p in pods if (p.qos == "Guaranteed" if rule == "scheduler" else any(p.cpus.values()))]
        return fingerprint((p.namespace, p.name) for p in chosen)


def zone_cpu(obj: Obj) -> dict[str, int]:
    return {
        z["name"]: parse_integer_quantity(r["available"])
        for z in obj.get("zones") or ()
        for r in z.get("resources") or ()
        if r["name"] == "cpu"
    }


# -- the contenders ----------------------------------------------------------------------------------------


@dataclass
class Contender:
    label: str
    object_name: str
    rule: str  # how it selects the fingerprint's pods: "scheduler" or "rte"
    argv: list[str]
    env: dict[str, str]
    log: Path
    notify: Path | None = None  # touched after every change (numaresources-operator's OCI hook)
    is_ours: bool = False


def our_contender(workdir: Path, root: Path, kubeconfig: Path) -> Contender:
    name = "nrt-ours"
    config = {
        "node_name": name,
        "host_root": str(root),
        "kubeconfig": str(kubeconfig),
        "grpc_listen": f"127.0.0.1:{free_port()}",
        "http_listen": f"127.0.0.1:{free_port()}",
        "insecure": True,
        "state_path": "var/lib/rmd-agent-bench/state.json",
        "pstate_counters": "files",
        "nrt_enabled": True,
        "power_enabled": False,
        "device_plugin_enabled": False,
        "node_state_enabled": False,
        "heartbeat_seconds": 0,
    }
    path = workdir / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "rmd_agent", "serve", "--config", str(path)]
    return Contender("ours", name, "scheduler", argv, dict(os.environ), workdir / "agent.log", is_ours=True)


def rte_contender(
    binary: Path, workdir: Path, root: Path, kubeconfig: Path, spec: NodeSpec, *, notify: bool
) -> Contender:
    name = "nrt-rte-notify" if notify else "nrt-rte-periodic"
    run = workdir / name
    run.mkdir(parents=True, exist_ok=True)
    argv = [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--podresources-socket=unix://{root / 'var/lib/kubelet/pod-resources/kubelet.sock'}",
        f"--sysfs={root / 'sys'}",
        f"--topology-manager-policy={spec.topology_manager_policy}",
        f"--topology-manager-scope={spec.topology_manager_scope}",
        # As numaresources-operator renders its DaemonSet (objectupdate/rte DaemonSetArgs), metrics in plain
        # http (no certificates here) and without pod conditions (RTE runs in no pod here).
        "--refresh-node-resources",
        "--add-nrt-owner=false",
        f"--sleep-interval={RTE_PERIOD}",
        "--pods-fingerprint",
        "--pods-fingerprint-method=with-exclusive-resources",
        f"--pods-fingerprint-status-file={run / 'dump.json'}",
        "--metrics-mode=http",
        "--metrics-ip=127.0.0.1",
        f"--metrics-port={free_port()}",
        "--podreadiness=false",
    ]
    notify_file = None
    if notify:
        notify_file = run / "notify"
        argv.append(f"--notify-file={notify_file}")
    env = {**os.environ, "NODE_NAME": name}
    label = f"RTE notify+{RTE_PERIOD}" if notify else f"RTE {RTE_PERIOD}"
    return Contender(label, name, "rte", argv, env, run / "rte.log", notify=notify_file)


# -- measuring ---------------------------------------------------------------------------------------------


class Objects:
    """The NRT objects as a watch sees them: the latest of each, and waiting for one to satisfy a check."""

    def __init__(self, api: Any) -> None:
        self.lock = threading.Condition()
        self.latest: dict[str, tuple[float, Obj | None]] = {}
        objects = kubernetes.client.CustomObjectsApi(api)

        def list_fn(**kwargs: Any) -> Any:
            return objects.list_cluster_custom_object(NRT.group, NRT.version, NRT.plural, **kwargs)

        self.watch = WatchThread(list_fn, self._event)

    def _event(self, kind: str, obj: Obj, at: float) -> None:
        name = obj.get("metadata", {}).get("name", "")
        with self.lock:
            self.latest[name] = (at, None if kind == "DELETED" else obj)
            self.lock.notify_all()

    def get(self, name: str) -> Obj | None:
        with self.lock:
            return self.latest.get(name, (0.0, None))[1]

    def wait_gone(self, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.lock:
            while self.latest.get(name, (0.0, None))[1] is not None and time.monotonic() < deadline:
                self.lock.wait(max(0.0, deadline - time.monotonic()))

    def wait(self, name: str, check: Callable[[Obj], bool], timeout: float) -> float | None:
        """Monotonic arrival time of the first event (from now on, or the current object) that passes."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                at, obj = self.latest.get(name, (0.0, None))
                if obj is not None and check(obj):
                    return at
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.lock.wait(left)


def correct(node: Node, rule: str) -> Callable[[Obj], bool]:
    cpu, pfp = node.expected_cpu(), node.expected_pfp(rule)
    return lambda obj: zone_cpu(obj) == cpu and attributes(obj).get(PFP) == pfp


def writes(before: Mapping[str, float], after: Mapping[str, float]) -> float:
    """Writes of NodeResourceTopologies the API server served between two api_requests() reads."""
    verbs = ("POST", "PUT", "PATCH", "APPLY")
    return sum(
        v - before.get(k, 0.0)
        for k, v in after.items()
        if k.split()[0] in verbs and k.split()[1] == NRT.plural
    )


@dataclass
class Figures:
    start_s: float = float("nan")
    idle_cpu_per_min_ms: float = float("nan")
    idle_writes_per_min: float = float("nan")
    rss_idle_mib: float = float("nan")
    rss_peak_mib: float = float("nan")
    cpu_per_change_ms: float = float("nan")
    writes_per_change: float = float("nan")
    latencies_s: list[float] = field(default_factory=list)
    missed_changes: int = 0
    object_bytes: int = 0
    final: Obj | None = None


def compact(obj: Obj) -> Obj:
    """The object without what the API server adds (managedFields, resourceVersion, uid, ...)."""
    metadata = {
        k: v
        for k, v in obj.get("metadata", {}).items()
        if k in ("name", "annotations", "ownerReferences", "labels")
    }
    return {**{k: v for k, v in obj.items() if k != "metadata"}, "metadata": metadata}


@contextlib.contextmanager
def process(contender: Contender) -> Iterator[subprocess.Popen[bytes]]:
    with contender.log.open("ab") as log:
        proc = subprocess.Popen(
            contender.argv, stdout=log, stderr=subprocess.STDOUT, env=contender.env, start_new_session=True
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextlib.contextmanager
def py_spy(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy samples `pid` into `out` (collapsed stacks) while the block runs; nothing when out is None."""
    if out is None:
        yield
        return
    spy = subprocess.Popen(
        [
            "py-spy",
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            "200",
            "--nonblocking",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            spy.wait(30)


async def measure(
    contender: Contender,
    node: Node,
    objects: Objects,
    api: Any,
    *,
    idle: float,
    changes: int,
    interval: float,
    profile: Path | None,
    quiet: bool,
) -> Figures:
    figures = Figures()
    custom = kubernetes.client.CustomObjectsApi(api)
    with contextlib.suppress(ApiException):
        await asyncio.to_thread(
            custom.delete_cluster_custom_object, NRT.group, NRT.version, NRT.plural, contender.object_name
        )
    await asyncio.to_thread(objects.wait_gone, contender.object_name, START_TIMEOUT)

    check = correct(node, contender.rule)
    began = time.monotonic()
    with process(contender) as proc:
        seen = await asyncio.to_thread(objects.wait, contender.object_name, check, START_TIMEOUT)
        figures.start_s = (seen - began) if seen is not None else float("inf")
        progress(quiet, f"  {contender.label}: correct object {figures.start_s:.2f} s after the start")
        await asyncio.sleep(SETTLE)

        spy = profile / f"{contender.object_name}-idle.txt" if profile and contender.is_ours else None
        with py_spy(proc.pid, spy):
            cpu0, api0, t0 = (
                cpu_seconds(proc.pid),
                await asyncio.to_thread(api_requests, api),
                time.monotonic(),
            )
            await asyncio.sleep(idle)
            cpu1, api1, t1 = (
                cpu_seconds(proc.pid),
                await asyncio.to_thread(api_requests, api),
                time.monotonic(),
            )
        minutes = (t1 - t0) / 60
        figures.idle_cpu_per_min_ms = (cpu1 - cpu0) * 1e3 / minutes
        figures.idle_writes_per_min = writes(api0, api1) / minutes
        figures.rss_idle_mib = rss_mib(proc.pid)
        progress(
            quiet,
            f"  {contender.label}: idle {figures.idle_cpu_per_min_ms:.0f} ms CPU/min, "
            f"{figures.idle_writes_per_min:.1f} writes/min, RSS {figures.rss_idle_mib:.1f} MiB",
        )

        spy = profile / f"{contender.object_name}-churn.txt" if profile and contender.is_ours else None
        with py_spy(proc.pid, spy):
            cpu0, api0 = cpu_seconds(proc.pid), await asyncio.to_thread(api_requests, api)
            next_at = time.monotonic()
            held: str | None = None
            for step in range(changes):
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                changed = time.monotonic()
                if held is None:
                    held = f"churn-{step}"
                    node.kubelet.add_pod("bench", held, pod_uid(held), CHURN_POD)
                else:
                    node.kubelet.remove_pod(pod_uid(held))
                    held = None
                if contender.notify is not None:
                    contender.notify.touch()
                seen = await asyncio.to_thread(
                    objects.wait, contender.object_name, correct(node, contender.rule), CHANGE_TIMEOUT
                )
                if seen is None:
                    figures.missed_changes += 1
                figures.latencies_s.append((seen if seen is not None else changed + CHANGE_TIMEOUT) - changed)
                next_at = max(changed + interval, time.monotonic() + 0.2)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            cpu1, api1 = cpu_seconds(proc.pid), await asyncio.to_thread(api_requests, api)
        figures.cpu_per_change_ms = (cpu1 - cpu0) * 1e3 / changes
        figures.writes_per_change = writes(api0, api1) / changes
        figures.rss_peak_mib = peak_rss_mib(proc.pid)
        if held is not None:
            node.kubelet.remove_pod(pod_uid(held))
            await asyncio.to_thread(
                objects.wait, contender.object_name, correct(node, contender.rule), CHANGE_TIMEOUT
            )
        final = objects.get(contender.object_name)
        figures.final = compact(final) if final else None
        figures.object_bytes = len(json.dumps(figures.final, separators=(",", ":"))) if final else 0
        progress(
            quiet,
            f"  {contender.label}: {figures.cpu_per_change_ms:.1f} ms CPU per change, change -> object p50 "
            f"{percentile(figures.latencies_s, 50):.3f} s, max {max(figures.latencies_s):.3f} s",
        )
    return figures


# -- differences -------------------------------------------------------------------------------------------


def differences(ours: Obj, theirs: Obj, their_label: str = "RTE") -> list[str]:
    """Every semantic difference between two NodeResourceTopology objects (order ignored, quantities
    parsed)."""
    out: list[str] = []
    for key in ("ownerReferences", "annotations", "labels"):
        a, b = ours["metadata"].get(key), theirs["metadata"].get(key)
        if key == "annotations":
            for k in sorted(set(a or {}) | set(b or {})):
                if (a or {}).get(k) != (b or {}).get(k):
                    out.append(
                        f"annotation {k}: ours {(a or {}).get(k)!r}, {their_label} {(b or {}).get(k)!r}"
                    )
        elif a != b:
            out.append(f"metadata.{key}: ours {a!r}, {their_label} {b!r}")
    if ours.get("topologyPolicies") != theirs.get("topologyPolicies"):
        mine, other = ours.get("topologyPolicies"), theirs.get("topologyPolicies")
        out.append(f"topologyPolicies: ours {mine!r}, {their_label} {other!r}")
    a_attr, b_attr = attributes(ours), attributes(theirs)
    for k in sorted(set(a_attr) | set(b_attr)):
        if a_attr.get(k) != b_attr.get(k):
            out.append(f"attribute {k}: ours {a_attr.get(k)!r}, {their_label} {b_attr.get(k)!r}")
    a_zones = {z["name"]: z for z in ours.get("zones") or ()}
    b_zones = {z["name"]: z for z in theirs.get("zones") or ()}
    for name in sorted(set(a_zones) | set(b_zones)):
        za, zb = a_zones.get(name), b_zones.get(name)
        if za is None or zb is None:
            out.append(f"zone {name}: only in {'ours' if zb is None else their_label}")
            continue
        for key in ("type", "parent", "attributes"):
            if za.get(key) != zb.get(key):
                out.append(f"zone {name} {key}: ours {za.get(key)!r}, {their_label} {zb.get(key)!r}")
        costs_a = {c["name"]: c["value"] for c in za.get("costs") or ()}
        costs_b = {c["name"]: c["value"] for c in zb.get("costs") or ()}
        if costs_a != costs_b:
            out.append(f"zone {name} costs: ours {costs_a}, {their_label} {costs_b}")
        ra = {r["name"]: r for r in za.get("resources") or ()}
        rb = {r["name"]: r for r in zb.get("resources") or ()}
        for res in sorted(set(ra) | set(rb)):
            if res not in rb:
                out.append(f"zone {name} resource {res}: only in ours ({_amounts(ra[res])})")
            elif res not in ra:
                out.append(f"zone {name} resource {res}: only in {their_label} ({_amounts(rb[res])})")
            elif _amounts(ra[res]) != _amounts(rb[res]):
                out.append(
                    f"zone {name} resource {res}: ours {_amounts(ra[res])}, {their_label} {_amounts(rb[res])}"
                )
    return out


def _amounts(resource: Obj) -> str:
    return "/".join(
        str(parse_integer_quantity(resource[k])) for k in ("capacity", "allocatable", "available")
    )


def grouped(lines: Sequence[str]) -> list[str]:
    """Differences that repeat in every zone said once ("zone node-0..7 ...")."""
    by_text: dict[str, list[str]] = {}
    order: list[str] = []
    for line in lines:
        if line.startswith("zone node-"):
            zone, rest = line[len("zone ") :].split(" ", 1)
        else:
            zone, rest = "", line
        if rest not in by_text:
            by_text[rest] = []
            order.append(rest)
        by_text[rest].append(zone)
    out = []
    for rest in order:
        zones = [z for z in by_text[rest] if z]
        out.append(f"zone {','.join(z[len('node-') :] for z in zones)} {rest}" if zones else rest)
    return out


# -- the run -----------------------------------------------------------------------------------------------


ROWS: list[tuple[str, str, str]] = [
    ("cpu_per_change_ms", "CPU per change during churn", "ms"),
    ("idle_cpu_per_min_ms", "idle CPU per minute", "ms"),
    ("rss_idle_mib", "RSS idle", "MiB"),
    ("latency_p50_s", "change -> object updated, p50", "s"),
    ("latency_p99_s", "change -> object updated, p99", "s"),
    ("latency_max_s", "change -> object updated, max", "s"),
    ("start_s", "process start -> correct object", "s"),
    ("idle_writes_per_min", "idle API writes per minute", ""),
    ("writes_per_change", "API writes per change", ""),
    ("object_kb", "object size", "kB"),
]


def summarise(runs: Sequence[Figures]) -> dict[str, float]:
    def median(get: Callable[[Figures], float]) -> float:
        return statistics.median(get(f) for f in runs)

    return {
        "cpu_per_change_ms": median(lambda f: f.cpu_per_change_ms),
        "idle_cpu_per_min_ms": median(lambda f: f.idle_cpu_per_min_ms),
        "rss_idle_mib": median(lambda f: f.rss_idle_mib),
        "rss_peak_mib": median(lambda f: f.rss_peak_mib),
        "latency_p50_s": median(lambda f: percentile(f.latencies_s, 50)),
        "latency_p99_s": median(lambda f: percentile(f.latencies_s, 99)),
        "latency_max_s": median(lambda f: max(f.latencies_s)),
        "start_s": median(lambda f: f.start_s),
        "idle_writes_per_min": median(lambda f: f.idle_writes_per_min),
        "writes_per_change": median(lambda f: f.writes_per_change),
        "object_kb": median(lambda f: f.object_bytes / 1000),
        "missed_changes": sum(f.missed_changes for f in runs),
    }


def targets(ours: Mapping[str, float], rte: Mapping[str, float]) -> list[tuple[str, bool, str]]:
    return [
        (
            "CPU per change <= RTE's",
            ours["cpu_per_change_ms"] <= rte["cpu_per_change_ms"],
            f"{ours['cpu_per_change_ms']:.1f} vs {rte['cpu_per_change_ms']:.1f} ms",
        ),
        (
            "idle CPU <= RTE's",
            ours["idle_cpu_per_min_ms"] <= rte["idle_cpu_per_min_ms"],
            f"{ours['idle_cpu_per_min_ms']:.0f} vs {rte['idle_cpu_per_min_ms']:.0f} ms per minute",
        ),
        ("change -> object p50 <= 0.1 s", ours["latency_p50_s"] <= 0.1, f"{ours['latency_p50_s']:.3f} s"),
        ("change -> object p99 <= 0.25 s", ours["latency_p99_s"] <= 0.25, f"{ours['latency_p99_s']:.3f} s"),
        ("start -> correct object <= 0.5 s", ours["start_s"] <= 0.5, f"{ours['start_s']:.2f} s"),
        ("idle writes 0", ours["idle_writes_per_min"] == 0, f"{ours['idle_writes_per_min']:.1f} per minute"),
        (
            "RSS <= 1.3x RTE's",
            ours["rss_idle_mib"] <= 1.3 * rte["rss_idle_mib"],
            f"{ours['rss_idle_mib']:.1f} vs {rte['rss_idle_mib']:.1f} MiB",
        ),
    ]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    quiet = args.json
    binary = await asyncio.to_thread(build_rte, args.rte_version, quiet)
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None  # noqa: ASYNC240  # once, at start
    workdir = Path(tempfile.mkdtemp(prefix="rmd-bench-nrt-", dir=shm))
    profile = workdir / "profile" if args.profile else None
    if profile:
        profile.mkdir()
    control_plane = ControlPlane(
        find_bin_dir(), workdir / "control-plane", crds=[repo_root() / "crds" / NRT_CRD]
    )
    result: dict[str, Any] = {"machine": machine(), "pods": args.pods, "changes": args.changes}
    try:
        progress(quiet, "starting the control plane")
        await asyncio.to_thread(control_plane.start)
        spec = NodeSpec.large()
        root = workdir / "host"
        await asyncio.to_thread(write_host_tree, spec, root)
        kubelet = SimKubelet.from_host_tree(root)
        async with kubelet:
            for i in range(args.pods):
                kubelet.add_pod(f"ns-{i % 10}", f"pod-{i}", pod_uid(f"pod-{i}"), pod_containers(i))
            node = Node(root, spec, kubelet)
            contenders = [
                our_contender(workdir, root, control_plane.kubeconfig),
                rte_contender(binary, workdir, root, control_plane.kubeconfig, spec, notify=True),
                rte_contender(binary, workdir, root, control_plane.kubeconfig, spec, notify=False),
            ][: args.contenders]
            with control_plane.api_client() as api:
                core = kubernetes.client.CoreV1Api(api)
                for c in contenders:
                    core.create_node(
                        kubernetes.client.V1Node(metadata=kubernetes.client.V1ObjectMeta(name=c.object_name))
                    )
                objects = Objects(api)
                objects.watch.start()
                try:
                    runs: dict[str, list[Figures]] = {c.label: [] for c in contenders}
                    for rep in range(args.repeat):
                        for c in contenders:
                            progress(quiet, f"repetition {rep + 1}/{args.repeat}: {c.label}")
                            runs[c.label].append(
                                await measure(
                                    c,
                                    node,
                                    objects,
                                    api,
                                    idle=args.idle,
                                    changes=args.changes,
                                    interval=args.change_interval,
                                    profile=profile,
                                    quiet=quiet,
                                )
                            )
                finally:
                    objects.watch.stop()
        summary = {label: summarise(figs) for label, figs in runs.items()}
        labels = [c.label for c in contenders]
        ours_final, rte_final = runs[labels[0]][-1].final, runs[labels[1]][-1].final
        diffs = differences(ours_final, rte_final) if ours_final and rte_final else ["(an object is missing)"]
        result.update(
            contenders=labels,
            summary=summary,
            latencies_s={label: [f.latencies_s for f in figs] for label, figs in runs.items()},
            differences=grouped(diffs),
            targets=[
                {"what": what, "met": met, "detail": detail}
                for what, met, detail in targets(summary[labels[0]], summary[labels[1]])
            ],
            profile=str(profile) if profile else None,
        )
    finally:
        await asyncio.to_thread(control_plane.stop)
        if args.keep or args.profile:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def report(result: Mapping[str, Any]) -> None:
    labels = result["contenders"]
    summary = result["summary"]
    print(machine_line(result["machine"]))
    print(
        f"large simulated node ({NodeSpec.large().cpus} CPUs, {NodeSpec.large().numa_nodes} NUMA nodes), "
        f"simulated kubelet with {result['pods']} pods; {result['changes']} changes per contender"
    )
    head = (
        f"{'NRT figure':<34}"
        + "".join(f"{label:>16}" for label in labels)
        + "".join(f"{'ours/' + label:>22}" for label in labels[1:])
    )
    print(head)
    for key, title, unit in ROWS:
        name = f"{title}{' (' + unit + ')' if unit else ''}"
        values = [summary[label][key] for label in labels]
        cells = "".join(
            f"{v:>16.3f}" if key.startswith("latency") or key == "start_s" else f"{v:>16.1f}" for v in values
        )
        ratios = "".join(
            f"{(values[0] / v if v else float('inf') if values[0] else 1.0):>22.2f}" for v in values[1:]
        )
        print(f"{name:<34}{cells}{ratios}")
    missed = {label: summary[label]["missed_changes"] for label in labels if summary[label]["missed_changes"]}
    if missed:
        print(f"changes not published within {CHANGE_TIMEOUT:g} s: {missed}")
    print(f"semantic differences, ours vs {labels[1]} (same kubelet state):")
    for line in result["differences"] or ["none"]:
        print(f"  {line}")
    for t in result["targets"]:
        print(f"target {t['what']}: {'met' if t['met'] else 'MISSED'} ({t['detail']})")
    if result.get("profile"):
        print(f"py-spy profiles of our agent in {result['profile']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument(
        "--changes", type=int, default=30, help="changes per contender (even: ends as it began)"
    )
    parser.add_argument("--change-interval", type=float, default=2.0)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle measured")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions; figures are their medians")
    parser.add_argument("--rte-version", default=RTE_VERSION)
    parser.add_argument(
        "--contenders", type=int, choices=(2, 3), default=3, help="2: leave out RTE periodic-only (quicker)"
    )
    parser.add_argument("--profile", action="store_true", help="py-spy our agent in idle and churn")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    result = run_and_report(run, args, report)
    return 0 if all(t["met"] for t in result["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
