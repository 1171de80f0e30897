"""The CPU-time reader on a real cgroup v2 tree (this machine's kernel, not a simulated one): it keeps the
usage files open and reads them again with pread at offset 0, which the kernel answers with fresh figures,
and a removed cgroup's kept file (ENODEV) drops that container. Needs root and a cgroup2 mount."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmd_agent.hostfs import HostFS
from rmd_agent.power.cpu_time import CgroupCpuReader


def cgroup2_mounts() -> list[str]:
    with open("/proc/self/mountinfo") as info:
        fields = [line.split(" - ") for line in info]
    return [left.split()[4] for left, right in fields if right.split()[0] == "cgroup2"]


def _remove(top: Path) -> None:
    for directory, _subdirs, _files in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
        os.rmdir(directory)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[HostFS, Path]]:
    """A host root whose sys/fs/cgroup is a fresh directory on a real cgroup2 mount."""
    top = None
    for mount in cgroup2_mounts():
        candidate = Path(mount) / f"rmd-test-{uuid.uuid4().hex[:8]}"
        try:
            candidate.mkdir()
        except OSError:
            continue
        top = candidate
        break
    if top is None:
        pytest.skip("no writable cgroup2 mount (needs root)")
    (tmp_path / "sys/fs").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup").symlink_to(top)
    try:
        yield HostFS(tmp_path), top
    finally:
        _remove(top)


def test_kept_usage_files_follow_a_busy_container_and_its_removal(host: tuple[HostFS, Path]) -> None:
    fs, top = host
    uid = str(uuid.uuid4())
    pod_dir = top / "kubepods.slice" / f"kubepods-pod{uid.replace('-', '_')}.slice"
    busy_dir, idle_dir = (pod_dir / f"cri-containerd-{c * 64}.scope" for c in "ab")
    busy_dir.mkdir(parents=True)
    idle_dir.mkdir()
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        (busy_dir / "cgroup.procs").write_text(f"{burner.pid}\n")
        reader = CgroupCpuReader(fs)
        first = reader.read().pods[uid]
        listings_before = reader.listings
        time.sleep(0.3)
        second = reader.read().pods[uid]
        assert reader.listings == listings_before  # nothing listed again
        assert len(reader.files) == 3  # the pod's file and both containers', kept open
        grew = second.containers["a" * 64][1] - first.containers["a" * 64][1]
        assert grew > 50_000_000  # 50 ms of the 300 ms the burner had
        # the pod's file is read just before its containers': it may lag the busy one by that moment
        assert second.usage_ns - first.usage_ns >= grew - 50_000_000
    finally:
        burner.kill()
        burner.wait()
    deadline = time.monotonic() + 5
    while (busy_dir / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)  # the killed process leaves its cgroup once reaped
    busy_dir.rmdir()
    third = reader.read().pods[uid]
    assert set(third.containers) == {"b" * 64}  # ENODEV on the kept file: listed again, gone
    assert len(reader.files) == 2
