"""What the benchmarks share: a simulated cluster (rmd_sim.cluster.SimCluster) in /dev/shm that is always
taken down, a watch thread that timestamps API events, process memory and CPU time from /proc, the machine's
description, the report lines and how a benchmark runs and prints; where peers built from Go go (the binary
cache) and how they are built. Not a benchmark itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from rmd_api.names import RMD_WORKLOAD
from rmd_sim.cluster import SimCluster
from rmd_sim.resctrl_fuse import is_mounted, unmount

GROUP, VERSION, WORKLOADS = RMD_WORKLOAD.group, RMD_WORKLOAD.version, RMD_WORKLOAD.plural
STOP_TIMEOUT = 120.0  # a clean stop of 20 nodes takes seconds; past this, processes are killed
Obj = dict[str, Any]
_T = TypeVar("_T")


# Peers built from Go sources: the local toolchain, modules as each go.mod says, static binaries.
GO_ENV = {"GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}


def go_env() -> dict[str, str]:
    return {**os.environ, **GO_ENV}


def cache_root() -> Path:
    """The binary cache, outside the repository (as tools/build-binaries.sh)."""
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rmd-k8s"
    return Path(os.environ.get("RMD_BIN_CACHE") or default)


def attributes(obj: Obj) -> dict[str, str]:
    """A NodeResourceTopology's top-level attributes, by name."""
    return {a["name"]: a["value"] for a in obj.get("attributes") or ()}


# -- figures -----------------------------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): a value that was measured, never an interpolation."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _status_kib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    return math.nan


def rss_mib(pid: int) -> float:
    """Resident set size (VmRSS) of a process, in MiB."""
    return _status_kib(pid, "VmRSS") / 1024


def peak_rss_mib(pid: int) -> float:
    """The highest resident set size the process has had (VmHWM), in MiB."""
    return _status_kib(pid, "VmHWM") / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU time every CPU of the machine spent busy so far (all processes: ours and whatever else runs)."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(v) for v in Path("/proc/stat").read_text().split(maxsplit=8)[1:8]
    )
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def cluster_pids(cluster: SimCluster) -> dict[str, list[int]]:
    """The processes of a SimCluster by component; "benchmark" is this process (kubelets, FUSE servers when
    in-process, watches, API clients)."""
    out: dict[str, list[int]] = {"operator": [], "agents": [], "resctrl servers": []}
    out["benchmark"] = [os.getpid()]
    if cluster.operator is not None:
        out["operator"].append(cluster.operator.pid)
    for node in cluster.nodes.values():
        if node.process is not None:
            out["agents"].append(node.process.pid)
        if node.mount_process is not None:
            out["resctrl servers"].append(node.mount_process.pid)
    if cluster.control_plane is not None:
        for name, pid in cluster.control_plane.pids().items():
            out[name] = [pid]
    return out


