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

A round: pod A (Guaranteed, 20 CPUs) is placed. Until its cache resyncs, the scheduler reserves A's CPUs in
every zone (zone 0: 31 - 20, zone 1: 32 - 20 left), so pod B (Guaranteed, 16 CPUs), created as soon as A is
bound, is rejected although zone 1 holds it: the stale-view rejection of the reference
numa-scheduler-interop.md. The kubelet admits A in zone 0, the agent publishes, the scheduler's resync
accepts the object (its pod fingerprint matches) and the echo, 3 s after the change, requeues B. Measured:
B created -> first rejection, B's scheduling attempts (its FailedScheduling events), every write of the
object after B's creation (a change, or an echo: only the requeue annotation differs), B created -> bound,
and whether the kubelet admitted B.

Baseline in the same run: one round with the echo off (`nrt_requeue_seconds: 0`, the agent before issue #14,
and RTE without its periodic writes): nothing requeues B but the scheduler's own flush of unschedulable pods
(a pod unschedulable for 5 minutes, checked every 30 s); the round ends at `--baseline-timeout`.

    python bench/nrt_requeue.py [--scheduler PATH] [--rounds 5] [--baseline-timeout 360] [--json] [--keep]

Target (issue #14 item 3): in every round with the echo, B was rejected first and was bound within 5 s of its
creation. Exit status 1 when missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import numa_scheduler
from nrt_vs_rte import attributes
from operator_bench_common import (
    WatchThread,
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
from rmd_sim.spec import NodeSpec

NODE = "numa-node"
NAMESPACE = "bench-requeue"
A_CPUS = 20  # reserved by the stale cache in every zone: 11 and 12 CPUs left
B_CPUS = 16  # more than the stale view leaves in any zone, less than zone 1 really has
TARGET_SECONDS = 5.0
ROUND_TIMEOUT = 30.0  # a round with the echo that takes longer than this is a miss anyway
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


def is_echo(previous: Obj | None, current: Obj) -> bool:
    """A write of the object that changed nothing but the requeue annotation: the echo."""
    if previous is None:
        return False
    annotations = (current.get("metadata") or {}).get("annotations") or {}
    before = (previous.get("metadata") or {}).get("annotations") or {}
    return (
        current.get("zones") == previous.get("zones")
        and attributes(current) == attributes(previous)
        and annotations.get(NRT_REQUEUE_ANNOTATION) != before.get(NRT_REQUEUE_ANNOTATION)
    )


def rejected(obj: Obj) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions)


class Watcher:
    """The pods of the namespace and the node's object, as a watch sees them (monotonic times)."""

    def __init__(self, api: Any) -> None:
        self._lock = threading.Lock()
        self.first_rejected: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.nrt: Obj | None = None
        self.nrt_writes: list[tuple[float, str]] = []  # (time, "change" or "echo")
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
        uid = obj["metadata"]["uid"]
        with self._lock:
            if kind == "DELETED":
                return
            if rejected(obj):
                self.first_rejected.setdefault(uid, now)
            if obj["spec"].get("nodeName"):
                self.bound.setdefault(uid, now)
            if (obj.get("status") or {}).get("phase") == "Running":
                self.running.setdefault(uid, now)

    def _on_nrt(self, kind: str, obj: Obj, now: float) -> None:
        with self._lock:
            if kind == "MODIFIED":
                self.nrt_writes.append((now, "echo" if is_echo(self.nrt, obj) else "change"))
            self.nrt = obj

    def object(self) -> Obj | None:
        with self._lock:
            return self.nrt


async def wait_for(what: str, check: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while not check():
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
    attempts: int = 0  # B's scheduling attempts that failed (FailedScheduling events, counted)
    bound_s: float | None = None  # B created -> bound to the node (None: not within the round's limit)
    running: bool = False  # the kubelet admitted B (the zone the scheduler trusted really had room)
    nrt_writes: list[tuple[float, str]] = field(default_factory=list)  # after B's creation
    rejection_message: str = ""


def failed_scheduling(core: Any, name: str) -> tuple[int, str]:
    events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items
    failed = [e for e in events if e.reason == "FailedScheduling"]
    return sum(e.count or 1 for e in failed), (failed[-1].message if failed else "")


def idle_object(obj: Obj | None) -> bool:
    """The node's object shows every zone's CPUs available: the previous round's pods are gone."""
    if obj is None:
        return False
    cpu = [r for z in obj.get("zones") or () for r in z.get("resources") or () if r["name"] == "cpu"]
    return bool(cpu) and all(r["available"] == r["allocatable"] for r in cpu)


def create_pod(core: Any, body: Obj) -> str:
    """Create the pod; its uid."""
    created = core.create_namespaced_pod(NAMESPACE, body, _preload_content=False)
    return str(json.loads(created.data)["metadata"]["uid"])


async def one_round(
    cluster: SimCluster, binary: Path, watcher: Watcher, number: int, *, echo: bool, limit: float
) -> Round:
    assert cluster.control_plane is not None
    core = kubernetes.client.CoreV1Api(cluster.api_client())
    if not await wait_for("the node's object back to idle", lambda: idle_object(watcher.object()), 60):
        raise RuntimeError(f"the node's object still shows pods of the previous round: {watcher.object()}")
    scheduler = await asyncio.to_thread(
        numa_scheduler.start,
        binary,
        cluster.workdir / f"scheduler-{number}",
        cluster.kubeconfig,
        cluster.control_plane.pki_dir / "ca.crt",
    )
    result = Round(echo=echo)
    names = (f"a-{number}", f"b-{number}")
    try:
        a = await asyncio.to_thread(create_pod, core, pod(names[0], A_CPUS))
        if not await wait_for("A bound", lambda: a in watcher.bound, ROUND_TIMEOUT):
            raise RuntimeError(f"the scheduler did not place pod A:\n{scheduler.log_tail()}")
        created = time.monotonic()
        uid = await asyncio.to_thread(create_pod, core, pod(names[1], B_CPUS))
        await wait_for("B bound", lambda: uid in watcher.bound, limit)
        if uid in watcher.bound:
            result.bound_s = watcher.bound[uid] - created
            result.running = await wait_for("B running", lambda: uid in watcher.running, ROUND_TIMEOUT)
        if uid in watcher.first_rejected:
            result.rejected_s = watcher.first_rejected[uid] - created
        result.nrt_writes = [(t - created, kind) for t, kind in watcher.nrt_writes if t >= created]
        result.attempts, result.rejection_message = await asyncio.to_thread(failed_scheduling, core, names[1])
    finally:
        for name in names:
            await asyncio.to_thread(core.delete_namespaced_pod, name, NAMESPACE, grace_period_seconds=0)
        await asyncio.to_thread(scheduler.stop)
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
    met = summary["all_rejected_first"] and summary["echo_max_s"] <= TARGET_SECONDS
    detail = (
        f"max {summary['echo_max_s']:.2f} s, p50 {summary['echo_p50_s']:.2f} s; "
        f"B rejected first in every round: {'yes' if summary['all_rejected_first'] else 'NO'}"
    )
    return [
        {"what": f"rejected pod bound <= {TARGET_SECONDS:g} s, every round", "met": met, "detail": detail}
    ]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    binary: Path = args.scheduler
    result: dict[str, Any] = {"machine": machine(), "scheduler": str(binary), "rounds": []}
    async with bench_cluster("rmd-bench-requeue-", [NODE], keep=args.keep) as cluster:
        with cluster.api_client() as api:
            await asyncio.to_thread(ensure_namespace, api, NAMESPACE)
            watcher = await asyncio.to_thread(Watcher(api).start)
            try:
                rounds: list[Round] = []
                for number in range(1, args.rounds + 1):
                    progress(args.json, f"round {number} of {args.rounds}, echo on")
                    rounds.append(
                        await one_round(cluster, binary, watcher, number, echo=True, limit=ROUND_TIMEOUT)
                    )
                baseline = None
                if args.baseline_timeout > 0:
                    progress(args.json, f"baseline: echo off, up to {args.baseline_timeout:g} s")
                    await set_echo(cluster, 0)
                    baseline = await one_round(
                        cluster, binary, watcher, 0, echo=False, limit=args.baseline_timeout
                    )
            finally:
                await asyncio.to_thread(watcher.stop)
    result["rounds"] = [asdict(r) for r in rounds]
    result["baseline"] = asdict(baseline) if baseline is not None else None
    result["summary"] = summarise(rounds, baseline, args.baseline_timeout)
    result["targets"] = targets(result["summary"])
    return result


def _writes(writes: list[list[Any]] | list[tuple[float, str]]) -> str:
    return ", ".join(f"{t:.2f} {kind}" for t, kind in writes) or "none"


def report(result: Mapping[str, Any]) -> None:
    spec = NodeSpec.default()
    print(machine_line(result["machine"]))
    print(
        f"scheduler-plugins kube-scheduler {result['scheduler']}; simulated node {spec.cpus} CPUs in "
        f"{spec.numa_nodes} NUMA zones; pod A {A_CPUS} CPUs, then pod B {B_CPUS} CPUs"
    )
    print(f"{'round':<10}{'echo':<6}{'B rejected':>12}{'attempts':>10}{'B bound':>10}  B ran  NRT writes (s)")
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
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
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
