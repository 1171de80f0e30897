"""Benchmark: power telemetry at issue #14's scale — cost and accuracy with counters that keep moving.

Defaults are the issue's conditions: the `large` simulated node (256 CPUs, 2 sockets, RAPL package and
dram) in /dev/shm, 500 pods x 2 containers (plus each pod's sandbox), a sample every 1 s. A separate
process runs the simulator (rmd_sim.load) continuously in real time: it rewrites RAPL, /proc/stat and every
cgroup's cpu.stat as fast as it can (at most every 10 ms), so counters move while the agent reads them, as
on a real node. Each container burns a fixed, different CPU rate, so the simulator's truth of each pod's
share of the energy is exact: the agent's share (its pod energy over the node energy it saw) is compared
with it. Per repetition, in this process:

    sample      PowerSampler.sample() once a second: CPU time of the sampling thread (time.thread_time)
    scrape      the agent's /metrics text (exposition.generate) of PowerCollector, after each sample:
                wall and CPU time
    powercap    bare read of every RAPL energy_uj file (the least any RAPL exporter does)
    per-process a Kepler-style scan: list /proc, read every process's stat and cgroup, parse the container
                id, sum per container (Kepler v0.10+ reads /proc/<pid>/stat per process, reference §2.1);
                run over simulated /proc/<pid> files, P processes per container

and at the end: RSS peak of this process, conservation (idle + system + pods = node energy, containers =
pod, per zone kind) and accuracy (pods' total share and per-pod mean error against the truth).

    python bench/power_overhead.py [--pods 500] [--containers 2] [--interval 1] [--samples 30]
                                   [--repeats 3] [--procs 5] [--json]

Targets (issue #14 item 4): sample CPU <= 1% of one core at the interval; scrape p50 <= 50 ms and
/metrics bytes <= 0.5x Kepler's at 500 pods (2.26 MB, measured in the issue); RSS <= 80 MiB; conservation
exact; pods' total within 0.5% of the truth and per-pod mean error <= 1%, in every repetition; a sample
cheaper than the per-process scan. Exit status 1 if any is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import random
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from rmd_agent.hostfs import HostFS, read_small
from rmd_agent.metrics.exposition import generate
from rmd_agent.metrics.power_collector import PowerCollector, render
from rmd_agent.power.cpu_time import KeptFiles
from rmd_agent.power.sampler import PowerSampler, PowerSnapshot
from rmd_sim.hosttree import write_host_tree
from rmd_sim.load import SimLoad
from rmd_sim.real_cgroups import RealCgroupTree
from rmd_sim.spec import NodeSpec

TARGET_CPU_SHARE = 0.01  # of one core, at the interval
TARGET_SCRAPE_MS = 50.0
KEPLER_BYTES_500_PODS = 2.26e6  # issue #14, Kepler 0.11 at 500 pods x 2 containers
TARGET_BYTES_X_KEPLER = 0.5
TARGET_RSS_MIB = 80.0
TARGET_TOTAL_ERROR = 0.005
TARGET_POD_ERROR = 0.01
SIM_MIN_STEP = 0.01  # the simulator rewrites every counter at most this often (seconds)
_CONTAINER_ID = re.compile(r"(?:cri-containerd-|crio-|docker-)?([0-9a-f]{64})(?:\.scope)?$")


def build_node(root: Path, pods: int, containers: int, procs: int, seed: int = 14) -> tuple[SimLoad, int]:
    spec = NodeSpec.large()
    write_host_tree(spec, root)
    load = SimLoad(root)
    rates = random.Random(seed)
    pid = 1000
    qos_cycle = ("guaranteed", "burstable", "besteffort")
    for i in range(pods):
        uid = str(uuid.UUID(int=rates.getrandbits(128), version=4))
        names = {f"c{j}": round(rates.uniform(0.02, 0.2), 4) for j in range(containers)}
        pod = load.add_pod(f"ns{i % 10}", f"pod-{i}", uid, names, qos=qos_cycle[i % 3], sandbox_cpus=0.001)
        # processes for the per-process comparison: /proc/<pid>/{stat,cgroup} as the kernel writes them
        for part in pod.containers.values():
            cgroup = f"0::/{pod.rel_dir}/cri-containerd-{part.id}.scope"
            for _ in range(procs if part.name else 1):
                pid += 1
                proc = root / "proc" / str(pid)
                proc.mkdir(parents=True)
                fields = ["S", "1", "1", "1", "0", "-1", "4194560", "0", "0", "0", "0", "1234", "567"]
                (proc / "stat").write_text(f"{pid} (worker) {' '.join(fields)} 0 0 20 0 1 0 100 0 0\n")
                (proc / "cgroup").write_text(cgroup + "\n")
    load.advance(5.0)
    return load, pid - 1000


def simulate(root: Path, pods: int, containers: int, procs: int, conn: Connection) -> None:
    """The simulator process: build the node, then advance it in real time until told to stop; send back
    the truth (each pod's and the node's energy per zone kind since the start, and the steps taken)."""
    load, processes = build_node(root, pods, containers, procs)
    conn.send(processes)
    last = time.monotonic()
    steps = 0
    while not conn.poll():
        now = time.monotonic()
        if now - last < SIM_MIN_STEP:
            time.sleep(SIM_MIN_STEP - (now - last))
            continue
        load.advance(now - last)
        last = now
        steps += 1
    conn.recv()
    kinds = sorted({k for per in load.expected_pod.values() for k in per})
    conn.send(
        {
            "pods": {uid: dict(per) for uid, per in load.expected_pod.items()},
            "node": {kind: load.zone_joules(kind) for kind in kinds},
            "steps": steps,
            "seconds": load.now,
        }
    )


def per_process_scan(proc_root: str) -> dict[str, float]:
    """What a per-process design does every interval: every pid's CPU time and container."""
    totals: dict[str, float] = {}
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        try:
            stat = read_small(f"{proc_root}/{entry}/stat")
            cgroup = read_small(f"{proc_root}/{entry}/cgroup").decode()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        ticks = int(fields[11]) + int(fields[12])  # utime + stime
        match = _CONTAINER_ID.search(cgroup.strip())
        key = match.group(1) if match else ""
        totals[key] = totals.get(key, 0.0) + ticks / 100
    return totals


