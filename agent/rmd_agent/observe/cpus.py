"""Online CPUs and their place in the package/core/thread topology (sys/devices/system/cpu)."""

from __future__ import annotations

from dataclasses import dataclass

from rmd_agent.errors import HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_api.cpuset import CpuListError, parse_cpu_list

CPU_DIR = "sys/devices/system/cpu"


@dataclass(frozen=True)
class Cpu:
    id: int
    package_id: int
    core_id: int
    thread_siblings: frozenset[int]


def read_online_cpus(fs: HostFS) -> frozenset[int] | Unsupported:
    try:
        return parse_cpu_list(fs.read_text(f"{CPU_DIR}/online"))
    except (HostReadError, CpuListError) as exc:
        return Unsupported(f"cannot list online CPUs: {exc}")


def read_cpus(fs: HostFS) -> list[Cpu] | Unsupported:
    """Every online CPU with its package, core and hyperthread siblings, sorted by id."""
    online = read_online_cpus(fs)
    if isinstance(online, Unsupported):
        return online
    cpus = []
    try:
        for cpu in sorted(online):
            topo = f"{CPU_DIR}/cpu{cpu}/topology"
            cpus.append(
                Cpu(
                    id=cpu,
                    package_id=fs.read_int(f"{topo}/physical_package_id"),
                    core_id=fs.read_int(f"{topo}/core_id"),
                    thread_siblings=parse_cpu_list(fs.read_text(f"{topo}/thread_siblings_list")),
                )
            )
    except (HostReadError, CpuListError) as exc:
        return Unsupported(f"cannot read CPU topology: {exc}")
    return cpus
