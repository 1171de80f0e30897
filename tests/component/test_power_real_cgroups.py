"""The CPU-time reader on a real cgroup v2 tree (this machine's kernel, not a simulated one): it keeps the
usage files open and reads them again with pread at offset 0, which the kernel answers with fresh figures,
and a removed cgroup's kept file (ENODEV) drops that container. Needs root and a cgroup2 mount."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmd_agent.power import cpu_time
from rmd_agent.power.cpu_time import CgroupCpuReader
from rmd_sim.real_cgroups import RealCgroupTree


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[RealCgroupTree]:
    made = RealCgroupTree.create(tmp_path)
    if made is None:
        pytest.skip("no writable cgroup2 mount (needs root)")
    try:
        yield made
    finally:
        made.remove()


def test_kept_usage_files_follow_a_busy_container_and_its_removal(tree: RealCgroupTree) -> None:
    uid, _pod_dir, (busy_dir, idle_dir) = tree.add_pod(0, containers=1)
    busy, idle = (d.name.removeprefix("cri-containerd-").removesuffix(".scope") for d in (busy_dir, idle_dir))
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        (busy_dir / "cgroup.procs").write_text(f"{burner.pid}\n")
        reader = CgroupCpuReader(tree.fs)
        first = reader.read().pods[uid]
        listings_before = reader.listings
        time.sleep(0.3)
        second = reader.read().pods[uid]
        assert reader.listings == listings_before  # nothing listed again
        assert len(reader.files) == 3  # the pod's file and both containers', kept open
        grew = second.containers[busy][1] - first.containers[busy][1]
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
    assert set(third.containers) == {idle}  # ENODEV on the kept file: listed again, gone
    assert len(reader.files) == 2


def test_pods_made_and_removed_on_cgroupfs_are_seen_without_listing_every_read(
    tree: RealCgroupTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader lists the directories holding the pods only when their link count moves: on cgroupfs, as
    on tmpfs, a directory's link count is 2 + its subdirectories (its modification time does not move)."""
    first, _pod_dir, _dirs = tree.add_pod(0, containers=1)
    reader = CgroupCpuReader(tree.fs)
    assert set(reader.read().pods) == {first}
    listed: list[str] = []
    real = cpu_time._subdirs
    monkeypatch.setattr(cpu_time, "_subdirs", lambda path: listed.append(path) or real(path))
    reader.read()
    assert listed == []
    second, second_dir, second_dirs = tree.add_pod(1, containers=1)
    assert set(reader.read().pods) == {first, second}
    for directory in (*second_dirs, second_dir):
        directory.rmdir()
    assert set(reader.read().pods) == {first}
    listed.clear()
    reader.read()
    assert listed == []


def test_a_pod_replaced_between_two_reads_is_seen_one_read_later(tree: RealCgroupTree) -> None:
    """One pod removed and another made between two reads leave the link count as it was; the removed pod's
    kept file fails (ENODEV on cgroupfs), so the next read lists the directories and finds the new pod."""
    first, first_dir, first_dirs = tree.add_pod(0, containers=1)
    reader = CgroupCpuReader(tree.fs)
    assert set(reader.read().pods) == {first}
    for directory in (*first_dirs, first_dir):
        directory.rmdir()
    second, _dir, _dirs = tree.add_pod(3, containers=1)  # the same QoS directory as the first
    assert set(reader.read().pods) == set()
    assert set(reader.read().pods) == {second}
