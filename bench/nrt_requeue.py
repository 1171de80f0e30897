"""Benchmark: a pod the NUMA-aware scheduler rejected from its stale view is retried within 5 s (issue #14
item 3), against the real scheduler-plugins scheduler.

Needs scheduler-plugins' kube-scheduler (NodeResourceTopologyMatch). Its module is not served by the Go module
proxy, so CI cannot build it and this benchmark is run by hand: build the binary with
bench/numa_scheduler.py from the scheduler-plugins and numaplacement sources, then pass it with
`--scheduler` (default: $RMD_NUMA_SCHEDULER, else where that tool puts it). Exit status 2 when it is missing.

The cluster: a real control plane, one simulated node (the `default` spec: 64 CPUs in 2 NUMA zones of 32,
CPU 0 reserved, static CPU manager, topology manager single-numa-node) whose simulated kubelet runs the pods
bound to it, and `rmd-agent serve` publishing its NodeResourceTopology with default settings (the requeue echo
`nrt_requeue_seconds` 3). The scheduler runs with the KubeSchedulerConfiguration the operator deploys
(rmd_operator.scheduler_objects: over-reserve cache resynced every 2 s, resync method OnlyExclusiveResources),
started afresh for each round, so every round begins with a clean cache.

A round starts when the node holds no pod and its object was not written for `--quiet` seconds (default 4:
the previous round's echo and the agent's write-rate bound are over); with `--quiet 0` it starts as soon as
the previous round's pods are gone, so pod A's change waits for the write-rate bound (up to 1 s), the less
favourable case. Pod A (Guaranteed, 20 CPUs) is placed. Until its cache resyncs, the scheduler reserves A's
CPUs in every zone (zone 0: 31 - 20, zone 1: 32 - 20 left), so pod B (Guaranteed, 16 CPUs), created as soon as
A is bound, is rejected although zone 1 holds it: the stale-view rejection of the reference
numa-scheduler-interop.md. The kubelet admits A in zone 0, the agent publishes, the scheduler's resync
accepts the object (its pod fingerprint matches) and the echo, 3 s after the change, requeues B. Measured:
B created -> first rejection, B's failed scheduling attempts (the scheduler's log), every write of the
object from B's creation until B ran (a change, an echo: only the requeue annotation differs, or other),
B created -> bound, and whether the kubelet admitted B.

Baseline in the same run: one round with the echo off (`nrt_requeue_seconds: 0`, the agent before issue #14,
and RTE without its periodic writes): nothing requeues B but the scheduler's own flush of unschedulable pods
(a pod unschedulable for 5 minutes, checked every 30 s); the round ends at `--baseline-timeout`.

    python bench/nrt_requeue.py [--scheduler PATH] [--rounds 5] [--quiet 4] [--baseline-timeout 360]
                                [--json] [--keep]

Target (issue #14 item 3): in every round with the echo, B was rejected first, bound within 5 s of its
creation, and admitted by the kubelet. Exit status 1 when missed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import numa_scheduler
from operator_bench_common import (
    WatchThread,
    attributes,
    bench_cluster,
    ensure_namespace,
    machine,
    machine_line,
    progress,
    run_and_report,
    target_line,
)

from rmd_api.names import NODE_RESOURCE_TOPOLOGY as NRT
from rmd_api.names import NRT_REQUEUE_ANNOTATION
from rmd_operator.scheduler_objects import DEFAULT_SCHEDULER_NAME
from rmd_sim.cluster import SimCluster
from rmd_sim.kube_calls import api_call
from rmd_sim.spec import NodeSpec

NODE = "numa-node"
NAMESPACE = "bench-requeue"
A_CPUS = 20  # reserved by the stale cache in every zone: 11 and 12 CPUs left
B_CPUS = 16  # more than the stale view leaves in any zone, less than zone 1 really has
TARGET_SECONDS = 5.0
ROUND_TIMEOUT = 30.0  # a round with the echo that takes longer than this is a miss anyway
# Before a round, by default: no write of the node's object for this long, so the previous round's echo (3 s
# after its last change) and the agent's write-rate bound (1 s) are over and every round starts alike.
QUIET_SECONDS = 4.0
Obj = dict[str, Any]


# -- what a round sees -------------------------------------------------------------------------------------


def pod(name: str, cpus: int) -> Obj:
    """A Guaranteed pod with integral CPUs (exclusive, NUMA-aligned) that asks for the NUMA scheduler."""
    resources = {"cpu": str(cpus), "memory": "1Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "schedulerName": DEFAULT_SCHEDULER_NAME,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example.com/app:1",
                    "resources": {"requests": resources, "limits": dict(resources)},
                }
            ],
        },
    }


def write_kind(previous: Obj | None, current: Obj) -> str:
    """What a write of the node's object changed: "change" (zones or attributes: what the scheduler reads),
    "echo" (only the requeue annotation) or "other" (neither, e.g. a replace that repaired metadata)."""
    if previous is None or current.get("zones") != previous.get("zones"):
        return "change"
    if attributes(current) != attributes(previous):
        return "change"
    annotations = (current.get("metadata") or {}).get("annotations") or {}
    before = (previous.get("metadata") or {}).get("annotations") or {}
    return (
        "echo" if annotations.get(NRT_REQUEUE_ANNOTATION) != before.get(NRT_REQUEUE_ANNOTATION) else "other"
    )


def rejected(obj: Obj) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions)


@dataclass(frozen=True)
class PodTimes:
    """When the watch first saw a pod rejected, bound, running (monotonic; None: not yet)."""

    rejected: float | None
    bound: float | None
    running: float | None


class Watcher:
    """The pods of the namespace and the node's object, as a watch sees them (monotonic times). The watch
    threads write, the benchmark reads: both under the lock."""

    def __init__(self, api: Any) -> None:
        self._lock = threading.Lock()
        self._rejected: dict[str, float] = {}
        self._bound: dict[str, float] = {}
        self._running: dict[str, float] = {}
        self._nrt: Obj | None = None
        self._nrt_writes: list[tuple[float, str]] = []  # (time, write_kind)
        core = kubernetes.client.CoreV1Api(api)
        custom = kubernetes.client.CustomObjectsApi(api)
        self._threads = [
            WatchThread(core.list_namespaced_pod, self._on_pod, namespace=NAMESPACE),
            WatchThread(
                custom.list_cluster_custom_object,
                self._on_nrt,
                group=NRT.group,
                version=NRT.version,
                plural=NRT.plural,
                field_selector=f"metadata.name={NODE}",
            ),
        ]

    def start(self) -> Watcher:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        for thread in self._threads:
            thread.stop()

    def _on_pod(self, kind: str, obj: Obj, now: float) -> None:
        if kind == "DELETED":
            return
        uid = obj["metadata"]["uid"]
        with self._lock:
            if rejected(obj):
                self._rejected.setdefault(uid, now)
            if obj["spec"].get("nodeName"):
                self._bound.setdefault(uid, now)
            if (obj.get("status") or {}).get("phase") == "Running":
                self._running.setdefault(uid, now)

    def _on_nrt(self, kind: str, obj: Obj, now: float) -> None:
        with self._lock:
            if kind == "MODIFIED":
                self._nrt_writes.append((now, write_kind(self._nrt, obj)))
            self._nrt = obj

    def pod(self, uid: str) -> PodTimes:
        with self._lock:
            return PodTimes(self._rejected.get(uid), self._bound.get(uid), self._running.get(uid))

    def object(self) -> Obj | None:
        with self._lock:
            return self._nrt

    def writes_since(self, since: float) -> list[tuple[float, str]]:
        with self._lock:
            return [(t, kind) for t, kind in self._nrt_writes if t >= since]

    def quiet_for(self, seconds: float) -> bool:
        """No write of the node's object for `seconds`."""
        with self._lock:
            last = self._nrt_writes[-1][0] if self._nrt_writes else 0.0
        return time.monotonic() - last >= seconds

    async def wait(self, what: str, check: Callable[[], bool], within: float) -> bool:
        """Until `check()`; False after `within` seconds. A watch that died ends the benchmark."""
        deadline = time.monotonic() + within
        while not check():
            for thread in self._threads:
                if thread.error is not None:
                    raise RuntimeError(f"a watch failed: {thread.error!r}")
            if time.monotonic() > deadline:
                progress(False, f"  {what}: not within {within:g} s")
                return False
            await asyncio.sleep(0.01)
        return True


