"""Benchmark: plan + apply of 100 workloads on the `large` simulated node, and the agent's RSS with them.

The parent process writes a `large` node tree (256 CPUs, 2 L3 domains of 15 ways, 16 CLOSIDs, MBA) in memory
and serves its resctrl through the FUSE simulator (rmd_sim.resctrl_fuse), so every kernel operation is a
real syscall answered with kernel behaviour. A child process runs the engine alone (no gRPC server) and
measures, in this order:

    plan only   plan_layout + diff of the registry after each of the 100 additions, with no I/O: the
                baseline, the pure planning the engine does anyway
    apply       NodeEngine.apply of the 100 workloads one after another: observe resctrl, plan, save the
                state file (fsync), write resctrl, save again
    again       the 100 applied a second time, unchanged (the operator's steady state: no write at all)
    observe     read_resctrl of the final tree (11 groups), 100 times: the read every change starts with
    restart     a new engine's start() over the same state and mount: reconcile and adopt all 100
    RSS         VmRSS of the child before the engine starts and with the 100 workloads applied

Workloads: 6 guaranteed (2 ways + 50 % MBA), 4 best effort (max 3, min 1), 90 shared-pool; 2 CPUs each.
That uses 11 of the 15 CLOSIDs a 16-CLOSID CPU leaves (one group per guaranteed or best-effort workload, one
shared group). P-state monitoring is left out: its cost is a sampling loop per workload, not apply.

    python bench/engine_apply.py [--json]

The ratio apply / plan-only, measured in the same run, is the figure to compare across machines. The issue
states no numeric target for this benchmark; the agent-wide RSS target (60 MiB idle) is shown for reference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rmd_agent.engine import NodeEngine, read_node_facts
from rmd_agent.errors import Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.observe.resctrl import read_resctrl
from rmd_agent.plan.inventory import NodeInventory
from rmd_agent.plan.policy import PolicyBook
from rmd_agent.plan.resctrl_layout import diff, plan_layout
from rmd_agent.plan.workload import Workload
from rmd_agent.settings import AgentSettings

# The simulator is imported only in the parent (run): this file is also the child's program (--child), and
# the child's memory is measured.

WORKLOADS = 100
REFERENCE_RSS_MIB = 60.0


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _workloads(cpus_by_socket: list[list[int]]) -> list[Any]:
    free = [list(cpus) for cpus in cpus_by_socket]
    out = []
    for i in range(WORKLOADS):
        socket = i % 2
        cpus = [free[socket].pop(), free[socket].pop()]
        if i < 6:
            ask: dict[str, Any] = {"cache_max": 2, "cache_min": 2, "mba_percentage": 50}
        elif i < 10:
            ask = {"cache_max": 3, "cache_min": 1}
        else:
            ask = {"cache_max": 0, "cache_min": 0}
        out.append(Workload("bench", f"w{i:03d}", core_ids=frozenset(cpus), **ask))
    return out


def _child(host: str) -> dict[str, Any]:
    """Runs in the child process: the measurements, as a JSON-able dict."""
    settings = AgentSettings(
        host_root=Path(host), node_name="bench", log_level="warning", pstate_counters="files"
    )
    fs = HostFS(host)
    facts = read_node_facts(fs)
    resctrl = read_resctrl(fs)
    assert not isinstance(resctrl, Unsupported), resctrl
    inventory = NodeInventory.from_observed(
        facts.cpus, facts.caches, resctrl, policies=PolicyBook().for_platform(facts.platform)
    )
    by_socket = [sorted(c.cpus) for c in facts.caches]
    workloads = _workloads(by_socket)

    started = time.perf_counter()
    for i in range(1, WORKLOADS + 1):
        layout = plan_layout(inventory, workloads[:i], resctrl)
        diff(resctrl, layout)
    plan_s = time.perf_counter() - started
    assert not layout.rejected, layout.rejected

    rss_before = _rss_mib()

    async def run() -> dict[str, Any]:
        engine = NodeEngine(settings)
        await engine.start()
        each = []
        started = time.perf_counter()
        for w in workloads:
            t = time.perf_counter()
            _, changed = await engine.apply(w)
            each.append(time.perf_counter() - t)
            assert changed
        apply_s = time.perf_counter() - started
        writes, saves = engine.applier.writes, engine.store.saves
        started = time.perf_counter()
        for w in workloads:
            _, changed = await engine.apply(w)
            assert not changed
        again_s = time.perf_counter() - started
        assert engine.applier.writes == writes and engine.store.saves == saves
        started = time.perf_counter()
        for _ in workloads:
            assert not isinstance(read_resctrl(fs), Unsupported)
        observe_s = time.perf_counter() - started
        rss_loaded = _rss_mib()
        listed = await engine.list()
        assert len(listed) == WORKLOADS and all(a.status == "Successful" for a in listed)
        await engine.close()
        restarted = NodeEngine(settings)
        started = time.perf_counter()
        await restarted.start()
        restart_s = time.perf_counter() - started
        assert restarted.applier.writes == 0 and len(await restarted.list()) == WORKLOADS
        await restarted.close()
        each.sort()
        return {
            "apply_s": apply_s,
            "apply_p50_ms": statistics.median(each) * 1000,
            "apply_p99_ms": each[int(len(each) * 0.99) - 1] * 1000,
            "apply_max_ms": each[-1] * 1000,
            "again_s": again_s,
            "observe_s": observe_s,
            "restart_s": restart_s,
            "kernel_ops": writes,
            "state_saves": saves,
            "rss_loaded_mib": rss_loaded,
        }

    result = asyncio.run(run())
    return {"workloads": WORKLOADS, "plan_s": plan_s, "rss_before_mib": rss_before, **result}


def run() -> dict[str, Any]:
    from rmd_sim.hosttree import write_host_tree  # noqa: PLC0415  # not in the child
    from rmd_sim.resctrl import check_resctrl_tree  # noqa: PLC0415
    from rmd_sim.resctrl_fuse import ResctrlMount  # noqa: PLC0415
    from rmd_sim.spec import NodeSpec  # noqa: PLC0415

    parent = "/dev/shm" if Path("/dev/shm").is_dir() else None
    work = Path(tempfile.mkdtemp(prefix="rmd-bench-", dir=parent))
    try:
        host = work / "host"
        write_host_tree(NodeSpec.large(), host)
        with ResctrlMount(host) as mount:
            done = subprocess.run(
                [sys.executable, __file__, "--child", str(host)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise SystemExit(f"benchmark child failed:\n{done.stderr}")
            result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
            result["tree_problems"] = check_resctrl_tree(mount.backing_root)
            result["groups"] = len(mount.sim.groups())
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _report(r: dict[str, Any]) -> bool:
    n = r["workloads"]
    print(
        f"large node, {n} workloads, {r['groups']} resctrl groups, {r['kernel_ops']} kernel operations, "
        f"{r['state_saves']} state saves"
    )
    print(f"{'figure':<12} {'total s':>9} {'per workload ms':>16} {'vs plan only':>13}")
    rows = [
        ("plan only", r["plan_s"]),
        ("apply", r["apply_s"]),
        ("again", r["again_s"]),
        ("observe", r["observe_s"]),
    ]
    for name, seconds in rows:
        print(f"{name:<12} {seconds:>9.3f} {seconds / n * 1000:>16.2f} {seconds / r['plan_s']:>13.2f}")
    print(f"{'restart':<12} {r['restart_s']:>9.3f} {'(adopts all ' + str(n) + ')':>16}")
    latency = (
        f"p50 {r['apply_p50_ms']:.2f} ms, p99 {r['apply_p99_ms']:.2f} ms, max {r['apply_max_ms']:.2f} ms"
    )
    print(f"apply latency: {latency}")
    rss = f"{r['rss_before_mib']:.1f} MiB before start, {r['rss_loaded_mib']:.1f} MiB with {n} workloads"
    print(f"engine RSS: {rss}")
    ok_tree = not r["tree_problems"]
    print(f"resctrl tree after the run obeys the kernel's rules: {'yes' if ok_tree else r['tree_problems']}")
    print(
        f"reference: agent RSS idle <= {REFERENCE_RSS_MIB:g} MiB (issue): "
        f"{'within' if r['rss_loaded_mib'] <= REFERENCE_RSS_MIB else 'ABOVE'} even with {n} workloads"
    )
    return ok_tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--child", metavar="HOST_ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child)))
        return 0
    result = run()
    if args.json:
        print(json.dumps(result, indent=2))
        return 1 if result["tree_problems"] else 0
    return 0 if _report(result) else 1


if __name__ == "__main__":
    sys.exit(main())
