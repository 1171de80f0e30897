"""`python -m rmd_sim demo`: the whole system on one machine, in one command.

A real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), the operator, and three
simulated nodes worker-node-1..3 (each: simulated hardware with RDT, MBA and RAPL, a simulated kubelet joined
to the API server, a real agent over mTLS). It applies the sample manifests (rmd-operator users' samples when
../shared/samples exists, else examples/), lets the nodes burn some simulated CPU, and prints what happened:
each workload per node, one node's NUMA topology as the scheduler sees it, a few power figures, and one node's
telemetry from a NodeConfig with WAO's Fake sources (as the operator's collectors report it). Everything
stops at the end unless --stay is given; SIGTERM, SIGINT or SIGHUP stop it at any point, FUSE mounts
included, with exit status 128 + the signal's number (rmd_sim.stop_signals).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from rmd_api.names import (
    CACHE_WAYS_RESOURCE,
    NODE_CONFIG,
    NODE_RESOURCE_TOPOLOGY,
    RMD_NODE_STATE,
    RMD_WORKLOAD,
)
from rmd_sim.cluster import SYSTEM_NAMESPACE, SimCluster
from rmd_sim.control_plane import repo_root
from rmd_sim.load import SimLoad
from rmd_sim.realnode.node import binaries_or_reason
from rmd_sim.realnode.stack import RealStack
from rmd_sim.stop_signals import SignalStop

NODES = ("worker-node-1", "worker-node-2", "worker-node-3")
POWER_INTERVAL = 1.0  # seconds; the agents sample RAPL this often in the demo
TELEMETRY_NAME = f"{NODES[0]}-fake"
# WAO's Fake types: fixed values, no BMC or model server needed (docs/telemetry-collectors.md).
_FAKE_TERM = {"type": "Fake", "fetchInterval": "1s"}
TELEMETRY_NODE_CONFIG: dict[str, Any] = {
    "apiVersion": NODE_CONFIG.api_version,
    "kind": NODE_CONFIG.kind,
    "metadata": {"name": TELEMETRY_NAME, "namespace": "default"},
    "spec": {
        "nodeName": NODES[0],
        "metricsCollector": {"inletTemp": _FAKE_TERM, "deltaP": _FAKE_TERM},
        "predictor": {"powerConsumption": _FAKE_TERM},
    },
}


@contextlib.contextmanager
def stderr_to(log: Path) -> Iterator[None]:
    """Send file descriptor 2 to `log` (C libraries write there directly, not through sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with log.open("ab") as target:
            os.dup2(target.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def step(message: str, began: float) -> None:
    print(f"[{time.monotonic() - began:5.1f}s] {message}", flush=True)


def samples_dir() -> Path:
    shared = repo_root().parent / "shared" / "samples"
    return shared if shared.is_dir() else repo_root() / "examples"


def apply_samples(cluster: SimCluster, directory: Path) -> list[str]:
    """Apply every manifest; objects with generateName (the pod samples) are created instead."""
    applied = []
    for path in sorted(directory.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        verb = "create" if any(d.get("metadata", {}).get("generateName") for d in docs) else "apply"
        cluster.kubectl(verb, "-n", "default", "-f", str(path))
        applied.append(path.name)
    return applied


async def wait_for(condition: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await asyncio.to_thread(condition):
            return True
        await asyncio.sleep(0.5)
    return False


def workloads(api: Any) -> list[dict[str, Any]]:
    found: Any = client.CustomObjectsApi(api).list_cluster_custom_object(
        RMD_WORKLOAD.group, RMD_WORKLOAD.version, RMD_WORKLOAD.plural
    )
    items: list[dict[str, Any]] = found["items"]
    return items


def all_settled(api: Any) -> bool:
    items = workloads(api)
    states = [
        e.get("status", "") for w in items for e in w.get("status", {}).get("workloadStates", {}).values()
    ]
    return bool(states) and all(s in ("Successful", "Failed") or s.startswith("Failed") for s in states)


def workload_lines(api: Any) -> list[str]:
    lines = []
    for w in sorted(workloads(api), key=lambda o: o["metadata"]["name"]):
        states = w.get("status", {}).get("workloadStates", {})
        summary = w.get("status", {}).get("summary", "")
        lines.append(f"  {w['metadata']['namespace']}/{w['metadata']['name']}  ({summary})")
        for node, entry in sorted(states.items()):
            detail = f"cos {entry.get('cosName', '-')}, cores {entry.get('coreIds', '-')}"
            status = entry.get("status", "")
            if not status.startswith("Successful"):
                detail = entry.get("response", "")[:70]
            lines.append(f"      {node:<14} {status[:10]:<10} {detail}")
    return lines


def topology_lines(api: Any, node: str) -> list[str]:
    nrt: Any = client.CustomObjectsApi(api).get_cluster_custom_object(
        NODE_RESOURCE_TOPOLOGY.group, NODE_RESOURCE_TOPOLOGY.version, NODE_RESOURCE_TOPOLOGY.plural, node
    )
    attributes = {a["name"]: a["value"] for a in nrt.get("attributes", [])}
    lines = [
        f"  {node}: policy {attributes.get('topologyManagerPolicy')}, pods fingerprint "
        f"{attributes.get('nodeTopologyPodsFingerprint', '-')}"
    ]
    for zone in nrt["zones"]:
        res = {r["name"]: r for r in zone.get("resources", [])}
        parts = [
            f"{name} {res[name]['available']}/{res[name]['allocatable']}"
            for name in ("cpu", "memory", CACHE_WAYS_RESOURCE)
            if name in res
        ]
        lines.append(f"    {zone['name']}: " + ", ".join(parts) + "  (available/allocatable)")
    return lines


def create_node_config(api: Any) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        NODE_CONFIG.group, NODE_CONFIG.version, "default", NODE_CONFIG.plural, TELEMETRY_NODE_CONFIG
    )


def telemetry_sources(api: Any) -> dict[str, Any]:
    found: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        NODE_CONFIG.group, NODE_CONFIG.version, "default", NODE_CONFIG.plural, TELEMETRY_NAME
    )
    sources: dict[str, Any] = (found.get("status") or {}).get("sources") or {}
    return sources


def telemetry_complete(sources: dict[str, Any]) -> bool:
    return len(sources) == 3 and all("value" in entry for entry in sources.values())


def telemetry_lines(api: Any) -> list[str]:
    sources = telemetry_sources(api)

    def value(kind: str, unit: str) -> str:
        entry = sources.get(kind) or {}
        return f"{entry['value']} {unit}" if "value" in entry else "-"

    return [
        f"  {NODES[0]}: inlet {value('inletTemp', '°C')}, deltaP {value('deltaP', 'Pa')}, predicted power "
        f"{value('powerConsumption', 'W')} (NodeConfig default/{TELEMETRY_NAME}, Fake types)"
    ]


def pod_lines(api: Any) -> list[str]:
    pods: Any = client.CoreV1Api(api).list_namespaced_pod("default")
    return [
        f"  default/{p.metadata.name} on {p.spec.node_name or '-'}: {p.status.phase}"
        + (f" ({p.status.reason}: {p.status.message})" if p.status.reason else "")
        for p in pods.items
    ] or ["  (none)"]


def scrape(port: int) -> str:
    text: str = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return text


def metric(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    found = []
    for line in text.splitlines():
        match = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if not match:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if all(got.get(k) == v for k, v in labels.items()):
            found.append((got, float(match.group(2))))
    return found


def power_lines(cluster: SimCluster) -> list[str]:
    lines = []
    for name, node in cluster.nodes.items():
        text = scrape(node.http_port)
        host = sum(v for _, v in metric(text, "rmd_node_host_power_watts"))
        pods = sorted(
            ((labels["pod"], v) for labels, v in metric(text, "rmd_pod_power_watts", zone="package")),
            key=lambda p: -p[1],
        )
        top = ", ".join(f"{pod} {watts:.1f} W" for pod, watts in pods[:2]) or "no pods"
        lines.append(f"  {name}: node {host:.1f} W (package + dram); busiest pods (package): {top}")
    return lines


async def run_load(cluster: SimCluster, api: Any, stop: asyncio.Event) -> None:
    """Give each node's running pods simulated CPU use and advance the node's counters in real time."""
    loads = {name: SimLoad(node.root, system_cpus=1.0) for name, node in cluster.nodes.items()}
    core = client.CoreV1Api(api)
    while not stop.is_set():
        pods: Any = await asyncio.to_thread(core.list_pod_for_all_namespaces)
        pod: Any
        for pod in pods.items:
            load = loads.get(pod.spec.node_name or "")
            if load is None or pod.status.phase != "Running" or pod.metadata.uid in load.pods:
                continue
            cpus = {
                c.name: 0.9 * float((c.resources.limits or {}).get("cpu", "1")) for c in pod.spec.containers
            }
            load.add_pod(pod.metadata.namespace, pod.metadata.name, pod.metadata.uid, cpus, qos="guaranteed")
        for load in loads.values():
            load.advance(0.5)
        await asyncio.sleep(0.5)


def real_node_demo(workdir: Path, began: float) -> bool:
    """The chart's own pods on a real kubelet with containerd, and a cache pod there; False when this machine
    cannot run a real node (the reason is printed) or the real node failed."""
    bin_dir, reason = binaries_or_reason()
    if bin_dir is None:
        print(f"\nReal node: not on this machine ({reason}); the simulated nodes follow.", flush=True)
        return False
    step("real node: images (built once, about 5 minutes; cached afterwards), control plane, kubelet", began)
    with RealStack(bin_dir, workdir / "real") as stack:
        step(f"real node {stack.node.name}: chart installed with helm, its pods Ready", began)
        stack.create(stack.cache_pod("cache-pod", "default"))
        try:
            stack.wait_applied("default", "cache-pod-rmd-workload-app", timeout=60)
        except AssertionError as exc:
            print(f"  {exc}")
        kubelet = stack.get_json("node", stack.node.name)["status"]["nodeInfo"]["kubeletVersion"]
        print(f"\nReal node {stack.node.name} (a real kubelet {kubelet} with containerd; RDT simulated):")
        print(stack.kubectl("get", "pods", "-A", "-o", "wide").stdout.rstrip())
        key = CACHE_WAYS_RESOURCE.replace(".", r"\.")  # jsonpath escapes the dots of a key
        capacity = stack.kubectl(
            "get", "node", stack.node.name, "-o", f"jsonpath={{.status.allocatable.{key}}}"
        )
        ways = capacity.stdout
        print(f"\n  {CACHE_WAYS_RESOURCE} allocatable on the Node (the agent's device plugin): {ways}")
        print(stack.kubectl("get", RMD_WORKLOAD.plural, "-A").stdout.rstrip())
    step("real node stopped; the host is as it was", began)
    return True


async def demo(workdir: Path, stay: bool, real_node: bool = True, stops: SignalStop | None = None) -> int:
    """The exit status: 0, 1 when some workload did not settle, 128 + n when signal n stopped it (through
    `stops`, whose handlers the caller sets: rmd_sim.stop_signals)."""
    began = time.monotonic()
    stops = stops or SignalStop(workdir)
    if real_node:
        await asyncio.to_thread(real_node_demo, workdir, began)
    settled = False
    if stops.attach():
        try:
            settled = await simulated_demo(workdir, stay, stops, began)
        except asyncio.CancelledError:
            if stops.signum is None:
                raise
    step("stopped; nothing left running", began)
    return stops.status(0 if settled else 1)


async def simulated_demo(workdir: Path, stay: bool, stops: SignalStop, began: float) -> bool:
    """Whether every workload settled; with `stay`, runs until a signal cancels it."""
    step("starting the control plane, the operator and three simulated nodes", began)
    cluster = SimCluster(workdir, nodes=NODES, agent_settings={"power_interval_seconds": POWER_INTERVAL})
    try:
        await cluster.start()
        return await show(cluster, stay, began)
    finally:
        stops.detach()  # the cluster's stop runs to its end (a second signal forces it)
        # libfuse reports unmounts from helper threads on stderr; keep that out of the summary
        with stderr_to(workdir / "teardown.log"):
            await cluster.stop()


async def show(cluster: SimCluster, stay: bool, began: float) -> bool:
    step(f"cluster up: kubeconfig {cluster.kubeconfig}", began)
    directory = samples_dir()
    applied = apply_samples(cluster, directory)
    step(f"applied {len(applied)} manifests from {directory}", began)
    with cluster.api_client() as api:
        await asyncio.to_thread(create_node_config, api)  # its Fake values arrive while the workloads settle
        stop = asyncio.Event()
        load = asyncio.create_task(run_load(cluster, api, stop))
        try:
            settled = await wait_for(lambda: all_settled(api), 60)
            await asyncio.sleep(3 * POWER_INTERVAL)  # a few power samples under load
            await wait_for(lambda: telemetry_complete(telemetry_sources(api)), 10)
            step("workloads settled" if settled else "some workloads still pending after 60 s", began)
            print_summary(cluster, api, stay)
            if stay:
                await asyncio.Event().wait()  # until a signal cancels this task
        except BaseException:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
            raise
        stop.set()
        await load
    return settled


def print_summary(cluster: SimCluster, api: Any, stay: bool) -> None:
    sections = [
        ("RmdWorkloads, per node", workload_lines(api)),
        ("Pods asking for cache ways", pod_lines(api)),
        ("NodeResourceTopology (what topology-aware scheduling sees)", topology_lines(api, NODES[0])),
        ("Power (RAPL, simulated load)", power_lines(cluster)),
        ("Node telemetry (a NodeConfig's status, from the operator's collectors)", telemetry_lines(api)),
    ]
    for title, lines in sections:
        print(f"\n{title}:")
        print("\n".join(lines))
    print("\nTry next:")
    if stay:
        print(f"  export KUBECONFIG={cluster.kubeconfig}   (running until Ctrl-C or kill {os.getpid()})")
    else:
        print("  ./dev demo --stay      keep it running and use kubectl against it")
    print(
        f"  kubectl get {RMD_WORKLOAD.plural} -A; kubectl get {RMD_NODE_STATE.plural} -n {SYSTEM_NAMESPACE}"
    )
    print(f"  kubectl get {NODE_RESOURCE_TOPOLOGY.plural} -o yaml; read docs/how-it-works.md", flush=True)
    print(f"  kubectl get {NODE_CONFIG.plural} -A   (docs/telemetry.md)", flush=True)


def _run(args: argparse.Namespace) -> int:
    workdir = Path(
        tempfile.mkdtemp(prefix="rmd-demo-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
    )
    # Handlers set before the first FUSE mount, kept until the work directory is gone (rmd_sim.stop_signals).
    with SignalStop(workdir, keep=args.keep) as stops:
        try:
            return asyncio.run(demo(workdir, args.stay, not args.no_real_node, stops))
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)


def add_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo", help="the whole system on simulated nodes: control plane, operator, agents, samples"
    )
    p.add_argument(
        "--stay",
        action="store_true",
        help="keep everything running until Ctrl-C or SIGTERM (exit status 128 + the signal's number)",
    )
    p.add_argument(
        "--no-real-node",
        action="store_true",
        help="skip the real kubelet part (it runs first when this machine allows: root, containerd)",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the work directory (logs, host trees) afterwards"
    )
    p.set_defaults(run=_run)


if __name__ == "__main__":
    flags = {"stay": "--stay", "keep": "--keep", "no_real_node": "--no-real-node"}
    sys.exit(_run(argparse.Namespace(**{name: flag in sys.argv for name, flag in flags.items()})))