# -- a round -----------------------------------------------------------------------------------------------


@dataclass
class Round:
    echo: bool
    rejected_s: float | None = None  # B created -> its first rejection
    attempts: int = 0  # B's failed scheduling attempts (the scheduler's log: "Unable to schedule pod")
    bound_s: float | None = None  # B created -> bound to the node (None: not within the round's limit)
    running: bool = False  # the kubelet admitted B (the zone the scheduler trusted really had room)
    nrt_writes: list[tuple[float, str]] = field(default_factory=list)  # from B's creation until B ran
    rejection_message: str = ""


async def rejection_message(core: Any, name: str) -> str:
    listed = await api_call(
        core.list_namespaced_event, NAMESPACE, field_selector=f"involvedObject.name={name}"
    )
    failed = [
        e.get("message", "")
        for e in (listed or {}).get("items") or ()
        if e.get("reason") == "FailedScheduling"
    ]
    return failed[-1] if failed else ""


def failed_attempts(log: Path, name: str) -> int:
    """The scheduler's failed attempts for the pod, from its log (-v=2 logs each one)."""
    needle = f'pod="{NAMESPACE}/{name}"'
    return sum(
        1 for line in log.read_text().splitlines() if "Unable to schedule pod" in line and needle in line
    )


def idle_object(obj: Obj | None) -> bool:
    """The node's object shows every zone's CPUs available: the previous round's pods are gone."""
    if obj is None:
        return False
    cpu = [r for z in obj.get("zones") or () for r in z.get("resources") or () if r["name"] == "cpu"]
    return bool(cpu) and all(r["available"] == r["allocatable"] for r in cpu)


