"""Benchmark: a pod asking for cache ways, from its creation until the cache is applied on its node.

The cluster is rmd_sim.cluster.SimCluster (real control plane with the real scheduler, simulated nodes whose
kubelets run the pods and whose agents serve the intel.com/l3_cache_ways device plugin, the real operator).
Each round creates two Guaranteed pods (2 whole CPUs, 32 MiB), one at a time, in this order:

    empty      no cache request: created -> Running, seen on a watch (the scheduler binds it, the node's
               kubelet admits it with exclusive CPUs and reports it) -- the baseline
    cache      intel.com/l3_cache_ways 1 or 2 (alternately): created -> Running, and created -> applied

"Applied" is read on the node itself: the resctrl group of the pod flow's RmdWorkload
(`<pod>-rmd-workload-<container>`) exists in the node's resctrl and its cpus_list holds exactly the CPUs the
node's kubelet gave the container (polled every 5 ms in the FUSE server's backing tree, which is what the
kernel would show). Between the pods, each is deleted and the next waits until it is gone (for a cache pod:
its group too, so every pod finds the same free cache); `deleted -> removed` is that wait.

    python bench/operator_pod_latency.py [--pods 100] [--nodes 3] [--json]

Target (issue): pod -> applied p99 <= 1 s. Exit status 0 either way: the benchmark reports, it does not gate.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes
from operator_bench_common import (
    Obj,
    WatchThread,
    bench_cluster,
    cluster_pids,
    cpu_line,
    cpu_snapshot,
    cpu_used,
    ensure_namespace,
    machine,
    machine_line,
    percentile,
    progress,
    run_and_report,
    target_line,
)

from rmd_agent.plan.resctrl_layout import group_name
from rmd_api.cpuset import parse_cpu_list
from rmd_api.names import CACHE_WAYS_RESOURCE as CACHE_WAYS
from rmd_sim.cluster import SimCluster

TARGET_P99_S = 1.0
NAMESPACE = "bench-pods"
CONTAINER = "app"
POLL_S = 0.005
WAIT_LIMIT = 120.0


def pod_body(name: str, ways: int) -> Obj:
    resources: Obj = {"cpu": "2", "memory": "32Mi"}
    if ways:
        resources[CACHE_WAYS] = str(ways)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "rmd-bench"}},
        "spec": {
            "containers": [
                {
                    "name": CONTAINER,
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


class PodTracker:
    """What the pod watch saw: the node each pod was bound to, when it was Running, when it was gone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.node: dict[str, str] = {}
        self.running: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self.gone: dict[str, float] = {}

    def on_event(self, kind: str, obj: Obj, now: float) -> None:
        name = obj["metadata"]["name"]
        status = obj.get("status") or {}
        with self._lock:
            if kind == "DELETED":
                self.gone.setdefault(name, now)
                return
            if obj.get("spec", {}).get("nodeName"):
                self.node[name] = obj["spec"]["nodeName"]
            if status.get("phase") == "Running":
                self.running.setdefault(name, now)
            elif status.get("phase") == "Failed":
                self.failed[name] = f"{status.get('reason', '')}: {status.get('message', '')}"


async def until(check: Any, what: str, limit: float = WAIT_LIMIT) -> float:
    """Poll `check()` every POLL_S until it is true; the time it became so (monotonic)."""
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {limit:.0f} s")
        await asyncio.sleep(POLL_S)
    return time.monotonic()


def group_cpus(backing_root: Path, group: str) -> frozenset[int] | None:
    """The CPUs of a resctrl group as the node's resctrl holds them; None while the group does not exist."""
    try:
        text = (backing_root / "sys/fs/resctrl" / group / "cpus_list").read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return frozenset(parse_cpu_list(text.strip()))


