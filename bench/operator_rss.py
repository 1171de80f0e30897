"""Benchmark: the operator's memory with 5,000 unrelated pods in the cluster.

The cluster is rmd_sim.cluster.SimCluster (real control plane, simulated nodes with real agents, the real
`rmd-operator run --standalone`, whose pod watch sees every pod bound to a node, in pages, and keeps only
those asking for cache ways). The unrelated pods ask for no cache ways; they are bound to a node name that has
no kubelet and no Node object (`bench-ghost-node`), so nothing runs them and the scheduler leaves them alone,
but the operator's pod watch receives and parses every one of them. Memory is the operator process's
resident set (VmRSS from /proc; VmHWM for the peak).

    idle       the operator after start, no pods at all -- the baseline
    watched    the 5,000 created while it runs (8 clients); read once it has seen them all, then for a few
               seconds more
    restarted  the operator restarted with the 5,000 present: its first list of pods holds all of them (in
               pages of list_page_size)
    deleted    the 5,000 deleted (the restarted operator sees 5,000 deletions)

"Has seen them all": after the unrelated pods, a pod asking for cache ways is created on a real node; once
the operator has created that pod's RmdWorkload, its pod watch (one stream, in order) has delivered every
earlier pod, and it handled them.

    python bench/operator_rss.py [--pods 5000] [--json]

Target (issue): operator RSS <= 200 MiB with 5,000 unrelated pods. Exit status 0 either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException
from operator_bench_common import (
    GROUP,
    VERSION,
    WORKLOADS,
    Obj,
    bench_cluster,
    cpu_seconds,
    ensure_namespace,
    machine,
    machine_line,
    peak_rss_mib,
    progress,
    rss_mib,
    run_and_report,
    target_line,
)

from rmd_sim.cluster import SimCluster

TARGET_MIB = 200.0
NAMESPACE = "bench-unrelated"
GHOST_NODE = "bench-ghost-node"
LABEL = {"rmd-bench": "unrelated"}
SELECTOR = "rmd-bench=unrelated"
CLIENTS = 8
SAMPLE_SECONDS = 10.0
SAMPLE_EVERY = 0.5
WAIT_LIMIT = 300.0


def unrelated_pod(i: int) -> Obj:
    """An ordinary Burstable web pod: labels, an env var, a port, requests and limits, no cache ways."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"unrelated-{i:05d}",
            "labels": {**LABEL, "app": f"web-{i % 50}", "tier": "frontend"},
            "annotations": {"example.com/owner": f"team-{i % 7}"},
        },
        "spec": {
            "nodeName": GHOST_NODE,
            "containers": [
                {
                    "name": "web",
                    "image": "registry.k8s.io/pause:3.10",
                    "env": [{"name": "INSTANCE", "value": str(i)}],
                    "ports": [{"containerPort": 8080, "name": "http"}],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "64Mi"},
                        "limits": {"cpu": "500m", "memory": "128Mi"},
                    },
                }
            ],
        },
    }


def sentinel_pod(name: str) -> Obj:
    resources = {"cpu": "1", "memory": "32Mi", "intel.com/l3_cache_ways": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def create_unrelated(api: Any, count: int) -> None:
    core: Any = kubernetes.client.CoreV1Api(api)
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(lambda i: core.create_namespaced_pod(NAMESPACE, unrelated_pod(i)), range(count)))


def list_unrelated(api: Any) -> bytes:
    """The unrelated pods as the API serves them (JSON): what the operator's first list has to read."""
    core: Any = kubernetes.client.CoreV1Api(api)
    data: bytes = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR, _preload_content=False).data
    return data


def delete_unrelated(api: Any) -> None:
    core = kubernetes.client.CoreV1Api(api)
    core.delete_collection_namespaced_pod(NAMESPACE, label_selector=SELECTOR, grace_period_seconds=0)
    deadline = time.monotonic() + WAIT_LIMIT
    while json.loads(list_unrelated(api)).get("items") and time.monotonic() < deadline:
        time.sleep(0.5)


async def handled_sentinel(api: Any, name: str) -> float:
    """Create a cache-ways pod; return how long until the operator created its RmdWorkload."""
    core: Any = kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    started = time.monotonic()
    await asyncio.to_thread(core.create_namespaced_pod, NAMESPACE, sentinel_pod(name))
    deadline = started + WAIT_LIMIT
    while True:
        try:
            workload = f"{name}-rmd-workload-app"
            await asyncio.to_thread(
                custom.get_namespaced_custom_object, GROUP, VERSION, NAMESPACE, WORKLOADS, workload
            )
            return time.monotonic() - started
        except ApiException as exc:
            if exc.status != 404:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"the operator created no RmdWorkload for pod {name} in {WAIT_LIMIT:.0f} s")
        await asyncio.sleep(0.2)


async def delete_sentinel(api: Any, name: str) -> None:
    core = kubernetes.client.CoreV1Api(api)
    await asyncio.to_thread(core.delete_namespaced_pod, name, NAMESPACE, grace_period_seconds=0)


