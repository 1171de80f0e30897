"""The simulated hardware beside a real kubelet: a host tree shaped like this machine, plus what it lacks.

The real kubelet's CPU manager, device manager and PodResources speak of this machine's CPUs and NUMA nodes,
so the tree the agent reads must have the same ones: `spec_for_this_machine` copies the CPU topology, NUMA
node count, memory and cgroup layout from the real /sys and adds the simulated RDT (L3 CAT, MBA, served by
FUSE), RAPL and cpufreq. `SimulatedHost` writes that tree and serves its resctrl; the chart mounts the tree's
sys/ and proc/ into the agent pod (agent.hostPaths.simulatedHost, test only).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Self

from rmd_sim.hosttree import write_host_tree
from rmd_sim.resctrl_fuse import ResctrlMount
from rmd_sim.spec import NodeSpec

_SYS = Path("/sys/devices/system")


def _count(pattern: str) -> int:
    return len(list(_SYS.glob(pattern)))


def _memory_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def spec_for_this_machine(base: NodeSpec | None = None) -> NodeSpec:
    """`base` (the default spec) with this machine's CPU topology, NUMA nodes, memory and cgroup layout."""
    cpus = os.cpu_count() or 1
    sockets = len({(_SYS / f"cpu/cpu{c}/topology/physical_package_id").read_text() for c in range(cpus)})
    siblings = (_SYS / "cpu/cpu0/topology/thread_siblings_list").read_text().strip()
    threads = len(siblings.replace("-", ",").split(","))
    numa = max(1, _count("node/node[0-9]*"))
    cgroup_v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    return replace(
        base or NodeSpec.default(),
        name="this-machine",
        sockets=sockets,
        cores_per_socket=cpus // sockets // threads,
        threads_per_core=threads,
        numa_nodes=numa,
        memory_per_numa_bytes=_memory_bytes() // numa,
        hugepages_2m_per_numa=0,
        hugepages_1g_per_numa=0,
        cgroup_version=2 if cgroup_v2 else 1,
        cgroup_driver="cgroupfs",
        reserved_cpus="0",
    )


class SimulatedHost:
    """A host tree for this machine under `root`, its resctrl served by FUSE until `stop()`."""

    def __init__(self, root: Path, spec: NodeSpec | None = None) -> None:
        self.root = Path(root)
        self.spec = spec or spec_for_this_machine()
        self.resctrl: ResctrlMount | None = None

    def start(self) -> Self:
        write_host_tree(self.spec, self.root, replace=True)
        self.resctrl = ResctrlMount(self.root)
        self.resctrl.start()
        return self

    def stop(self) -> None:
        if self.resctrl is not None:
            self.resctrl.stop()
            self.resctrl = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
