"""`python -m rmd_sim demo`: the newcomer's first look, for now on one simulated node.

It writes a simulated node, starts its simulated kubelet, admits a Guaranteed pod the way the static CPU
manager would, and shows what the agent's probe sees there next to what it sees on this machine. The full
demo (control plane, operator, three agents, the sample workloads) replaces this as those parts land.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rmd_agent.probe import format_table, probe_async
from rmd_agent.settings import AgentSettings
from rmd_api.cpuset import format_cpu_list
from rmd_sim.hosttree import summary, write_host_tree
from rmd_sim.kubelet import ContainerSpec, SimKubelet
from rmd_sim.spec import load_spec

NODE = "worker-node-1"


async def _demo(root: Path, spec_name: str) -> None:
    spec = load_spec(spec_name)
    write_host_tree(spec, root)
    print(f"simulated node {NODE}: {summary(spec)}\n  host tree: {root}\n")
    async with SimKubelet.from_host_tree(root) as kubelet:
        pod = kubelet.add_pod(
            "default",
            "pod-guaranteed-cache",
            "11111111-2222-3333-4444-555555555555",
            [ContainerSpec("app", "2", "2", "1Gi", "1Gi", {"intel.com/l3_cache_ways": 2})],
        )
        cpus = kubelet.assignments()[(pod.uid, "app")]
        print(f"simulated kubelet admitted default/{pod.name}: container app on CPUs {format_cpu_list(cpus)}")
        print(f"  shared pool now {format_cpu_list(kubelet.shared_pool())}\n")
        print(format_table(await probe_async(AgentSettings(host_root=root, node_name=NODE))))
    print()
    print(format_table(await probe_async(AgentSettings(node_name="this machine"))))
    print("\nnext: python -m rmd_sim node --out DIR; rmd-agent probe --host-root DIR --json; see README.md")


def _run(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="rmd-demo-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        asyncio.run(_demo(root, args.spec))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def add_demo(sub: Any) -> None:
    p = sub.add_parser("demo", help="show a simulated node as the agent sees it")
    p.add_argument("--spec", default="default", help="default, large, or a YAML/JSON file of overrides")
    p.add_argument("--keep", action="store_true", help="keep the simulated host tree afterwards")
    p.set_defaults(run=_run)