async def sample(pid: int, seconds: float = SAMPLE_SECONDS) -> dict[str, float]:
    """RSS every SAMPLE_EVERY for `seconds`: median, last, and the process's peak so far."""
    values = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        values.append(rss_mib(pid))
        await asyncio.sleep(SAMPLE_EVERY)
    values.append(rss_mib(pid))
    return {"median_mib": statistics.median(values), "last_mib": values[-1], "peak_mib": peak_rss_mib(pid)}


def operator_pid(cluster: SimCluster) -> int:
    assert cluster.operator is not None
    return cluster.operator.pid


async def run(args: argparse.Namespace) -> dict[str, Any]:
    nodes = [f"bench-node-{i}" for i in range(1, args.nodes + 1)]
    result: dict[str, Any] = {"machine": machine(), "pods": args.pods, "nodes": args.nodes}
    progress(args.json, f"starting the control plane, {len(nodes)} simulated nodes and the operator")
    async with bench_cluster("rmd-bench-rss-", nodes, keep=args.keep) as cluster:
        api = cluster.api_client()
        try:
            await asyncio.to_thread(ensure_namespace, api, NAMESPACE)
            pid = operator_pid(cluster)
            await asyncio.sleep(5)  # let the start-up work (indexes, orphan sweeps) finish
            result["idle"] = await sample(pid)

            progress(args.json, f"creating {args.pods} unrelated pods")
            cpu_before, started = cpu_seconds(pid), time.monotonic()
            await asyncio.to_thread(create_unrelated, api, args.pods)
            result["create_seconds"] = time.monotonic() - started
            result["sentinel_seconds"] = await handled_sentinel(api, "sentinel-1")
            result["seen_all_seconds"] = time.monotonic() - started
            result["watch_cpu_seconds"] = cpu_seconds(pid) - cpu_before
            result["watched"] = await sample(pid)
            await delete_sentinel(api, "sentinel-1")
            result["pods_json_mib"] = len(await asyncio.to_thread(list_unrelated, api)) / 2**20

            progress(args.json, "restarting the operator with the pods present")
            await cluster.stop_operator()
            await cluster.start_operator()
            pid = operator_pid(cluster)
            started = time.monotonic()
            result["restart_sentinel_seconds"] = await handled_sentinel(api, "sentinel-2")
            result["restarted"] = await sample(pid)
            await delete_sentinel(api, "sentinel-2")

            progress(args.json, f"deleting the {args.pods} unrelated pods")
            await asyncio.to_thread(delete_unrelated, api)
            result["deleted_sentinel_seconds"] = await handled_sentinel(api, "sentinel-3")
            result["deleted"] = await sample(pid)
            result["operator_alive"] = cluster.operator is not None and cluster.operator.poll() is None
        finally:
            api.close()
    worst = max(result["watched"]["peak_mib"], result["restarted"]["peak_mib"], result["deleted"]["peak_mib"])
    result["worst_mib"] = worst
    result["ratio"] = worst / result["idle"]["median_mib"]
    result["target_mib"] = TARGET_MIB
    result["met"] = worst <= TARGET_MIB
    return result


def report(r: Mapping[str, Any]) -> None:
    print(machine_line(r["machine"]))
    print(
        f"{r['pods']} unrelated pods ({r['pods_json_mib']:.1f} MiB as JSON) bound to a node without a "
        f"kubelet; {r['nodes']} simulated nodes"
    )
    idle = r["idle"]["median_mib"]
    print(f"{'operator RSS':<12}{'median MiB':>12}{'last MiB':>10}{'peak MiB':>10}{'vs idle':>9}")
    for key in ("idle", "watched", "restarted", "deleted"):
        f = r[key]
        print(
            f"{key:<12}{f['median_mib']:>12.1f}{f['last_mib']:>10.1f}{f['peak_mib']:>10.1f}"
            f"{f['median_mib'] / idle:>9.2f}"
        )
    print(
        f"creating the pods took {r['create_seconds']:.1f} s; the operator had seen them all "
        f"{r['seen_all_seconds']:.1f} s after the first (cache pod handled {r['sentinel_seconds']:.2f} s "
        f"after it was created), using {r['watch_cpu_seconds']:.1f} CPU s "
        f"({r['watch_cpu_seconds'] / r['pods'] * 1000:.2f} ms per pod)"
    )
    print(
        f"after the restart a cache pod was handled in {r['restart_sentinel_seconds']:.2f} s; after the "
        f"delete in {r['deleted_sentinel_seconds']:.2f} s; operator still running: {r['operator_alive']}"
    )
    print(
        target_line(
            f"operator RSS <= {TARGET_MIB:.0f} MiB with {r['pods']} unrelated pods",
            r["met"],
            f"peak {r['worst_mib']:.1f} MiB, x{r['ratio']:.2f} idle",
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=2, help="simulated nodes (one runs the cache pods)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) under /dev/shm")
    args = parser.parse_args()
    run_and_report(run, args, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
