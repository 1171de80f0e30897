"""Benchmark: 500 RmdWorkloads over 20 simulated nodes, from creation until every one is Successful.

The cluster is rmd_sim.cluster.SimCluster: the real control plane (etcd, kube-apiserver, controller manager,
scheduler), N simulated nodes (host tree, FUSE resctrl served from its own process, simulated kubelet
joined to the API server, a real `rmd-agent serve` with mTLS) and the real `rmd-operator run --standalone`.

An RmdWorkload's CPUs cannot overlap another's on a node, so the 500 are spread over the nodes: 25 per node
with their own 2 CPUs each, a mix that fits a node's 16 CLOSIDs and its cache pools (default spec: 64 CPUs,
11-way L3 on 2 sockets): per node 4 guaranteed (1 way), 4 best effort (max 2, min 1), 9 shared pool and 8
P-state only (no cache request); 8 + 1 shared group + the root = 10 CLOSIDs.

    idle       10 s of the started cluster doing nothing: what 20 simulated nodes cost just by running
    direct     the same 500 ApplyWorkload calls made straight to the agents over mTLS, without the operator,
               at most 8 in flight per agent as the operator does (then removed again) -- the baseline
    API only   the same 500 RmdWorkloads created in a namespace the operator does not handle (it runs with
               `namespaces: [bench-scale]`): what the API server alone takes for the creates
    operator   the 500 RmdWorkloads created through the API (8 clients in parallel, nodes interleaved);
               done when every one's status says Successful for the current generation (seen on a watch)
    delete     the 500 deleted; done when the API has none left (the operator's finalizer held each until
               its agent confirmed the removal); compared with the direct RemoveWorkload calls

CPU time of every component (operator, agents, resctrl servers, API server, etcd, ...) and of the machine as
a whole is recorded per phase: on a small machine all 20 simulated nodes share its CPUs with the control
plane and the operator, which a real cluster does not.

    python bench/operator_scale.py [--workloads 500] [--nodes 20] [--json] [--in-process-resctrl]

Target (issue): 500 x 20 within 60 s. Exit status 0 either way: the benchmark reports, it does not gate.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import kubernetes
from operator_bench_common import (
    GROUP,
    VERSION,
    WORKLOADS,
    Obj,
    WatchThread,
    api_requests,
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
    rss_mib,
    run_and_report,
    target_line,
    wait_event,
    writes_line,
)

from rmd_api.agent.v1 import agent_pb2, agent_pb2_grpc
from rmd_operator.spec import workload_spec
from rmd_sim.cluster import SimCluster
from rmd_sim.node import SimNode

TARGET_SECONDS = 60.0
NAMESPACE = "bench-scale"
DIRECT_NAMESPACE = "bench-direct"
UNHANDLED_NAMESPACE = "bench-unhandled"  # the operator is told to handle NAMESPACE only
AGENT_MAX_CALLS = 8  # the operator's default agent_max_calls
CREATE_CLIENTS = 8
FIRST_CPU = 2  # CPU 0 is the kubelet's reservedSystemCPUs in the default spec; 1 left alone too
CPUS_EACH = 2
WAIT_LIMIT = 600.0
IDLE_SECONDS = 10.0
_stub: Any = agent_pb2_grpc.AgentStub  # generated without annotations


@dataclass(frozen=True)
class Planned:
    name: str
    node: str
    spec: Obj  # the RmdWorkload's spec (v0.3 layout)


def workload_mix(index: int, cpus: list[int]) -> Obj:
    """The spec of a node's `index`-th workload: 4 guaranteed, 4 best effort, then shared and P-state only."""
    spec: Obj = {"coreIds": [",".join(map(str, cpus))]}
    if index < 4:
        spec["rdt"] = {"cache": {"max": 1, "min": 1}}
    elif index < 8:
        spec["rdt"] = {"cache": {"max": 2, "min": 1}}
    elif index % 2 == 0:
        spec["rdt"] = {"cache": {"max": 0, "min": 0}}
    else:
        spec["plugins"] = {"pstate": {"ratio": "1.5", "monitoring": "off"}}
    return spec


def plan(nodes: list[str], total: int) -> list[Planned]:
    """`total` workloads dealt round-robin over the nodes (so creation order interleaves them)."""
    out = []
    for i in range(total):
        node, index = nodes[i % len(nodes)], i // len(nodes)
        first = FIRST_CPU + index * CPUS_EACH
        spec = workload_mix(index, list(range(first, first + CPUS_EACH)))
        out.append(Planned(f"w-{node}-{index:03d}", node, {**spec, "nodes": [node]}))
    return out


# -- baseline: straight to the agents ----------------------------------------------------------------------


