"""NUMA nodes: their CPUs, memory, hugepages and distances (sys/devices/system/node)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rmd_agent.errors import HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_api.cpuset import CpuListError, parse_cpu_list

NODE_DIR = "sys/devices/system/node"
_NODE_NAME = re.compile(r"node(\d+)$")
_HUGEPAGE_DIR = re.compile(r"hugepages-(\d+)kB$")
_MEMINFO_LINE = re.compile(r"Node\s+\d+\s+(\w+):\s+(\d+)(\s*kB)?")


@dataclass(frozen=True)
class Hugepages:
    size_kb: int
    total: int
    free: int

    @property
    def resource_name(self) -> str:
        """The Kubernetes resource name, e.g. hugepages-2Mi or hugepages-1Gi."""
        if self.size_kb % (1024 * 1024) == 0:
            return f"hugepages-{self.size_kb // (1024 * 1024)}Gi"
        if self.size_kb % 1024 == 0:
            return f"hugepages-{self.size_kb // 1024}Mi"
        return f"hugepages-{self.size_kb}Ki"


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: frozenset[int]
    memory_total_bytes: int
    memory_free_bytes: int
    hugepages: tuple[Hugepages, ...]
    distances: dict[int, int]  # other node id -> distance (10 = local), from the node's distance row


def _meminfo(text: str) -> dict[str, int]:
    """`Node 0 MemTotal:  32768000 kB` lines -> {"MemTotal": bytes}; counts without a unit stay counts."""
    values = {}
    for line in text.splitlines():
        match = _MEMINFO_LINE.match(line.strip())
        if match:
            key, number, unit = match.groups()
            values[key] = int(number) * (1024 if unit else 1)
    return values


def _hugepages(fs: HostFS, node_dir: str) -> tuple[Hugepages, ...]:
    if not fs.is_dir(f"{node_dir}/hugepages"):
        return ()
    pages = []
    for entry in fs.listdir(f"{node_dir}/hugepages"):
        match = _HUGEPAGE_DIR.match(entry)
        if match:
            base = f"{node_dir}/hugepages/{entry}"
            pages.append(
                Hugepages(
                    int(match.group(1)),
                    fs.read_int(f"{base}/nr_hugepages"),
                    fs.read_int(f"{base}/free_hugepages"),
                )
            )
    return tuple(sorted(pages, key=lambda p: p.size_kb))


def read_numa_nodes(fs: HostFS) -> list[NumaNode] | Unsupported:
    """Every NUMA node, sorted by id. A machine without NUMA in sysfs reads as unsupported."""
    try:
        ids = sorted(int(m.group(1)) for e in fs.listdir(NODE_DIR) if (m := _NODE_NAME.match(e)))
    except HostReadError as exc:
        return Unsupported(f"no NUMA information: {exc}")
    if not ids:
        return Unsupported(f"no NUMA information: {NODE_DIR} has no nodeN entries")
    nodes = []
    try:
        for node in ids:
            base = f"{NODE_DIR}/node{node}"
            mem = _meminfo(fs.read_text(f"{base}/meminfo"))
            if "MemTotal" not in mem:
                raise HostReadError(f"{base}/meminfo", "no MemTotal line")
            row = [int(x) for x in fs.read_str(f"{base}/distance").split()]
            nodes.append(
                NumaNode(
                    id=node,
                    cpus=parse_cpu_list(fs.read_text(f"{base}/cpulist")),
                    memory_total_bytes=mem["MemTotal"],
                    memory_free_bytes=mem.get("MemFree", 0),
                    hugepages=_hugepages(fs, base),
                    distances=dict(zip(ids, row, strict=False)),
                )
            )
    except (HostReadError, CpuListError, ValueError) as exc:
        return Unsupported(f"cannot read NUMA node: {exc}")
    return nodes