def group_ways(backing_root: Path, group: str) -> int:
    """A group's widest L3 allocation in ways: its workload's domain (other domains get the OS ways)."""
    schemata = (backing_root / "sys/fs/resctrl" / group / "schemata").read_text()
    for line in schemata.splitlines():
        name, _, domains = line.strip().partition(":")
        if name.strip().startswith("L3"):
            return max(int(d.split("=")[1], 16).bit_count() for d in domains.split(";"))
    return 0


class Rounds:
    def __init__(self, cluster: SimCluster, core: Any, tracker: PodTracker) -> None:
        self.cluster = cluster
        self.core = core
        self.tracker = tracker
        self.empty_running: list[float] = []
        self.cache_running: list[float] = []
        self.cache_applied: list[float] = []
        self.running_to_applied: list[float] = []
        self.removed: list[float] = []
        self.problems: list[str] = []

    async def _create(self, name: str, ways: int) -> float:
        started = time.monotonic()
        await asyncio.to_thread(self.core.create_namespaced_pod, NAMESPACE, pod_body(name, ways))
        return started

    async def _delete(self, name: str) -> float:
        started = time.monotonic()
        await asyncio.to_thread(self.core.delete_namespaced_pod, name, NAMESPACE, grace_period_seconds=0)
        await until(lambda: name in self.tracker.gone, f"pod {name} deleted")
        return started

    def _not_failed(self, name: str) -> None:
        if name in self.tracker.failed:
            raise RuntimeError(f"pod {name} failed: {self.tracker.failed[name]}")

    async def _running(self, name: str) -> float:
        def check() -> bool:
            self._not_failed(name)
            return name in self.tracker.running

        await until(check, f"pod {name} Running")
        return self.tracker.running[name]

    async def empty(self, i: int) -> None:
        name = f"empty-{i:03d}"
        created = await self._create(name, 0)
        try:
            self.empty_running.append(await self._running(name) - created)
        except (RuntimeError, TimeoutError) as exc:
            self.problems.append(str(exc))
        await self._delete(name)

    async def cache(self, i: int) -> None:
        name = f"cache-{i:03d}"
        group = group_name(NAMESPACE, f"{name}-rmd-workload-{CONTAINER}")
        ways = 1 + i % 2
        created = await self._create(name, ways)
        state: dict[str, Any] = {}

        def applied() -> bool:
            self._not_failed(name)
            node_name = self.tracker.node.get(name)
            if node_name is None:
                return False
            node = self.cluster.nodes[node_name]
            if node.kubelet is None:
                return False
            pod = node.kubelet.find_pod(NAMESPACE, name)
            cpus = pod.cpus.get(CONTAINER) if pod is not None else None
            if not cpus:
                return False
            state["root"], state["cpus"] = node.mount.backing_root, cpus
            return group_cpus(node.mount.backing_root, group) == cpus

        try:
            applied_at = await until(applied, f"cache of pod {name} applied")
            running = await self._running(name)
        except (RuntimeError, TimeoutError) as exc:
            self.problems.append(f"{exc} (node {self.tracker.node.get(name)}, group {group})")
            await self._delete(name)
            if "root" in state:
                await until(lambda: group_cpus(state["root"], group) is None, f"group of {name} removed")
            return
        if (found := group_ways(state["root"], group)) != ways:
            self.problems.append(f"{name}: group {group} has {found} ways, not the {ways} the pod asked for")
        self.cache_applied.append(applied_at - created)
        self.cache_running.append(running - created)
        self.running_to_applied.append(applied_at - running)
        deleted = await self._delete(name)
        gone = await until(lambda: group_cpus(state["root"], group) is None, f"group of {name} removed")
        self.removed.append(gone - deleted)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "count": len(values),
        "p50_ms": percentile(values, 50) * 1000,
        "p99_ms": percentile(values, 99) * 1000,
        "max_ms": max(values, default=float("nan")) * 1000,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    nodes = [f"bench-node-{i}" for i in range(1, args.nodes + 1)]
    measured_on = machine()  # before the cluster starts: the load average says what else was running
    progress(args.json, f"starting the control plane, {len(nodes)} simulated nodes and the operator")
    async with bench_cluster("rmd-bench-pods-", nodes, keep=args.keep) as cluster:
        api = cluster.api_client()
        await asyncio.to_thread(ensure_namespace, api, NAMESPACE)
        core = kubernetes.client.CoreV1Api(api)
        tracker = PodTracker()
        watcher = WatchThread(core.list_namespaced_pod, tracker.on_event, namespace=NAMESPACE).start()
        rounds = Rounds(cluster, core, tracker)
        try:
            progress(args.json, "warm-up round")
            await rounds.empty(999)
            await rounds.cache(999)
            rounds.empty_running.clear()
            rounds.cache_running.clear()
            rounds.cache_applied.clear()
            rounds.running_to_applied.clear()
            rounds.removed.clear()
            pids = cluster_pids(cluster)
            cpu_before, started = cpu_snapshot(pids), time.monotonic()
            for i in range(args.pods):
                if i % 10 == 0:
                    progress(args.json, f"round {i + 1}/{args.pods}")
                await rounds.empty(i)
                await rounds.cache(i)
            wall = time.monotonic() - started
            cpu = cpu_used(cpu_before, cpu_snapshot(pids))
        finally:
            await asyncio.to_thread(watcher.stop)
            api.close()
    applied = summary(rounds.cache_applied)
    empty = summary(rounds.empty_running)
    return {
        "machine": measured_on,
        "nodes": args.nodes,
        "pods": args.pods,
        "empty_created_to_running": empty,
        "cache_created_to_running": summary(rounds.cache_running),
        "cache_created_to_applied": applied,
        "cache_running_to_applied": summary(rounds.running_to_applied),
        "cache_deleted_to_removed": summary(rounds.removed),
        "ratio_p50": applied["p50_ms"] / empty["p50_ms"],
        "ratio_p99": applied["p99_ms"] / empty["p99_ms"],
        "problems": rounds.problems,
        "seconds": wall,
        "cpu_seconds": cpu,
        "target_p99_ms": TARGET_P99_S * 1000,
        "met": not rounds.problems and applied["p99_ms"] <= TARGET_P99_S * 1000,
    }


