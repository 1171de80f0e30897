"""cgroup version and the kubelet's cgroup driver, as far as the cgroup tree shows them."""

from __future__ import annotations

from dataclasses import dataclass

from rmd_agent.errors import Unsupported
from rmd_agent.hostfs import HostFS

CGROUP = "sys/fs/cgroup"


@dataclass(frozen=True)
class CgroupInfo:
    version: int  # 1 or 2 (a hybrid v1 + unified mount counts as 1: kubelet uses the v1 controllers)
    driver: (
        str | Unsupported
    )  # "systemd" (kubepods.slice) or "cgroupfs" (kubepods), from the pods' parent cgroup
    pods_root: str | None  # path of the kubepods cgroup relative to the host root, when present


def read_cgroups(fs: HostFS) -> CgroupInfo | Unsupported:
    if fs.exists(f"{CGROUP}/cgroup.controllers"):
        version, bases = 2, [CGROUP]
    elif fs.is_dir(f"{CGROUP}/cpu,cpuacct") or fs.is_dir(f"{CGROUP}/cpu") or fs.is_dir(f"{CGROUP}/cpuset"):
        version = 1
        bases = [
            f"{CGROUP}/{c}" for c in ("cpu,cpuacct", "cpu", "cpuacct", "cpuset") if fs.is_dir(f"{CGROUP}/{c}")
        ]
    else:
        return Unsupported(f"no cgroup filesystem at /{CGROUP}")
    for base in bases:
        if fs.is_dir(f"{base}/kubepods.slice"):
            return CgroupInfo(version, "systemd", f"{base}/kubepods.slice")
        if fs.is_dir(f"{base}/kubepods"):
            return CgroupInfo(version, "cgroupfs", f"{base}/kubepods")
    return CgroupInfo(version, Unsupported("no kubepods cgroup (no kubelet on this node)"), None)
