"""Real cgroups on this machine's kernel, shaped as the kubelet makes them, for tests and benchmarks of the
agent's CPU-time reader against true kernfs files (the simulated host tree is tmpfs). Needs root and a
cgroup2 mount; `RealCgroupTree` is None-safe to probe: `RealCgroupTree.create()` returns None without one."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from rmd_agent.hostfs import HostFS

_QOS_SLICES = ("", "kubepods-burstable.slice", "kubepods-besteffort.slice")


def cgroup2_mounts() -> list[str]:
    with open("/proc/self/mountinfo") as info:
        lines = [line.split(" - ") for line in info]
    return [left.split()[4] for left, right in lines if right.split()[0] == "cgroup2"]


class RealCgroupTree:
    """A fresh directory on a cgroup2 mount, seen by a host root's sys/fs/cgroup (a symlink to it)."""

    def __init__(self, top: Path, host_root: Path) -> None:
        self.top = top
        self.host_root = host_root
        (host_root / "sys/fs").mkdir(parents=True, exist_ok=True)
        (host_root / "sys/fs/cgroup").symlink_to(top)
        self.fs = HostFS(host_root)

    @classmethod
    def create(cls, host_root: Path) -> RealCgroupTree | None:
        for mount in cgroup2_mounts():
            top = Path(mount) / f"rmd-test-{uuid.uuid4().hex[:8]}"
            try:
                top.mkdir()
            except OSError:
                continue
            return cls(top, host_root)
        return None

    def add_pod(self, index: int, containers: int) -> tuple[str, Path, list[Path]]:
        """A pod cgroup (systemd driver; QoS class by index) with `containers` container cgroups and a
        sandbox: (uid, pod directory, container directories, sandbox last)."""
        uid = str(uuid.UUID(int=index + 1, version=4))
        qos = _QOS_SLICES[index % 3]
        parent = self.top / "kubepods.slice" / qos if qos else self.top / "kubepods.slice"
        prefix = f"{qos.removesuffix('.slice')}-pod" if qos else "kubepods-pod"
        pod_dir = parent / f"{prefix}{uid.replace('-', '_')}.slice"
        dirs = [
            pod_dir / f"cri-containerd-{uuid.uuid4().hex}{uuid.uuid4().hex}.scope"
            for _ in range(containers + 1)
        ]
        for directory in dirs:
            directory.mkdir(parents=True)
        return uid, pod_dir, dirs

    def remove(self) -> None:
        """Remove every cgroup made (their processes must have left) and the host root's link."""
        for directory, _subdirs, _files in sorted(os.walk(self.top), key=lambda entry: -len(entry[0])):
            os.rmdir(directory)
        (self.host_root / "sys/fs/cgroup").unlink()