async def direct(cluster: SimCluster, planned: list[Planned]) -> dict[str, Any]:
    """Apply every workload straight to its agent (as the operator would, minus the operator), then remove."""
    by_node: dict[str, list[Planned]] = {}
    for p in planned:
        by_node.setdefault(p.node, []).append(p)
    latencies: list[float] = []
    failures: list[str] = []

    async def one_node(node: SimNode, items: list[Planned], remove: bool) -> None:
        limit = asyncio.Semaphore(AGENT_MAX_CALLS)
        async with node.channel() as channel:
            stub = _stub(channel)

            async def call(p: Planned) -> None:
                ref = agent_pb2.WorkloadRef(
                    namespace=DIRECT_NAMESPACE, name=p.name
                )  # no uid: not an object's
                async with limit:
                    started = time.monotonic()
                    try:
                        if remove:
                            await stub.RemoveWorkload(agent_pb2.RemoveWorkloadRequest(ref=ref), timeout=30)
                        else:
                            request = agent_pb2.ApplyWorkloadRequest(ref=ref, spec=workload_spec(p.spec))
                            await stub.ApplyWorkload(request, timeout=30)
                            latencies.append(time.monotonic() - started)
                    except grpc.aio.AioRpcError as exc:
                        failures.append(f"{p.name}: {exc.code().name}: {exc.details()}")

            await asyncio.gather(*(call(p) for p in items))

    pids = cluster_pids(cluster)
    cpu_before, started = cpu_snapshot(pids), time.monotonic()
    await asyncio.gather(*(one_node(cluster.nodes[n], items, False) for n, items in by_node.items()))
    applied = time.monotonic() - started
    cpu = cpu_used(cpu_before, cpu_snapshot(pids))
    started = time.monotonic()
    await asyncio.gather(*(one_node(cluster.nodes[n], items, True) for n, items in by_node.items()))
    removed = time.monotonic() - started
    return {
        "seconds": applied,
        "remove_seconds": removed,
        "per_call_p50_ms": percentile(latencies, 50) * 1000,
        "per_call_p99_ms": percentile(latencies, 99) * 1000,
        "failures": failures,
        "cpu_seconds": cpu,
    }


# -- through the operator ------------------------------------------------------------------------------------


class Tracker:
    """When each RmdWorkload was created, first seen Successful (current generation), and deleted."""

    def __init__(self, planned: list[Planned]) -> None:
        self.node = {p.name: p.node for p in planned}
        self.created: dict[str, float] = {}
        self.successful: dict[str, float] = {}
        self.deleted: dict[str, float] = {}
        self.last_state: dict[str, str] = {}
        self._lock = threading.Lock()
        self.all_successful = threading.Event()
        self.all_deleted = threading.Event()

    def on_event(self, kind: str, obj: Obj, now: float) -> None:
        name = obj["metadata"]["name"]
        if name not in self.node:
            return
        with self._lock:
            if kind == "DELETED":
                self.deleted.setdefault(name, now)
                if len(self.deleted) == len(self.node):
                    self.all_deleted.set()
                return
            status = obj.get("status") or {}
            entry = (status.get("workloadStates") or {}).get(self.node[name]) or {}
            self.last_state[name] = f"{entry.get('status', 'none')}: {entry.get('response', '')}"
            current = status.get("observedGeneration") == obj["metadata"].get("generation")
            if current and entry.get("status") == "Successful" and name not in self.successful:
                self.successful[name] = now
                if len(self.successful) == len(self.node):
                    self.all_successful.set()


def create_all(api: Any, planned: list[Planned], namespace: str, created: dict[str, float]) -> None:
    """Create the RmdWorkloads, CREATE_CLIENTS at a time; `created` gets when each create call returned."""
    custom = kubernetes.client.CustomObjectsApi(api)

    def create(p: Planned) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "RmdWorkload",
            "metadata": {"name": p.name, "namespace": namespace},
            "spec": p.spec,
        }
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, WORKLOADS, body)
        created[p.name] = time.monotonic()

    with ThreadPoolExecutor(CREATE_CLIENTS) as pool:
        list(pool.map(create, planned))


def delete_all(api: Any, planned: list[Planned], namespace: str) -> None:
    custom = kubernetes.client.CustomObjectsApi(api)

    def delete(p: Planned) -> None:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, WORKLOADS, p.name)

    with ThreadPoolExecutor(CREATE_CLIENTS) as pool:
        list(pool.map(delete, planned))


async def api_only(cluster: SimCluster, planned: list[Planned]) -> dict[str, Any]:
    """The same creates in a namespace the operator does not handle: the API's share alone."""
    api = cluster.api_client()
    try:
        await asyncio.to_thread(ensure_namespace, api, UNHANDLED_NAMESPACE)
        pids = cluster_pids(cluster)
        cpu_before, started = cpu_snapshot(pids), time.monotonic()
        await asyncio.to_thread(create_all, api, planned, UNHANDLED_NAMESPACE, {})
        seconds = time.monotonic() - started
        cpu = cpu_used(cpu_before, cpu_snapshot(pids))
        await asyncio.to_thread(delete_all, api, planned, UNHANDLED_NAMESPACE)  # no finalizers: gone at once
        return {"seconds": seconds, "cpu_seconds": cpu}
    finally:
        api.close()


