"""The cgroup CPU reader lists pod directories only when something may have changed (issue #14: at 500
pods, listing every pod directory on every sample was a large part of a sample's cost), and still sees
every container: restarted ones at once, new busy ones at once, new idle ones within RELIST_EVERY reads."""

from __future__ import annotations

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


def test_steady_reads_list_no_pod_directory(
    node: tuple[SimLoad, list[SimLoadPod]], monkeypatch: pytest.MonkeyPatch
) -> None:
    load, pods = node
    reader = CgroupCpuReader(HostFS(load.root))
    reader.read()
    calls = listed_dirs(monkeypatch)
    for _ in range(5):
        load.advance(1.0)
        reading = reader.read()
        assert len(reading.pods) == len(pods)
    pod_dirs = {str(load.root / load.cgroup_base / p.rel_dir) for p in pods}
    assert not pod_dirs & set(calls)
    for pod in pods:
        usage = {cid: ns for cid, (_runtime, ns) in reading.pods[pod.uid].containers.items()}
        assert usage == {c.id: int(c.usage_ns // 1000) * 1000 for c in pod.containers.values()}


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
