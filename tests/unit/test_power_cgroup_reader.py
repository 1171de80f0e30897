"""The cgroup CPU reader lists pod directories only when something may have changed (issue #14: at 500
pods, listing every pod directory on every sample was a large part of a sample's cost), and still sees
every pod at once and every container: restarted ones at once, new busy ones at once, new idle ones within
RELIST_EVERY reads."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from rmd_agent.hostfs import HostFS
from rmd_agent.power import cpu_time
from rmd_agent.power.cpu_time import RELIST_EVERY, CgroupCpuReader
from rmd_sim.hosttree import write_host_tree
from rmd_sim.load import SimContainer, SimLoad, SimLoadPod
from rmd_sim.spec import NodeSpec


@pytest.fixture
def node(tmp_path: Path) -> tuple[SimLoad, list[SimLoadPod]]:
    write_host_tree(NodeSpec(cores_per_socket=4), tmp_path)
    load = SimLoad(tmp_path)
    qos = ("guaranteed", "burstable", "besteffort")
    pods = [
        load.add_pod("ns", f"p{i}", str(uuid.uuid4()), {"app": 0.5, "side": 0.1}, qos=qos[i % 3])
        for i in range(6)
    ]
    load.advance(1.0)
    return load, pods


def listed_dirs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = cpu_time._subdirs

    def counting(path: str) -> list[str]:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(cpu_time, "_subdirs", counting)
    return calls


def read_then_count_listings(
    load: SimLoad, monkeypatch: pytest.MonkeyPatch
) -> tuple[CgroupCpuReader, list[str]]:
    """A reader that has read once, and the directories it lists from now on."""
    reader = CgroupCpuReader(HostFS(load.root))
    reader.read()
    return reader, listed_dirs(monkeypatch)


def test_steady_reads_list_no_pod_directory(
    node: tuple[SimLoad, list[SimLoadPod]], monkeypatch: pytest.MonkeyPatch
) -> None:
    load, pods = node
    reader, calls = read_then_count_listings(load, monkeypatch)
    for _ in range(5):
        load.advance(1.0)
        reading = reader.read()
        assert len(reading.pods) == len(pods)
    assert calls == []  # neither a pod directory nor the QoS directories holding them
    for pod in pods:
        usage = {cid: ns for cid, (_runtime, ns) in reading.pods[pod.uid].containers.items()}
        assert usage == {c.id: int(c.usage_ns // 1000) * 1000 for c in pod.containers.values()}


def test_new_and_removed_pods_are_seen_at_the_next_read(
    node: tuple[SimLoad, list[SimLoadPod]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The QoS directories are listed again only when their link count (2 + subdirectories) moves. (The
    simulator's tmpfs keeps a removed file readable through a kept descriptor, so here the removal is seen
    by the link count alone; cgroupfs also fails the read: tests/component/test_power_real_cgroups.py.)"""
    load, pods = node
    reader, calls = read_then_count_listings(load, monkeypatch)
    new = load.add_pod("ns", "new", str(uuid.uuid4()), {"app": 0.5}, qos="besteffort")
    load.advance(1.0)
    assert new.uid in reader.read().pods
    assert calls  # listed for it
    calls.clear()
    load.remove_pod(pods[1].uid)
    load.advance(1.0)
    assert set(reader.read().pods) == {p.uid for p in pods if p is not pods[1]} | {new.uid}
    load.advance(1.0)
    reader.read()
    calls.clear()
    load.advance(1.0)
    reader.read()
    assert calls == []


def test_restarted_and_new_containers_are_seen(node: tuple[SimLoad, list[SimLoadPod]]) -> None:
    load, pods = node
    reader = CgroupCpuReader(HostFS(load.root))
    reader.read()
    new_id = load.restart_container(pods[0].uid, "app")  # old cgroup gone, new one busy
    load.advance(1.0)
    assert new_id in reader.read().pods[pods[0].uid].containers
    # a container that appears and burns CPU: seen in the same read
    busy = "f" * 64
    (load.root / load.cgroup_base / pods[1].rel_dir / f"cri-containerd-{busy}.scope").mkdir()
    pods[1].containers["late"] = SimContainer("late", busy, 0.5)
    load.advance(1.0)
    assert busy in reader.read().pods[pods[1].uid].containers
    # a container that appears and stays idle: seen within RELIST_EVERY reads
    idle = "e" * 64
    (load.root / load.cgroup_base / pods[2].rel_dir / f"cri-containerd-{idle}.scope").mkdir()
    pods[2].containers["idle"] = SimContainer("idle", idle, 0.0)
    load.advance(1.0)
    seen = [idle in reader.read().pods[pods[2].uid].containers for _ in range(RELIST_EVERY)]
    assert seen[-1]