def report(r: Mapping[str, Any]) -> None:
    print(machine_line(r["machine"]))
    print(f"{r['pods']} rounds (an empty pod, then a cache-ways pod) on {r['nodes']} simulated nodes")
    print(f"{'figure':<26}{'count':>6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'p99/empty':>11}")
    empty_p99 = r["empty_created_to_running"]["p99_ms"]
    for key, label in (
        ("empty_created_to_running", "empty: created->Running"),
        ("cache_created_to_running", "cache: created->Running"),
        ("cache_created_to_applied", "cache: created->applied"),
        ("cache_running_to_applied", "cache: Running->applied"),
        ("cache_deleted_to_removed", "cache: deleted->removed"),
    ):
        f = r[key]
        print(
            f"{label:<26}{f['count']:>6}{f['p50_ms']:>9.1f}{f['p99_ms']:>9.1f}{f['max_ms']:>9.1f}"
            f"{f['p99_ms'] / empty_p99:>11.2f}"
        )
    print(f"created->applied vs empty created->Running: p50 x{r['ratio_p50']:.2f}, p99 x{r['ratio_p99']:.2f}")
    print(cpu_line(r["cpu_seconds"], r["seconds"]))
    for problem in r["problems"][:10]:
        print(f"problem: {problem}")
    applied = r["cache_created_to_applied"]
    print(
        target_line(
            f"pod -> applied p99 <= {TARGET_P99_S * 1000:.0f} ms",
            r["met"],
            f"{applied['p99_ms']:.0f} ms over {applied['count']} pods"
            + (f", {len(r['problems'])} not applied" if r["problems"] else ""),
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100, help="rounds (one empty pod and one cache pod each)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) under /dev/shm")
    args = parser.parse_args()
    run_and_report(run, args, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