async def idle(cluster: SimCluster) -> dict[str, Any]:
    """CPU the cluster uses doing nothing (agents' periodic work: metrics, device plugin, node state)."""
    await asyncio.sleep(5)  # start-up work settles
    pids = cluster_pids(cluster)
    before = cpu_snapshot(pids)
    await asyncio.sleep(IDLE_SECONDS)
    return {"seconds": IDLE_SECONDS, "cpu_seconds": cpu_used(before, cpu_snapshot(pids))}


async def held_by_agents(cluster: SimCluster, namespace: str) -> dict[str, int]:
    async def count(node: SimNode) -> int:
        async with node.channel() as channel:
            listed = await _stub(channel).ListWorkloads(agent_pb2.ListWorkloadsRequest(), timeout=30)
        return sum(1 for w in listed.workloads if w.ref.namespace == namespace)

    names = list(cluster.nodes)
    counts = await asyncio.gather(*(count(cluster.nodes[n]) for n in names))
    return dict(zip(names, counts, strict=True))


async def through_operator(cluster: SimCluster, planned: list[Planned], quiet: bool) -> dict[str, Any]:
    assert cluster.operator is not None
    pid = cluster.operator.pid
    tracker = Tracker(planned)
    api = cluster.api_client()
    await asyncio.to_thread(ensure_namespace, api, NAMESPACE)
    custom = kubernetes.client.CustomObjectsApi(api)
    watcher = WatchThread(
        custom.list_namespaced_custom_object,
        tracker.on_event,
        group=GROUP,
        version=VERSION,
        namespace=NAMESPACE,
        plural=WORKLOADS,
    ).start()
    try:
        rss_idle = rss_mib(pid)
        pids = cluster_pids(cluster)
        cpu_before = cpu_snapshot(pids)
        requests_before = await asyncio.to_thread(api_requests, api)
        progress(quiet, f"creating {len(planned)} RmdWorkloads")
        started = time.monotonic()
        await asyncio.to_thread(create_all, api, planned, NAMESPACE, tracker.created)
        created = time.monotonic() - started
        done = await wait_event(tracker.all_successful, WAIT_LIMIT)
        finished = max(tracker.successful.values(), default=started)
        cpu = cpu_used(cpu_before, cpu_snapshot(pids))
        await asyncio.sleep(2)  # let status writes and Events settle before reading memory
        requests_after = await asyncio.to_thread(api_requests, api)
        rss_loaded = rss_mib(pid)
        held = await held_by_agents(cluster, NAMESPACE)
        violations = {n: node.check_resctrl() for n, node in cluster.nodes.items()}
        progress(quiet, f"deleting {len(planned)} RmdWorkloads")
        delete_started = time.monotonic()
        await asyncio.to_thread(delete_all, api, planned, NAMESPACE)
        deleted_all = await wait_event(tracker.all_deleted, WAIT_LIMIT)
        delete_seconds = max(tracker.deleted.values(), default=delete_started) - delete_started
        held_after = await held_by_agents(cluster, NAMESPACE)
    finally:
        await asyncio.to_thread(watcher.stop)
        api.close()
    latency = [tracker.successful[n] - tracker.created[n] for n in tracker.successful if n in tracker.created]
    stuck = sorted(set(tracker.node) - set(tracker.successful))
    return {
        "complete": done,
        "seconds": finished - started,
        "create_seconds": created,
        "after_last_create_seconds": finished - max(tracker.created.values(), default=started),
        "successful": len(tracker.successful),
        "not_successful": {n: tracker.last_state.get(n, "never seen") for n in stuck[:10]},
        "created_to_successful_p50_ms": percentile(latency, 50) * 1000,
        "created_to_successful_p99_ms": percentile(latency, 99) * 1000,
        "cpu_seconds": cpu,
        "api_writes": writes_line(requests_before, requests_after, len(planned), "workload"),
        "operator_rss_idle_mib": rss_idle,
        "operator_rss_loaded_mib": rss_loaded,
        "held_by_agents": sum(held.values()),
        "held_per_node": sorted(set(held.values())),
        "resctrl_violations": sum(len(v) for v in violations.values()),
        "delete_complete": deleted_all,
        "delete_seconds": delete_seconds,
        "held_after_delete": sum(held_after.values()),
    }


# -- report -------------------------------------------------------------------------------------------------