async def create_pod(core: Any, body: Obj) -> str:
    """Create the pod; its uid."""
    created = await api_call(core.create_namespaced_pod, NAMESPACE, body)
    return str((created or {})["metadata"]["uid"])


@dataclass(frozen=True)
class RoundSetup:
    scheduler: Path  # the binary
    quiet: float  # seconds without a write of the node's object before the round starts
    limit: float  # how long B may take


async def one_round(
    cluster: SimCluster, core: Any, watcher: Watcher, number: int, setup: RoundSetup, *, echo: bool
) -> Round:
    """A round from a node without pods whose object was not written for `setup.quiet` seconds."""
    assert cluster.control_plane is not None
    if not await watcher.wait(
        "the node's object idle and quiet",
        lambda: idle_object(watcher.object()) and watcher.quiet_for(setup.quiet),
        60,
    ):
        raise RuntimeError(f"the node's object still shows pods of the previous round: {watcher.object()}")
    workdir = cluster.workdir / f"scheduler-{number}"
    ca_file = cluster.control_plane.pki_dir / "ca.crt"
    scheduler = numa_scheduler.spawn(setup.scheduler, workdir, cluster.kubeconfig, ca_file)
    result = Round(echo=echo)
    a_name, b_name = f"a-{number}", f"b-{number}"
    try:
        try:
            await asyncio.to_thread(scheduler.wait_healthy)
            a = await create_pod(core, pod(a_name, A_CPUS))
            if not await watcher.wait("A bound", lambda: watcher.pod(a).bound is not None, ROUND_TIMEOUT):
                raise RuntimeError(f"the scheduler did not place pod A:\n{scheduler.process.log_tail()}")
            created = time.monotonic()
            b = await create_pod(core, pod(b_name, B_CPUS))
            if await watcher.wait("B bound", lambda: watcher.pod(b).bound is not None, setup.limit):
                result.running = await watcher.wait(
                    "B running", lambda: watcher.pod(b).running is not None, ROUND_TIMEOUT
                )
            times = watcher.pod(b)
            result.bound_s = None if times.bound is None else times.bound - created
            result.rejected_s = None if times.rejected is None else times.rejected - created
            result.nrt_writes = [(t - created, kind) for t, kind in watcher.writes_since(created)]
            result.rejection_message = await rejection_message(core, b_name)
        finally:
            scheduler.stop()  # first: whatever ended the round, the process must not outlive it
        result.attempts = failed_attempts(scheduler.process.log_path, b_name)
    finally:
        for name in (a_name, b_name):
            # missing_ok: a pod the round did not get to create
            await api_call(
                core.delete_namespaced_pod, name, NAMESPACE, grace_period_seconds=0, missing_ok=True
            )
    return result


async def set_echo(cluster: SimCluster, seconds: float) -> None:
    node = cluster.nodes[NODE]
    await node.stop_agent()
    node.extra_settings["nrt_requeue_seconds"] = seconds
    await node.start_agent()


# -- the run -----------------------------------------------------------------------------------------------


def summarise(rounds: list[Round], baseline: Round | None, limit: float) -> dict[str, Any]:
    waits = [r.bound_s if r.bound_s is not None else ROUND_TIMEOUT for r in rounds]
    summary: dict[str, Any] = {
        "echo_p50_s": statistics.median(waits),
        "echo_max_s": max(waits),
        "all_rejected_first": all(r.rejected_s is not None for r in rounds),
        "all_running": all(r.running for r in rounds),
    }
    if baseline is not None:
        summary["baseline_s"] = baseline.bound_s if baseline.bound_s is not None else limit
        summary["baseline_bound"] = baseline.bound_s is not None
    return summary