def powercap_read(paths: list[str]) -> int:
    return sum(int(read_small(path)) for path in paths)


def cpu_times(fn: Callable[[], object], calls: int) -> list[float]:
    for _ in range(min(10, calls)):  # warm-up
        fn()
    out = []
    for _ in range(calls):
        start = time.thread_time()
        fn()
        out.append(time.thread_time() - start)
    return out


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "mean_ms": statistics.fmean(values) * 1e3,
        "p50_ms": ordered[len(ordered) // 2] * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
    }


def conservation_error(snap: PowerSnapshot) -> float:
    """Largest relative gap, per zone kind, between the node's energy and idle + system + pods, and
    between a pod and the sum of its containers."""
    worst = 0.0
    for kind in {z.key.kind for z in snap.zones}:
        node = math.fsum(z.energy_j for z in snap.zones if z.key.kind == kind)
        parts = math.fsum(
            [
                *(z.idle_j for z in snap.zones if z.key.kind == kind),
                snap.system_j.get(kind, 0.0),
                *(p.energy_j.get(kind, 0.0) for p in snap.pods),
            ]
        )
        worst = max(worst, abs(parts - node) / node if node else 0.0)
        by_pod: dict[str, float] = {}
        for part in snap.containers:
            by_pod[part.uid] = by_pod.get(part.uid, 0.0) + part.energy_j.get(kind, 0.0)
        for pod in snap.pods:
            whole = pod.energy_j.get(kind, 0.0)
            if whole > 0:
                worst = max(worst, abs(by_pod.get(pod.uid, 0.0) - whole) / whole)
    return worst


def accuracy(snap: PowerSnapshot, truth: dict[str, Any]) -> dict[str, float]:
    """The agent's shares of the node's energy (over the window it sampled) against the simulator's
    (over its whole run; every rate is constant, so a share does not depend on the window)."""
    kinds = sorted(truth["node"])
    node = sum(z.energy_j for z in snap.zones if z.key.kind in kinds)
    true_node = sum(truth["node"][k] for k in kinds)
    errors = []
    ours_total = true_total = 0.0
    for pod in snap.pods:
        share = sum(pod.energy_j.get(k, 0.0) for k in kinds) / node
        true_share = sum(truth["pods"][pod.uid].get(k, 0.0) for k in kinds) / true_node
        ours_total += share
        true_total += true_share
        errors.append(abs(share / true_share - 1))
    return {
        "pods_share": ours_total,
        "pods_share_truth": true_total,
        "total_error": ours_total / true_total - 1,
        "pod_error_mean": statistics.fmean(errors),
        "pod_error_max": max(errors),
    }