def test_steady_reads_open_no_file(
    node: tuple[SimLoad, list[SimLoadPod]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Usage files stay open between reads (pread at offset 0 sees the kernel's new text): a steady read
    opens nothing, and still sees the counters move."""
    load, pods = node
    reader = CgroupCpuReader(HostFS(load.root))
    first = reader.read()
    opened: list[str] = []
    real_open = cpu_time.os.open

    def counting(path: str, flags: int, *args: int, **kwargs: int) -> int:
        if flags & os.O_ACCMODE == os.O_RDONLY:  # the simulator's writes are not the reader's
            opened.append(path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(cpu_time.os, "open", counting)
    load.advance(1.0)
    second = reader.read()
    assert opened == []
    assert len(reader.files) == len(pods) * 4  # each pod: its own file, two containers, the sandbox
    assert all(second.pods[p.uid].usage_ns > first.pods[p.uid].usage_ns for p in pods)


def test_kept_files_are_read_again_in_place_respect_the_budget_and_close_when_forgotten(
    tmp_path: Path,
) -> None:
    paths = [tmp_path / name for name in ("a", "b", "c")]
    for path in paths:
        path.write_text("1\n")
    files = cpu_time.KeptFiles(budget=2)
    assert [files.read(str(p)) for p in paths] == [b"1\n"] * 3  # the third is read, not kept
    assert len(files) == 2
    paths[0].write_text("22\n")  # in place, as the kernel's files change
    assert files.read(str(paths[0])) == b"22\n"
    files.forget([str(paths[1]), str(paths[2])])  # c was never kept
    assert len(files) == 1
    paths[0].unlink()
    files.close()
    assert len(files) == 0
    with pytest.raises(FileNotFoundError):
        files.read(str(paths[0]))


def test_the_files_of_a_pod_that_is_gone_are_closed(node: tuple[SimLoad, list[SimLoadPod]]) -> None:
    load, pods = node
    reader = CgroupCpuReader(HostFS(load.root))
    reader.read()
    assert len(reader.files) == len(pods) * 4
    load.remove_pod(pods[0].uid)
    load.advance(1.0)
    reader.read()
    assert len(reader.files) == (len(pods) - 1) * 4


def idle_pod_reader(load: SimLoad, idle: SimLoadPod) -> tuple[CgroupCpuReader, list[str]]:
    """`idle` made idle, a reader that has read twice, and the paths it reads from now on."""
    for name in idle.containers:
        load.set_rate(idle.uid, name, 0.0)
    load.advance(1.0)
    reader = CgroupCpuReader(HostFS(load.root))
    reader.read()
    reader.read()
    read_paths: list[str] = []
    real_read = reader.files.read

    def counting(path: str) -> bytes:
        read_paths.append(path)
        return real_read(path)

    reader.files.read = counting  # type: ignore[method-assign]
    return reader, read_paths


def test_an_idle_pods_containers_are_not_read(node: tuple[SimLoad, list[SimLoadPod]]) -> None:
    """A pod whose CPU time has not moved since the last read is idle, and so are its containers (the pod's
    CPU time counts theirs): their files are not read again, and stay open for when the pod runs again."""
    load, pods = node
    idle = pods[0]
    reader, read_paths = idle_pod_reader(load, idle)
    load.advance(1.0)
    reading = reader.read()
    idle_dir = str(load.root / load.cgroup_base / idle.rel_dir)
    assert [p for p in read_paths if p.startswith(idle_dir)] == [f"{idle_dir}/cpu.stat"]  # the pod's only
    assert reading.pods[idle.uid].containers.keys() == {c.id for c in idle.containers.values()}
    assert len(reader.files) == len(pods) * 4  # the idle pod's files stay open
    load.set_rate(idle.uid, "app", 0.5)
    load.advance(1.0)
    before = reading.pods[idle.uid].containers[idle.containers["app"].id][1]
    assert reader.read().pods[idle.uid].containers[idle.containers["app"].id][1] > before


def test_a_busy_unread_container_does_not_list_its_pod_every_read(
    node: tuple[SimLoad, list[SimLoadPod]],
) -> None:
    """A container left unread (no name yet) that uses CPU looks like a new container to the check for
    unexplained CPU time: one listing finds nothing new, and the pod is not listed again for it."""
    load, pods = node
    reader = CgroupCpuReader(HostFS(load.root))
    reader.skip = frozenset({pods[0].containers["app"].id})  # 0.5 CPU, unread
    reader.read()
    listings = reader.listings
    for _ in range(5):
        load.advance(1.0)
        reader.read()
    assert reader.listings - listings <= 1


def test_the_idle_shortcut_survives_other_pods_skip_changes(node: tuple[SimLoad, list[SimLoadPod]]) -> None:
    load, pods = node
    idle = pods[0]
    reader, read_paths = idle_pod_reader(load, idle)
    reader.skip = frozenset({pods[1].containers["side"].id})  # another pod's container named or gone
    load.advance(1.0)
    reader.read()
    idle_dir = str(load.root / load.cgroup_base / idle.rel_dir)
    assert [p for p in read_paths if p.startswith(idle_dir)] == [f"{idle_dir}/cpu.stat"]