def cpu_snapshot(pids: Mapping[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far per component, plus "machine" (every busy CPU, see machine_busy_seconds)."""
    snap = {"machine": machine_busy_seconds()}
    for name, group in pids.items():
        total = 0.0
        for pid in group:
            with contextlib.suppress(OSError):
                total += cpu_seconds(pid)
        snap[name] = total
    return snap


def cpu_used(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before.get(name, 0.0), 2) for name in after}


def cpu_line(used: Mapping[str, float], wall: float) -> str:
    ours = {k: v for k, v in used.items() if k != "machine"}
    busy = sorted(((k, v) for k, v in ours.items() if v >= 0.05), key=lambda kv: -kv[1])
    parts = ", ".join(f"{k} {v:.1f}" for k, v in busy) or "none"
    others = used["machine"] - sum(ours.values())
    return (
        f"CPU s: {parts}; other processes on the machine {max(others, 0.0):.1f}; "
        f"machine busy {used['machine']:.1f} of {wall * (os.cpu_count() or 1):.1f} available"
    )


def api_requests(api: Any) -> dict[str, float]:
    """The API server's own count of the requests it served so far (apiserver_request_total), by
    "VERB resource[/subresource]", read from its /metrics with the benchmark's admin client."""
    data = api.call_api("GET", f"{api.configuration.host}/metrics").read()
    counts: dict[str, float] = {}
    for line in data.decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line[len("apiserver_request_total{") :].rpartition("} ")
        labels = dict(part.split("=", 1) for part in labels_text.split('",') if "=" in part)
        labels = {k: v.strip('"') for k, v in labels.items()}
        key = f"{labels.get('verb')} {labels.get('resource')}"
        if labels.get("subresource"):
            key += f"/{labels['subresource']}"
        counts[key] = counts.get(key, 0.0) + float(value)
    return counts


def writes_line(before: Mapping[str, float], after: Mapping[str, float], per: int, what: str) -> str:
    """The writes (create, patch, update, delete) the API server served between two api_requests() reads,
    per `what` (e.g. per workload)."""
    diff = {k: after[k] - before.get(k, 0.0) for k in after}
    writes = {
        k: v for k, v in diff.items() if v > 0 and k.split()[0] in ("POST", "PATCH", "PUT", "DELETE", "APPLY")
    }
    parts = ", ".join(f"{k} {v / per:.2f}" for k, v in sorted(writes.items(), key=lambda kv: -kv[1]))
    return f"API writes per {what}: {sum(writes.values()) / per:.2f} ({parts or 'none'})"


def machine() -> dict[str, Any]:
    """What the figures were measured on (recorded with them in bench/README.md)."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0.0
    with contextlib.suppress(OSError):
        mem_kib = float(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_1m": round(os.getloadavg()[0], 2),
    }


def machine_line(m: Mapping[str, Any]) -> str:
    return (
        f"machine: {m['cpus']} CPUs ({m['cpu_model'] or 'unknown'}), {m['memory_gib']} GiB, "
        f"Python {m['python']}, Linux {m['kernel']}, load {m['load_1m']} at start"
    )


def target_line(what: str, met: bool, detail: str) -> str:
    return f"target {what}: {'met' if met else 'MISSED'} ({detail})"


def print_json(result: Mapping[str, Any]) -> None:
    json.dump(result, sys.stdout, indent=2, sort_keys=True, default=str)
    print()


def progress(quiet: bool, text: str) -> None:
    """Progress on stderr, so --json output stays clean."""
    if not quiet:
        print(text, file=sys.stderr, flush=True)


# -- the cluster -------------------------------------------------------------------------------------------


def _force_down(cluster: SimCluster) -> None:
    """Kill what a hung stop left behind: operator, agents, resctrl servers; unmount; the control plane."""
    procs = [cluster.operator] + [p for n in cluster.nodes.values() for p in (n.process, n.mount_process)]
    for proc in procs:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
    for node in cluster.nodes.values():
        if is_mounted(node.mount.mountpoint):
            with contextlib.suppress(Exception):
                unmount(node.mount.mountpoint, lazy=True)
    if cluster.control_plane is not None:
        cluster.control_plane.stop()


def _make_workdir(prefix: str) -> Path:
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # etcd and the node trees in memory
    return Path(tempfile.mkdtemp(prefix=prefix, dir=shm))


@contextlib.asynccontextmanager
async def bench_cluster(
    prefix: str,
    nodes: Iterable[str],
    *,
    resctrl_process: bool = True,
    operator_settings: Mapping[str, Any] | None = None,
    agent_settings: Mapping[str, Any] | None = None,
    keep: bool = False,
) -> AsyncIterator[SimCluster]:
    """A started SimCluster in a temporary directory under /dev/shm; stopped and removed on exit, whatever
    happened (a stop that hangs is cut short and its processes killed). `keep` leaves the directory (logs).
    """
    names = list(nodes)
    # The simulated kubelets keep one blocking API watch per node in asyncio.to_thread, and asyncio's default
    # executor has min(32, CPUs + 4) threads: with 20 nodes on 2 CPUs every other threaded call (API writes,
    # mounts) would queue behind watches that end only at their timeout.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=4 * len(names) + 16))
    workdir = _make_workdir(prefix)
    cluster = SimCluster(
        workdir,
        nodes=names,
        operator_settings=operator_settings,
        agent_settings=agent_settings,
        resctrl_process=resctrl_process,
    )
    try:
        await cluster.start()
        yield cluster
    finally:
        try:
            await asyncio.wait_for(asyncio.shield(cluster.stop()), STOP_TIMEOUT)
        except BaseException as exc:  # the cleanup below must run whatever stopped the stop
            print(
                f"cluster stop did not finish ({type(exc).__name__}); killing its processes", file=sys.stderr
            )
            await asyncio.to_thread(_force_down, cluster)
        if keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run_main(coro: Callable[[], Awaitable[_T]]) -> _T:
    """asyncio.run where SIGINT and SIGTERM cancel the benchmark's task, so its cleanup (the cluster's stop)
    runs as the cancellation unwinds; a second signal cuts the stop short (processes are then killed).
    Exits with status 130 when interrupted."""

    async def guarded() -> _T:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await coro()

    try:
        return asyncio.run(guarded())
    except asyncio.CancelledError:
        print("interrupted; cleaned up", file=sys.stderr)
        raise SystemExit(130) from None


def run_and_report(
    run: Callable[[argparse.Namespace], Awaitable[dict[str, Any]]],
    args: argparse.Namespace,
    report: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Run the benchmark (run_main) and print its result: JSON with --json, else its report."""
    result = run_main(lambda: run(args))
    if args.json:
        print_json(result)
    else:
        report(result)
    return result


def ensure_namespace(api: Any, name: str, timeout: float = 60.0) -> None:
    """Create a namespace and wait for its default ServiceAccount (pods are refused until it exists)."""
    core = kubernetes.client.CoreV1Api(api)
    with contextlib.suppress(ApiException):
        core.create_namespace(
            kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name=name))
        )
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            return
        except ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