def real_tree_reads(pods: int, containers: int, reads: int) -> dict[str, float] | None:
    """The read step on real kernfs files: the files the sampler keeps open (each pod's and its containers',
    not the sandbox's) as real cgroups on this machine's cgroup2 mount, each read once per round, kept open
    and read with pread (the agent's way) and opened, read and closed; CPU per round, the first round left
    out. None without a writable cgroup2 mount (needs root)."""
    with tempfile.TemporaryDirectory(prefix="rmd-bench-cgroups-") as host:
        tree = RealCgroupTree.create(Path(host))
        if tree is None:
            return None
        try:
            paths = []
            for i in range(pods):
                _uid, pod, dirs = tree.add_pod(i, containers)
                paths += [str(d / "cpu.stat") for d in (pod, *dirs[:-1])]  # dirs[-1]: the sandbox
            kept = KeptFiles(len(paths))

            def kept_round() -> None:
                for path in paths:
                    kept.read(path)

            def open_round() -> None:
                for path in paths:
                    read_small(path)

            out = {
                "files": float(len(paths)),
                "kept_ms": statistics.fmean(cpu_times(kept_round, reads)) * 1e3,
                "open_ms": statistics.fmean(cpu_times(open_round, reads)) * 1e3,
            }
            kept.close()
            return out
        finally:
            tree.remove()


def rss_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def repetition(pods: int, containers: int, procs: int, samples: int, interval: float) -> dict[str, Any]:
    parent = "/dev/shm" if Path("/dev/shm").is_dir() else None
    root = Path(tempfile.mkdtemp(prefix="rmd-bench-power-", dir=parent))
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    sim = ctx.Process(target=simulate, args=(root, pods, containers, procs, theirs), daemon=True)
    sim.start()
    try:
        processes = ours.recv()
        sampler = PowerSampler(HostFS(root), interval=interval)
        registry = CollectorRegistry()
        registry.register(PowerCollector(sampler))
        sampler.sample()
        sample_cpu: list[float] = []
        sample_wall: list[float] = []
        scrape_cpu: list[float] = []
        scrape_wall: list[float] = []
        scrape_bytes = 0
        deadline = time.monotonic()
        for _ in range(samples):
            deadline += interval
            time.sleep(max(0.0, deadline - time.monotonic()))
            cpu, wall = time.thread_time(), time.perf_counter()
            sampler.sample()
            sample_cpu.append(time.thread_time() - cpu)
            sample_wall.append(time.perf_counter() - wall)
            cpu, wall = time.thread_time(), time.perf_counter()
            scrape_bytes = len(generate(registry))
            scrape_cpu.append(time.thread_time() - cpu)
            scrape_wall.append(time.perf_counter() - wall)
        snap = sampler.snapshot()
        sampler.close()
        powercap = [z.energy_path for z in sampler.rapl.zones]
        figures = {
            "sample (cpu)": summary(sample_cpu),
            "sample (wall)": summary(sample_wall),
            "scrape (cpu)": summary(scrape_cpu),
            "scrape (wall)": summary(scrape_wall),
            "powercap (cpu)": summary(cpu_times(lambda: powercap_read(powercap), samples)),
            "per-process (cpu)": summary(cpu_times(lambda: per_process_scan(str(root / "proc")), samples)),
        }
        ours.send("stop")
        truth = ours.recv()
    finally:
        sim.join(timeout=30)
        if sim.is_alive():
            sim.kill()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "processes": processes,
        "figures": figures,
        "series_per_scrape": sum(len(fam.samples) for fam in render(snap)),
        "scrape_bytes": scrape_bytes,
        "sim_steps_per_second": truth["steps"] / truth["seconds"],
        "conservation_error": conservation_error(snap),
        "accuracy": accuracy(snap, truth),
    }


