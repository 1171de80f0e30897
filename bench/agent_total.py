"""Benchmark: the whole agent's budget at steady state, everything on (issue #14 item 5).

Defaults are the issue's conditions. A real control plane (etcd, kube-apiserver, every CRD) and the `large`
simulated node (256 CPUs, 8 NUMA nodes, 2 sockets of RAPL package and dram) in /dev/shm: kernel-like resctrl
through FUSE (served from its own process), a simulated kubelet registered as a Node, holding 500 pods of 2
containers (PodResources over gRPC, device plugins), and a separate simulator process that keeps every counter
the power telemetry reads moving (rmd_sim.load, as bench/power_overhead.py: RAPL, /proc/stat and each pod's
and container's cpu.stat, at most every 10 ms). On it `rmd-agent serve` runs as its own process with mTLS and
everything on: the engine with 100 workloads applied over gRPC as the operator would (6 guaranteed with MBA, 4
best effort, 90 shared-pool), NodeResourceTopology export, power sampling every 1 s, the cache-ways device
plugin registered with the kubelet, RmdNodeState and its heartbeat Lease, RDT metrics; /metrics is scraped
every 15 s, as Prometheus would.

Once the workloads are applied, the agent is restarted over them (so every run below starts the same way, as
after an upgrade) and, after a warm-up, measured over `--repeats` windows of `--window` seconds: CPU (utime +
stime from /proc/<pid>/stat) as a share of one core, VmRSS (median of 1 s samples) and its peak (VmHWM). Then
the agent is restarted with ONE part off at a time (a settings toggle; the 100 workloads removed over gRPC for
the engine's part, the scrapes left out for theirs) and measured the same way: a part's contribution is the
difference from everything on. The figures are medians of the repetitions.

    python bench/agent_total.py [--pods 500] [--workloads 100] [--window 60] [--repeats 3] [--warmup 20]
                                [--scrape-interval 15] [--parts all|none|power,nrt,...] [--profile SECONDS]
                                [--profile-off power,...] [--json] [--keep]

Targets (issue #14 item 5): with everything on, agent CPU <= 2 % of one core and RSS <= 100 MiB (the peak,
VmHWM, over the whole run, and so also the steady VmRSS). Exit status 1 if one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
from nrt_vs_rte import pod_containers, pod_uid
from operator_bench_common import (
    cpu_seconds,
    machine,
    machine_busy_seconds,
    machine_line,
    peak_rss_mib,
    progress,
    rss_mib,
    run_and_report,
)

from rmd_api.agent.v1 import agent_pb2, agent_pb2_grpc
from rmd_api.names import CACHE_WAYS_RESOURCE, NODE_RESOURCE_TOPOLOGY, RMD_NODE_STATE
from rmd_api.node_state import lease_name, node_state_name
from rmd_sim.control_plane import ControlPlane, find_bin_dir, repo_root
from rmd_sim.load import SimLoad
from rmd_sim.node import ClusterPki, SimNode
from rmd_sim.spec import NodeSpec

TARGET_CPU_SHARE = 0.02  # of one core
TARGET_RSS_MIB = 100.0
NODE = "bench-total"
SIM_MIN_STEP = 0.01  # the simulator rewrites every counter at most this often (seconds)
_WORKLOAD_LABEL = re.compile(r'^rmd_workload_cache_ways\{[^}]*workload="([^"]*)"', re.MULTILINE)
_agent_stub: Any = agent_pb2_grpc.AgentStub  # generated without annotations
# What "everything on" means beyond SimNode's defaults with a kubeconfig (NRT, RmdNodeState, device plugin,
# heartbeat every 5 s, RDT metrics every 15 s): power sampled every second, the interval.
ALL_ON: dict[str, Any] = {"power_interval_seconds": 1.0}


@dataclass(frozen=True)
class Part:
    key: str
    label: str
    settings: Mapping[str, Any] = field(default_factory=dict)  # what turns it off
    workloads: bool = True
    scrape: bool = True


PARTS = (
    Part("power", "power sampling, 1 s", {"power_enabled": False}),
    Part("nrt", "NRT export", {"nrt_enabled": False}),
    Part("deviceplugin", "device plugin", {"device_plugin_enabled": False}),
    Part("nodestate", "RmdNodeState + heartbeat", {"node_state_enabled": False}),
    # The collector stays registered (it is not optional); refreshed once at start, never again.
    Part("rdt", "RDT metrics refresh, 15 s", {"rdt_metrics_interval_seconds": 1e9}),
    Part("scrape", "/metrics scrapes, 15 s", scrape=False),
    Part("workloads", "engine's workloads", workloads=False),
)
ALL = Part("all", "everything on")


# -- the simulator process: counters moving ----------------------------------------------------------------


def simulate(plan_file: Path) -> int:
    """`--simulate PLAN`: put the pods under rmd_sim.load and advance them in real time until SIGTERM; print
    "ready" once built and, at the end, the counter updates per second."""
    plan = json.loads(plan_file.read_text())
    load = SimLoad(Path(plan["root"]))
    for namespace, name, uid, rates in plan["pods"]:
        load.add_pod(namespace, name, uid, rates, sandbox_cpus=0.001)
    load.advance(1.0)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    last, steps, began = time.monotonic(), 0, time.monotonic()
    while not stopping:
        now = time.monotonic()
        if now - last < SIM_MIN_STEP:
            time.sleep(SIM_MIN_STEP - (now - last))
            continue
        load.advance(now - last)
        last = now
        steps += 1
    print(json.dumps({"steps_per_second": steps / (time.monotonic() - began)}), flush=True)
    return 0


def start_simulator(root: Path, node: SimNode, workdir: Path) -> subprocess.Popen[str]:
    """The simulator for the pods the kubelet holds: each container a fixed, different CPU rate (seeded)."""
    assert node.kubelet is not None
    rates = random.Random(14)
    pods = [
        [p.namespace, p.name, p.uid, {c.name: round(rates.uniform(0.02, 0.2), 4) for c in p.containers}]
        for p in node.kubelet.pods
    ]
    plan = workdir / "simulate.json"
    plan.write_text(json.dumps({"root": str(root), "pods": pods}))
    with (workdir / "simulator.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--simulate", str(plan)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise SystemExit(f"the simulator did not start; see {workdir / 'simulator.log'}")
    return proc


def stop_simulator(proc: subprocess.Popen[str]) -> float:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    try:
        return float(json.loads(out.strip().splitlines()[-1])["steps_per_second"])
    except (ValueError, IndexError, KeyError):
        return float("nan")


# -- the workloads, as the operator applies them -------------------------------------------------------------


def workload_requests(spec: NodeSpec, count: int) -> list[agent_pb2.ApplyWorkloadRequest]:
    """2 CPUs each from the top of alternate sockets: 6 guaranteed (2 ways, MBA 50 %), 4 best effort (max 3,
    min 1), the rest shared-pool (bench/engine_apply.py's mix)."""
    free = [spec.cpus_of_socket(s) for s in range(spec.sockets)]
    out = []
    for i in range(count):
        cpus = [free[i % spec.sockets].pop(), free[i % spec.sockets].pop()]
        spec_kw: dict[str, Any] = {"core_ids": [",".join(map(str, sorted(cpus)))]}
        if i < 6:
            spec_kw["cache"] = agent_pb2.CacheRequest(max=2, min=2)
            spec_kw["mba"] = agent_pb2.MbaRequest(percentage=50)
        elif i < 10:
            spec_kw["cache"] = agent_pb2.CacheRequest(max=3, min=1)
        else:
            spec_kw["cache"] = agent_pb2.CacheRequest(max=0, min=0)
        ref = agent_pb2.WorkloadRef(namespace="bench", name=f"w{i:03d}", uid=f"bench-uid-{i:03d}")
        out.append(agent_pb2.ApplyWorkloadRequest(ref=ref, spec=agent_pb2.WorkloadSpec(**spec_kw)))
    return out


async def apply_all(node: SimNode, requests: list[agent_pb2.ApplyWorkloadRequest]) -> None:
    async with node.channel() as channel:
        agent = _agent_stub(channel)
        for request in requests:
            await agent.ApplyWorkload(request, timeout=30)


async def remove_all(node: SimNode, requests: list[agent_pb2.ApplyWorkloadRequest]) -> None:
    async with node.channel() as channel:
        agent = _agent_stub(channel)
        for request in requests:
            await agent.RemoveWorkload(agent_pb2.RemoveWorkloadRequest(ref=request.ref), timeout=30)


# -- measuring -----------------------------------------------------------------------------------------------


def scrape(url: str) -> tuple[float, int, str]:
    """One Prometheus-style scrape: wall seconds, bytes, the text."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as reply:
        body: bytes = reply.read()
    return time.perf_counter() - started, len(body), body.decode()


async def measure(
    node: SimNode,
    part: Part,
    simulator: int,
    *,
    warmup: float,
    window: float,
    repeats: int,
    scrape_every: float,
) -> dict[str, Any]:
    """The agent over `repeats` windows; beside it, how busy the machine was (every process, ours and
    others') and the simulator's share of it, since all of them share the same CPUs."""
    assert node.process is not None
    pid, url = node.process.pid, f"http://127.0.0.1:{node.http_port}/metrics"
    await asyncio.sleep(warmup)
    reps: list[dict[str, Any]] = []
    last_text = ""
    for _ in range(repeats):
        rss: list[float] = []
        scrapes: list[tuple[float, int]] = []
        cpu0, sim0, busy0, t0 = (
            cpu_seconds(pid),
            cpu_seconds(simulator),
            machine_busy_seconds(),
            time.monotonic(),
        )
        next_scrape, end = t0, t0 + window
        while (now := time.monotonic()) < end:
            if part.scrape and now >= next_scrape:
                wall, size, last_text = await asyncio.to_thread(scrape, url)
                scrapes.append((wall, size))
                next_scrape += scrape_every
            rss.append(rss_mib(pid))
            wake = min(end, now + 1.0, next_scrape if part.scrape else end)
            await asyncio.sleep(max(0.0, wake - time.monotonic()))
        cpu1, sim1, busy1, t1 = (
            cpu_seconds(pid),
            cpu_seconds(simulator),
            machine_busy_seconds(),
            time.monotonic(),
        )
        reps.append(
            {
                "cpu_share": (cpu1 - cpu0) / (t1 - t0),
                "machine_busy": (busy1 - busy0) / (t1 - t0) / (os.cpu_count() or 1),
                "simulator_cpu_share": (sim1 - sim0) / (t1 - t0),
                "rss_mib": statistics.median(rss),
                "scrapes": len(scrapes),
                "scrape_ms": [round(w * 1e3, 1) for w, _ in scrapes],
                "scrape_bytes": max((s for _, s in scrapes), default=0),
            }
        )
    return {
        "part": part.key,
        "label": part.label,
        "repetitions": reps,
        "cpu_share": statistics.median(r["cpu_share"] for r in reps),
        "rss_mib": statistics.median(r["rss_mib"] for r in reps),
        "rss_peak_mib": peak_rss_mib(pid),
        "threads": len(os.listdir(f"/proc/{pid}/task")),
        "last_scrape": last_text,
    }


def series_count(text: str, name: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))


def everything_on(node: SimNode, text: str, workloads: int) -> dict[str, bool]:
    """That each part really ran: its object in the API, its registration, its series on /metrics."""
    assert node.kubelet is not None and node.kubelet.device_manager is not None and node.kubeconfig
    api_client: Any = kubernetes.config.new_client_from_config  # untyped
    with api_client(str(node.kubeconfig)) as api:
        custom = kubernetes.client.CustomObjectsApi(api)
        nrt = NODE_RESOURCE_TOPOLOGY
        found_nrt: Any = custom.get_cluster_custom_object(nrt.group, nrt.version, nrt.plural, NODE)
        state = RMD_NODE_STATE
        found_state = custom.get_namespaced_custom_object(
            state.group, state.version, "default", state.plural, node_state_name(NODE)
        )
        lease = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(lease_name(NODE), "default")
    return {
        "NodeResourceTopology published": bool(found_nrt.get("zones")),
        "RmdNodeState published": bool(found_state),
        "heartbeat Lease renewed": lease.spec is not None and lease.spec.renew_time is not None,
        "device plugin registered with the kubelet": CACHE_WAYS_RESOURCE
        in node.kubelet.device_manager.resources(),
        f"{workloads} workloads on /metrics": len(set(_WORKLOAD_LABEL.findall(text))) == workloads,
        "power: pods on /metrics": series_count(text, "rmd_pod_energy_joules_total") > 0,
    }


# Where a py-spy stack's time goes: the first frame, from the stack's root, in one of these (path fragments).
PROFILE_OWNERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("scrape", ("rmd_agent/server/http_endpoints.py",)),
    ("power", ("rmd_agent/power/", "rmd_agent/metrics/power_collector.py")),
    ("nrt", ("rmd_agent/nrt/",)),
    ("deviceplugin", ("rmd_agent/deviceplugin/",)),
    ("nodestate", ("rmd_agent/node_state.py", "rmd_agent/heartbeat.py")),
    ("rdt", ("rmd_agent/metrics/rdt_collector.py",)),
    ("workloads", ("rmd_agent/engine.py", "rmd_agent/pstate/", "rmd_agent/observe/", "rmd_agent/act/")),
    ("grpc", ("rmd_agent/server/grpc_service.py", "site-packages/grpc/")),
)


def profile_owner(stack: str) -> str:
    for frame in stack.split(";"):
        for owner, fragments in PROFILE_OWNERS:
            if any(f in frame for f in fragments):
                return owner
    return "other"


def profile_shares(raw: str) -> dict[str, float]:
    """py-spy's raw output (one "frame;frame;... count" line per stack) as each owner's share of the
    samples in which a thread of the agent was running Python code."""
    counts: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            owner = profile_owner(stack)
            counts[owner] = counts.get(owner, 0) + int(count)
    total = sum(counts.values())
    return {owner: n / total for owner, n in sorted(counts.items(), key=lambda kv: -kv[1])} if total else {}


def py_spy(pid: int, seconds: float, out: Path) -> dict[str, Any]:
    """py-spy the agent for `seconds` (100 Hz, without stopping it) and share its samples out by part."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {"error": "py-spy is not on PATH"}
    argv = [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "100", "--nonblocking"]
    done = subprocess.run(
        [*argv, "--duration", str(max(1, round(seconds))), "-o", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not out.exists():
        return {"error": f"py-spy failed: {done.stderr.strip()[-500:]}"}
    raw = out.read_text()
    samples = sum(int(line.rpartition(" ")[2]) for line in raw.splitlines() if line.strip())
    return {"seconds": seconds, "samples": samples, "shares": profile_shares(raw)}


async def restart(node: SimNode, part: Part) -> None:
    await node.stop_agent()
    node.extra_settings = {**ALL_ON, **part.settings}
    await node.start_agent()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    quiet = args.json
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None  # noqa: ASYNC240  # once, at start
    workdir = Path(tempfile.mkdtemp(prefix="rmd-bench-total-", dir=shm))
    parts = [p for p in PARTS if args.parts == "all" or p.key in args.parts.split(",")]
    result: dict[str, Any] = {
        "machine": machine(),
        "pods": args.pods,
        "workloads": args.workloads,
        "window_s": args.window,
        "repeats": args.repeats,
        "scrape_interval_s": args.scrape_interval,
    }
    control_plane = ControlPlane(
        find_bin_dir(), workdir / "control-plane", crds=sorted((repo_root() / "crds").glob("*.yaml"))
    )
    simulator: subprocess.Popen[str] | None = None
    runs: list[dict[str, Any]] = []
    try:
        progress(quiet, "starting the control plane")
        control_plane.start()  # in this thread: its processes die with the thread that started them
        spec = NodeSpec.large()
        node = SimNode(
            NODE,
            workdir / "node",
            ClusterPki(workdir / "pki"),
            spec=spec,
            kubeconfig=control_plane.kubeconfig,
            agent_settings=ALL_ON,
            resctrl_process=True,
        )
        async with node:
            assert node.kubelet is not None
            for i in range(args.pods):
                node.kubelet.add_pod(f"ns-{i % 10}", f"pod-{i}", pod_uid(f"pod-{i}"), pod_containers(i))
            simulator = await asyncio.to_thread(start_simulator, node.root, node, workdir)
            requests = workload_requests(spec, args.workloads)
            progress(quiet, f"applying {len(requests)} workloads over gRPC")
            await apply_all(node, requests)
            assert node.process is not None
            result["rss_peak_applying_mib"] = peak_rss_mib(node.process.pid)
            # Every run starts the same way: the agent (re)started over the applied workloads, as after an
            # upgrade or a node reboot.
            # Everything on is measured first and, when parts were, again after them: a drift of the
            # machine's load over the run then shows, and the baseline is the median of both.
            again = [ALL] if parts else []
            profiled: dict[str, Any] = result.setdefault("profiles_part_off", {})

            async def restart_and_measure(part: Part) -> None:
                await restart(node, part)
                progress(quiet, f"measuring: {part.label if part is ALL else part.label + ' off'}")
                runs.append(
                    await measure(
                        node,
                        part,
                        simulator.pid,
                        warmup=args.warmup,
                        window=args.window,
                        repeats=args.repeats,
                        scrape_every=args.scrape_interval,
                    )
                )

            for part in [ALL, *[p for p in parts if p.workloads], *again]:
                await restart_and_measure(part)
                if args.profile and part.key in args.profile_off.split(",") and part.key not in profiled:
                    # Diagnostics: where the rest of the agent's time goes once this part is off.
                    progress(quiet, f"py-spy with {part.label} off, {args.profile:g} s")
                    assert node.process is not None
                    profiled[part.key] = await asyncio.to_thread(
                        py_spy, node.process.pid, args.profile, workdir / f"py-spy-{part.key}-off.txt"
                    )
                if part is ALL and "checks" not in result:
                    result["checks"] = await asyncio.to_thread(
                        everything_on, node, runs[0]["last_scrape"], args.workloads
                    )
                    if args.profile:  # after the windows, so that sampling does not weigh on them
                        progress(quiet, f"py-spy of everything on, {args.profile:g} s")
                        assert node.process is not None
                        result["profile"] = await asyncio.to_thread(
                            py_spy, node.process.pid, args.profile, workdir / "py-spy.txt"
                        )
            for part in (p for p in parts if not p.workloads):
                await remove_all(node, requests)
                await restart_and_measure(part)
            result["resctrl_rule_violations"] = node.check_resctrl()
        result["simulator_steps_per_second"] = await asyncio.to_thread(stop_simulator, simulator)
        simulator = None
    finally:
        if simulator is not None and simulator.poll() is None:
            simulator.kill()
            simulator.wait()
        control_plane.stop()
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    for r in runs:
        r.pop("last_scrape")
    result["runs"] = runs
    on = [rep for r in runs if r["part"] == ALL.key for rep in r["repetitions"]]
    total = result["total"] = {
        "cpu_share": statistics.median(rep["cpu_share"] for rep in on),
        "rss_mib": statistics.median(rep["rss_mib"] for rep in on),
        "rss_peak_mib": max(r["rss_peak_mib"] for r in runs if r["part"] == ALL.key),
        "windows": len(on),
    }
    result["contributions"] = [
        {
            "part": r["part"],
            "label": r["label"],
            "cpu_share": total["cpu_share"] - r["cpu_share"],
            "rss_mib": total["rss_mib"] - r["rss_mib"],
        }
        for r in runs
        if r["part"] != ALL.key
    ]
    result["targets"] = [
        {
            "what": f"CPU <= {TARGET_CPU_SHARE:.0%} of a core, everything on",
            "met": total["cpu_share"] <= TARGET_CPU_SHARE,
            "detail": f"{total['cpu_share']:.2%}",
        },
        {
            "what": f"RSS <= {TARGET_RSS_MIB:g} MiB, everything on (peak)",
            "met": max(total["rss_peak_mib"], result["rss_peak_applying_mib"]) <= TARGET_RSS_MIB,
            "detail": f"steady {total['rss_mib']:.1f} MiB, peak {total['rss_peak_mib']:.1f} MiB; peak "
            f"{result['rss_peak_applying_mib']:.1f} MiB after applying the {result['workloads']} workloads",
        },
    ]
    return result


def report(result: Mapping[str, Any]) -> None:
    print(machine_line(result["machine"]))
    print(
        f"large simulated node ({NodeSpec.large().cpus} CPUs), {result['pods']} pods x 2 containers with "
        f"counters moving (simulator: {result['simulator_steps_per_second']:.0f} updates/s), "
        f"{result['workloads']} workloads; {result['repeats']} windows of {result['window_s']:g} s after "
        f"the warm-up, medians; /metrics scraped every {result['scrape_interval_s']:g} s"
    )
    total = result["total"]
    shares = (result.get("profile") or {}).get("shares", {})
    spied = "CPU % by py-spy" if shares else ""

    def spy(key: str) -> str:
        return f"{shares.get(key, 0.0) * total['cpu_share'] * 100:.2f}" if shares else ""

    print(f"{'part':<38} {'CPU % of a core':>16} {spied:>16} {'RSS MiB':>9}")
    name = f"everything on (total, {total['windows']} windows)"
    print(f"{name:<38} {total['cpu_share'] * 100:>16.2f} {spied and '100 %':>16} {total['rss_mib']:>9.1f}")
    for c in result["contributions"]:
        label = "  " + c["label"]
        print(f"{label:<38} {c['cpu_share'] * 100:>16.2f} {spy(c['part']):>16} {c['rss_mib']:>9.1f}")
    if result["contributions"]:
        cpu_rest = total["cpu_share"] - sum(c["cpu_share"] for c in result["contributions"])
        rss_rest = total["rss_mib"] - sum(c["rss_mib"] for c in result["contributions"])
        rest = "  the rest (interpreter, gRPC, ...)"
        print(f"{rest:<38} {cpu_rest * 100:>16.2f} {spy('grpc'):>16} {rss_rest:>9.1f}")
        if shares:
            other = "  (py-spy: event loop and other code)"
            print(f"{other:<38} {'':>16} {spy('other'):>16}")
        print(
            "(a part's CPU and RSS: everything on minus the run with that part off; by py-spy: its share of"
        )
        print(" the agent's Python samples with everything on, times the total; the rest's py-spy is gRPC's)")
    head = f"{'CPU % per window':>24} {'RSS MiB':>9} {'peak MiB':>9} {'scrapes':>8} {'scrape ms':>10}"
    print(f"{'run':<34} {head} {'machine busy %':>15}")
    for r in result["runs"]:
        name = "everything on" if r["part"] == "all" else f"{r['label']} off"
        cpus = ", ".join(f"{rep['cpu_share'] * 100:.2f}" for rep in r["repetitions"])
        scrapes = sum(rep["scrapes"] for rep in r["repetitions"])
        walls = [w for rep in r["repetitions"] for w in rep["scrape_ms"]]
        wall = f"{statistics.median(walls):.0f}" if walls else "-"
        busy = statistics.median(rep["machine_busy"] for rep in r["repetitions"]) * 100
        print(
            f"{name:<34} {cpus:>24} {r['rss_mib']:>9.1f} {r['rss_peak_mib']:>9.1f} {scrapes:>8} {wall:>10} "
            f"{busy:>15.0f}"
        )
    sim_share = statistics.median(
        rep["simulator_cpu_share"] for r in result["runs"] for rep in r["repetitions"]
    )
    print(
        f"machine busy: all processes on its {result['machine']['cpus']} CPUs (median of the windows); of it "
        f"the counter simulator {sim_share:.0%} of a core, the rest the control plane, the simulated "
        "kubelet and resctrl, and other work on the machine"
    )
    sizes = [rep["scrape_bytes"] for r in result["runs"] for rep in r["repetitions"] if rep["scrape_bytes"]]
    if sizes:
        print(f"/metrics with everything on: {max(sizes) / 1e6:.2f} MB per scrape")
    profile = result.get("profile")
    if profile and "shares" in profile:
        labels = {p.key: p.label for p in PARTS} | {"grpc": "gRPC server", "other": "other (event loop, ...)"}
        shares = ", ".join(f"{labels.get(k, k)} {v:.0%}" for k, v in profile["shares"].items())
        print(f"py-spy, everything on, {profile['samples']} samples in {profile['seconds']:g} s: {shares}")
    elif profile:
        print(f"py-spy: {profile['error']}")
    labels = {p.key: p.label for p in PARTS} | {"grpc": "gRPC server", "other": "other (event loop, ...)"}
    for key, off in (result.get("profiles_part_off") or {}).items():
        if "shares" in off:
            shares = ", ".join(f"{labels.get(k, k)} {v:.0%}" for k, v in off["shares"].items())
            print(f"py-spy, {labels[key]} off, {off['samples']} samples in {off['seconds']:g} s: {shares}")
    for what, ok in result["checks"].items():
        print(f"check {what}: {'yes' if ok else 'NO'}")
    print(f"resctrl rule violations: {len(result['resctrl_rule_violations'])}")
    for t in result["targets"]:
        print(f"target {t['what']}: {'met' if t['met'] else 'MISSED'} ({t['detail']})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=500, help="pods of 2 containers on the kubelet")
    parser.add_argument("--workloads", type=int, default=100, help="workloads applied over gRPC")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per measured window")
    parser.add_argument("--repeats", type=int, default=3, help="windows per run; figures are their medians")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds after each (re)start")
    parser.add_argument("--scrape-interval", type=float, default=15.0, help="seconds between scrapes")
    parser.add_argument(
        "--parts",
        default="all",
        help="parts measured off one at a time: all, none, or a comma list of "
        + ",".join(p.key for p in PARTS),
    )
    parser.add_argument(
        "--profile",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="after the windows with everything on, py-spy the agent this long (needs py-spy on PATH)",
    )
    parser.add_argument(
        "--profile-off",
        default="",
        metavar="PARTS",
        help="with --profile, also py-spy the runs with these parts off (a comma list), after their windows",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--simulate", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.simulate:
        return simulate(args.simulate)
    unknown = set(args.parts.split(",")) - {p.key for p in PARTS} - {"all", "none"}
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    result = run_and_report(run, args, report)
    return (
        0
        if all(t["met"] for t in result["targets"]) and result["checks"] and all(result["checks"].values())
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