async def wait_event(event: threading.Event, limit: float) -> bool:
    """Wait for a thread's event without parking a worker thread (cancellable, so Ctrl-C is prompt)."""
    deadline = time.monotonic() + limit
    while True:
        if event.is_set() or time.monotonic() > deadline:
            return event.is_set()
        await asyncio.sleep(0.02)


# -- watching --------------------------------------------------------------------------------------------


class WatchThread:
    """Calls `on_event(type, raw object, monotonic time of arrival)` for every event of a list call's watch,
    in a background thread; relists (as ADDED) when the watch expires. The raw objects are not turned into
    the client's model classes (slow for pods)."""

    def __init__(
        self, list_fn: Callable[..., Any], on_event: Callable[[str, Obj, float], None], **kwargs: Any
    ) -> None:
        self._list_fn = list_fn
        self._kwargs = kwargs
        self._on_event = on_event
        self._stopped = threading.Event()
        self._watch = watch.Watch()  # type: ignore[no-untyped-call]  # the watch module is untyped
        self._thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)
        self.synced = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> WatchThread:
        self._thread.start()
        if not self.synced.wait(60):
            raise RuntimeError(f"watch did not start: {self.error}")
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()  # type: ignore[no-untyped-call]
        self._thread.join(15)

    def _list(self) -> str:
        listed = json.loads(self._list_fn(**self._kwargs, _preload_content=False).data)
        now = time.monotonic()
        for item in listed.get("items") or ():
            self._on_event("ADDED", item, now)
        return str(listed["metadata"]["resourceVersion"])

    def _run(self) -> None:
        try:
            version = self._list()
            self.synced.set()
            while not self._stopped.is_set():
                try:
                    for event in self._watch.stream(  # type: ignore[no-untyped-call]
                        self._list_fn, resource_version=version, timeout_seconds=60, **self._kwargs
                    ):
                        raw = event["raw_object"]
                        if event["type"] == "ERROR":
                            raise ApiException(status=raw.get("code", 500), reason=raw.get("message"))
                        version = str(raw.get("metadata", {}).get("resourceVersion") or version)
                        if event["type"] != "BOOKMARK":
                            self._on_event(event["type"], raw, time.monotonic())
                        if self._stopped.is_set():
                            return
                except ApiException as exc:
                    if exc.status != 410:
                        raise
                    version = self._list()
        except BaseException as exc:  # reported through .error, the thread must end quietly
            self.error = exc
            self.synced.set()