def run(  # noqa: PLR0917 - the benchmark's conditions, one argument each
    pods: int, containers: int, procs: int, samples: int, interval: float, repeats: int
) -> dict[str, Any]:
    reps = [repetition(pods, containers, procs, samples, interval) for _ in range(repeats)]
    rss = rss_peak_mib()
    real_tree = real_tree_reads(pods, containers, samples)

    def med(name: str, stat: str = "mean_ms") -> float:
        return float(statistics.median(r["figures"][name][stat] for r in reps))

    sample_share = med("sample (cpu)") / 1e3 / interval
    scrape_p50 = med("scrape (wall)", "p50_ms")
    scrape_bytes = max(r["scrape_bytes"] for r in reps)
    conservation = max(r["conservation_error"] for r in reps)
    total_errors = [r["accuracy"]["total_error"] for r in reps]
    pod_errors = [r["accuracy"]["pod_error_mean"] for r in reps]
    targets = {
        f"sample CPU <= {TARGET_CPU_SHARE:.0%} of a core at {interval:g} s": (
            sample_share <= TARGET_CPU_SHARE,
            f"{sample_share:.2%}",
        ),
        f"scrape wall p50 <= {TARGET_SCRAPE_MS:g} ms": (
            scrape_p50 <= TARGET_SCRAPE_MS,
            f"{scrape_p50:.1f} ms",
        ),
        f"/metrics bytes <= {TARGET_BYTES_X_KEPLER:g}x Kepler's {KEPLER_BYTES_500_PODS / 1e6:g} MB": (
            scrape_bytes <= TARGET_BYTES_X_KEPLER * KEPLER_BYTES_500_PODS,
            f"{scrape_bytes / 1e6:.2f} MB = {scrape_bytes / KEPLER_BYTES_500_PODS:.2f}x",
        ),
        f"RSS peak <= {TARGET_RSS_MIB:g} MiB": (rss <= TARGET_RSS_MIB, f"{rss:.1f} MiB"),
        "conservation exact (relative gap <= 1e-9)": (conservation <= 1e-9, f"{conservation:.1e}"),
        f"pods' total within {TARGET_TOTAL_ERROR:.1%} of the truth, every repetition": (
            all(abs(e) <= TARGET_TOTAL_ERROR for e in total_errors),
            ", ".join(f"{e:+.3%}" for e in total_errors),
        ),
        f"per-pod mean error <= {TARGET_POD_ERROR:.0%}, every repetition": (
            all(e <= TARGET_POD_ERROR for e in pod_errors),
            ", ".join(f"{e:.3%}" for e in pod_errors),
        ),
        "sample cheaper than the per-process scan": (
            med("sample (cpu)") < med("per-process (cpu)"),
            f"{med('sample (cpu)') / med('per-process (cpu)'):.2f}x",
        ),
    }
    return {
        "node": f"large spec: {NodeSpec.large().cpus} CPUs",
        "pods": pods,
        "containers": pods * containers,
        "processes": reps[0]["processes"],
        "interval": interval,
        "samples": samples,
        "repetitions": reps,
        "rss_peak_mib": rss,
        "real_cgroup_read": real_tree,
        "targets": {name: {"met": met, "value": value} for name, (met, value) in targets.items()},
        "target_met": all(met for met, _ in targets.values()),
    }


def print_result(result: dict[str, Any]) -> None:
    print(
        f"{result['node']}; {result['pods']} pods, {result['containers']} containers (+1 sandbox each), "
        f"{result['processes']} processes; a sample every {result['interval']:g} s, {result['samples']} "
        f"samples per repetition, counters moving throughout"
    )
    for i, rep in enumerate(result["repetitions"], 1):
        acc = rep["accuracy"]
        print(f"\nrepetition {i} (simulator: {rep['sim_steps_per_second']:.0f} counter updates per second)")
        print(f"{'figure':<18} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9}")
        for name, fig in rep["figures"].items():
            print(f"{name:<18} {fig['mean_ms']:>9.3f} {fig['p50_ms']:>9.3f} {fig['p99_ms']:>9.3f}")
        print(
            f"scrape: {rep['series_per_scrape']} series, {rep['scrape_bytes'] / 1e6:.2f} MB; "
            f"conservation gap {rep['conservation_error']:.1e}"
        )
        print(
            f"accuracy: pods' share of node energy {acc['pods_share']:.5f} "
            f"(truth {acc['pods_share_truth']:.5f}, {acc['total_error']:+.3%}); "
            f"per-pod error mean {acc['pod_error_mean']:.3%}, "
            f"max {acc['pod_error_max']:.3%}"
        )
    print(f"\nRSS peak of the sampling process: {result['rss_peak_mib']:.1f} MiB")
    real = result["real_cgroup_read"]
    if real is None:
        print("cgroup read on a real cgroup2 tree: not measured (no writable cgroup2 mount; needs root)\n")
    else:
        print(
            f"cgroup read on a real cgroup2 tree ({real['files']:.0f} kernfs files, each read once): "
            f"kept open {real['kept_ms']:.2f} ms, opened per read {real['open_ms']:.2f} ms "
            f"({real['open_ms'] / real['kept_ms']:.1f}x)\n"
        )
    for name, target in result["targets"].items():
        print(f"{'met   ' if target['met'] else 'MISSED'} {name}: {target['value']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--containers", type=int, default=2, help="containers per pod (plus its sandbox)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--samples", type=int, default=30, help="samples per repetition")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--procs", type=int, default=5, help="processes per container, for the per-process scan"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    result = run(args.pods, args.containers, args.procs, args.samples, args.interval, args.repeats)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_result(result)
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