def targets(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Bound within 5 s, in rounds where the case was made (B rejected first) and the scheduler was right to
    bind it (the kubelet admitted B)."""
    fast = summary["echo_max_s"] <= TARGET_SECONDS
    met = summary["all_rejected_first"] and summary["all_running"] and fast
    detail = (
        f"max {summary['echo_max_s']:.2f} s, p50 {summary['echo_p50_s']:.2f} s; in every round B was "
        f"rejected first: {'yes' if summary['all_rejected_first'] else 'NO'}, admitted by the kubelet: "
        f"{'yes' if summary['all_running'] else 'NO'}"
    )
    return [
        {"what": f"rejected pod bound <= {TARGET_SECONDS:g} s, every round", "met": met, "detail": detail}
    ]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "machine": machine(),
        "scheduler": str(args.scheduler),
        "quiet_s": args.quiet,
        "rounds": [],
    }
    rounds: list[Round] = []
    baseline = None
    async with bench_cluster("rmd-bench-requeue-", [NODE], keep=args.keep) as cluster:
        with cluster.api_client() as api:
            await asyncio.to_thread(ensure_namespace, api, NAMESPACE)
            core = kubernetes.client.CoreV1Api(api)
            watcher = await asyncio.to_thread(Watcher(api).start)
            try:
                setup = RoundSetup(args.scheduler, args.quiet, ROUND_TIMEOUT)
                for number in range(1, args.rounds + 1):
                    progress(args.json, f"round {number} of {args.rounds}, echo on")
                    rounds.append(await one_round(cluster, core, watcher, number, setup, echo=True))
                if args.baseline_timeout > 0:
                    progress(args.json, f"baseline: echo off, up to {args.baseline_timeout:g} s")
                    await set_echo(cluster, 0)
                    setup = RoundSetup(args.scheduler, args.quiet, args.baseline_timeout)
                    baseline = await one_round(cluster, core, watcher, 0, setup, echo=False)
            finally:
                await asyncio.to_thread(watcher.stop)
    result["rounds"] = [asdict(r) for r in rounds]
    result["baseline"] = asdict(baseline) if baseline is not None else None
    result["summary"] = summarise(rounds, baseline, args.baseline_timeout)
    result["targets"] = targets(result["summary"])
    return result


def _writes(writes: Sequence[Sequence[Any]]) -> str:  # (time, kind); lists once read from JSON
    return ", ".join(f"{t:.2f} {kind}" for t, kind in writes) or "none"


def report(result: Mapping[str, Any]) -> None:
    spec = NodeSpec.default()
    print(machine_line(result["machine"]))
    print(
        f"scheduler-plugins kube-scheduler {result['scheduler']}; simulated node {spec.cpus} CPUs in "
        f"{spec.numa_nodes} NUMA zones; pod A {A_CPUS} CPUs, then pod B {B_CPUS} CPUs; each round after "
        f"{result['quiet_s']:g} s without a write of the node's object"
    )
    print(
        f"{'round':<10}{'echo':<6}{'B rejected':>12}{'attempts':>10}{'B bound':>10}  B ran  "
        "NRT writes from B's creation until B ran (s)"
    )
    rows = [(str(i + 1), r) for i, r in enumerate(result["rounds"])]
    if result["baseline"] is not None:
        rows.append(("baseline", result["baseline"]))
    for label, r in rows:
        rejected_s = f"{r['rejected_s']:.2f} s" if r["rejected_s"] is not None else "no"
        bound = f"{r['bound_s']:.2f} s" if r["bound_s"] is not None else "never"
        print(
            f"{label:<10}{'on' if r['echo'] else 'off':<6}{rejected_s:>12}{r['attempts']:>10}{bound:>10}"
            f"  {'yes' if r['running'] else 'no ':<5}  {_writes(r['nrt_writes'])}"
        )
    summary = result["summary"]
    if "baseline_s" in summary:
        ratio = summary["echo_max_s"] / summary["baseline_s"]
        bound = "" if summary["baseline_bound"] else " (not bound by then)"
        print(
            f"with the echo: max {summary['echo_max_s']:.2f} s; without: {summary['baseline_s']:.1f} s"
            f"{bound}; ratio {ratio:.3f}"
        )
    if result["rounds"]:
        print(f"the scheduler's rejection: {result['rounds'][0]['rejection_message']}")
    for t in result["targets"]:
        print(target_line(t["what"], t["met"], t["detail"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--scheduler", type=Path, default=numa_scheduler.default_binary())
    parser.add_argument("--rounds", type=int, default=5, help="rounds with the echo (the default settings)")
    parser.add_argument(
        "--baseline-timeout", type=float, default=360.0, help="the round without the echo; 0: leave it out"
    )
    parser.add_argument(
        "--quiet",
        type=float,
        default=QUIET_SECONDS,
        help="seconds without a write of the node's object before each round; 0: start as soon as the "
        "previous round's pods are gone (pod A's change then waits for the agent's write-rate bound)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not args.scheduler.is_file():
        print(
            f"no scheduler-plugins kube-scheduler at {args.scheduler}: build it with "
            "python bench/numa_scheduler.py SCHEDULER_PLUGINS_SRC NUMAPLACEMENT_SRC, or pass --scheduler",
            file=sys.stderr,
        )
        return 2
    result = run_and_report(run, args, report)
    return 0 if all(t["met"] for t in result["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