def report(r: Mapping[str, Any]) -> None:
    d, a, o, n = r["direct"], r["api_only"], r["operator"], r["workloads"]
    where = "one process per node" if r["resctrl_process"] else "the benchmark process"
    print(machine_line(r["machine"]))
    print(
        f"{n} RmdWorkloads over {r['nodes']} simulated nodes ({n // r['nodes']} per node), resctrl served by "
        f"{where}; cluster up in {r['startup_seconds']:.1f} s"
    )
    print(f"{'figure':<10}{'seconds':>9}{'per workload ms':>17}{'p50 ms':>10}{'p99 ms':>10}{'vs direct':>11}")

    def row(label: str, seconds: float, p50: str, p99: str, base: float) -> None:
        per = seconds / n * 1000
        print(f"{label:<10}{seconds:>9.2f}{per:>17.1f}{p50:>10}{p99:>10}{seconds / base:>11.2f}")

    row("direct", d["seconds"], f"{d['per_call_p50_ms']:.0f}", f"{d['per_call_p99_ms']:.0f}", d["seconds"])
    row("API only", a["seconds"], "", "", d["seconds"])
    p50, p99 = o["created_to_successful_p50_ms"], o["created_to_successful_p99_ms"]
    row("operator", o["seconds"], f"{p50:.0f}", f"{p99:.0f}", d["seconds"])
    row("delete", o["delete_seconds"], "", "", d["remove_seconds"])
    print(
        "(p50/p99: direct per ApplyWorkload call, queueing at the agent included; operator from each create "
        "to its Successful status; delete compared with the direct RemoveWorkload calls)"
    )
    print(
        f"operator: creating took {o['create_seconds']:.2f} s, the last Successful came "
        f"{o['after_last_create_seconds']:.2f} s after the last create; {o['successful']}/{n} Successful; "
        f"operator RSS {o['operator_rss_idle_mib']:.1f} MiB idle, "
        f"{o['operator_rss_loaded_mib']:.1f} MiB with {n}"
    )
    for label, phase in (("idle", r["idle"]), ("direct", d), ("API only", a), ("operator", o)):
        print(f"{label} {cpu_line(phase['cpu_seconds'], phase['seconds'])}")
    print(f"operator phase: {o['api_writes']}")
    print(
        f"agents held {o['held_by_agents']} (per node {o['held_per_node']}), "
        f"{o['held_after_delete']} after the delete; resctrl rule violations: {o['resctrl_violations']}"
    )
    for failure in d["failures"][:5]:
        print(f"direct failure: {failure}")
    for name, state in o["not_successful"].items():
        print(f"not Successful: {name}: {state}")
    what = f"{n} x {r['nodes']} Successful within {TARGET_SECONDS:.0f} s"
    print(target_line(what, r["met"], f"{o['seconds']:.1f} s"))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    nodes = [f"bench-node-{i:02d}" for i in range(1, args.nodes + 1)]
    planned = plan(nodes, args.workloads)
    measured_on = machine()  # before the cluster starts: the load average says what else was running
    progress(args.json, f"starting the control plane, {len(nodes)} simulated nodes and the operator")
    started = time.monotonic()
    async with bench_cluster(
        "rmd-bench-scale-",
        nodes,
        resctrl_process=not args.in_process_resctrl,
        operator_settings={"namespaces": [NAMESPACE]},
        keep=args.keep,
    ) as cluster:
        startup = time.monotonic() - started
        progress(args.json, f"idle: {IDLE_SECONDS:.0f} s of the cluster doing nothing")
        idle_result = await idle(cluster)
        progress(args.json, f"direct: {len(planned)} ApplyWorkload calls to the agents")
        direct_result = await direct(cluster, planned)
        progress(args.json, f"API only: {len(planned)} RmdWorkloads nobody handles")
        api_result = await api_only(cluster, planned)
        progress(args.json, "through the operator")
        operator_result = await through_operator(cluster, planned, args.json)
    seconds = operator_result["seconds"]
    return {
        "machine": measured_on,
        "workloads": args.workloads,
        "nodes": args.nodes,
        "resctrl_process": not args.in_process_resctrl,
        "startup_seconds": startup,
        "idle": idle_result,
        "direct": direct_result,
        "api_only": api_result,
        "operator": operator_result,
        "ratio": seconds / direct_result["seconds"],
        "target_seconds": TARGET_SECONDS,
        "met": bool(operator_result["complete"]) and seconds <= TARGET_SECONDS,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--in-process-resctrl",
        action="store_true",
        help="serve every node's FUSE resctrl from this process (default: one process per node)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) under /dev/shm")
    args = parser.parse_args()
    if args.workloads % args.nodes or FIRST_CPU + (args.workloads // args.nodes) * CPUS_EACH > 64:
        parser.error("workloads must be a multiple of nodes, at most 31 per node (64 CPUs, 2 each)")
    run_and_report(run, args, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
