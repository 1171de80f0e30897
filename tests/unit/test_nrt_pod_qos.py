"""Pods' QoS classes from the node (rmd_agent.nrt.pod_qos): the join of pod cgroups and pod log directories,
read from host trees where the simulated kubelet made them as the real one does (rmd_sim.kubelet), for both
cgroup versions and drivers; and the exporter using them for the fingerprint."""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import pytest

from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.podresources import AllocatableResources, ContainerResources, PodResources
from rmd_agent.nrt import exporter as exporter_module
from rmd_agent.nrt import fingerprint, pod_qos
from rmd_agent.nrt.exporter import NrtExporter
from rmd_agent.nrt.pod_qos import (
    KubeletPodQoS,
    join_pod_qos,
    list_pod_cgroups,
    list_pod_log_dirs,
    pod_directories,
)
from rmd_agent.nrt.triggers import EntryLog
from rmd_agent.power.cgroup_paths import QoS
from rmd_agent.power.pod_meta import PodMeta
from rmd_agent.settings import AgentSettings
from rmd_sim.hosttree import write_host_tree
from rmd_sim.kubelet import ContainerSpec, SimKubelet, pod_cgroup_dirs
from rmd_sim.load import SimLoad
from rmd_sim.spec import NodeSpec

SMALL = NodeSpec(name="small", cores_per_socket=4)  # few CPUs: fewer files to write
UIDS = {name: str(uuid.uuid5(uuid.NAMESPACE_DNS, name)) for name in ("gu", "bu", "be", "gu-int")}
PODS: dict[str, tuple[ContainerSpec, ...]] = {
    "gu": (ContainerSpec("c", "500m", "500m", "1Gi", "1Gi"),),  # fractional Guaranteed: no exclusive CPUs
    "bu": (ContainerSpec("c", "1", "2", "1Gi", "1Gi"),),
    "be": (ContainerSpec("c"), ContainerSpec("sidecar")),
    "gu-int": (ContainerSpec("c", "2", "2", "1Gi", "1Gi"),),
}
EXPECTED = {
    ("ns", "gu"): QoS.GUARANTEED,
    ("ns", "bu"): QoS.BURSTABLE,
    ("ns", "be"): QoS.BESTEFFORT,
    ("ns", "gu-int"): QoS.GUARANTEED,
}


def node(tmp_path: Path, version: int, driver: str) -> tuple[Path, SimKubelet]:
    root = tmp_path / "node"
    write_host_tree(dataclasses.replace(SMALL, cgroup_version=version, cgroup_driver=driver), root)
    kubelet = SimKubelet.from_host_tree(root)
    for name, containers in PODS.items():
        kubelet.add_pod("ns", name, UIDS[name], containers)
    return root, kubelet


def test_join_by_uid() -> None:
    classes = {"u1": QoS.GUARANTEED, "u2": QoS.BURSTABLE, "u3": QoS.BESTEFFORT, "u4": QoS.BURSTABLE}
    names = {
        "u1": PodMeta("a", "p1"),
        "u2": PodMeta("a", "p2"),
        "u4": PodMeta("a", "p2"),
        "u9": PodMeta("a", "x"),
    }
    # u3 has no name, u9 no cgroup; p2 has two live uids of the same class
    assert join_pod_qos(classes, names) == {("a", "p1"): QoS.GUARANTEED, ("a", "p2"): QoS.BURSTABLE}
    # a name replaced by a pod of another class while the old one terminates: unknown
    names["u4"] = PodMeta("a", "p1")
    assert join_pod_qos(classes, names) == {("a", "p2"): QoS.BURSTABLE}


@pytest.mark.parametrize(
    ("version", "driver"), [(2, "cgroupfs"), (1, "cgroupfs"), (2, "systemd"), (1, "systemd")]
)
def test_classes_of_the_simulated_kubelets_pods(tmp_path: Path, version: int, driver: str) -> None:
    root, kubelet = node(tmp_path, version, driver)
    reading = KubeletPodQoS(HostFS(root)).read()
    assert reading.problems == ()
    assert reading.classes == EXPECTED
    kubelet.remove_pod(UIDS["bu"])
    assert KubeletPodQoS(HostFS(root)).read().classes == {k: v for k, v in EXPECTED.items() if k[1] != "bu"}


def listings(fs: HostFS) -> dict[Path, set[str]]:
    """The watched pod directories' entries (nrt/pod_qos.py pod_directories), by absolute path."""
    dirs = pod_directories(fs)
    assert isinstance(dirs, list)
    return {fs.path(d): set(os.listdir(fs.path(d))) if fs.is_dir(d) else set() for d in dirs}


def came_or_went(before: dict[Path, set[str]], after: dict[Path, set[str]]) -> set[Path]:
    """What inotify names between two listings: every entry that came or went."""
    return {d / name for d in after for name in before[d] ^ after[d]}


def no_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    def listed(*_: object) -> None:
        raise AssertionError("the pod directories were listed")

    monkeypatch.setattr(pod_qos, "list_pod_cgroups", listed)
    monkeypatch.setattr(pod_qos, "list_pod_log_dirs", listed)


@pytest.mark.parametrize(("version", "driver"), [(2, "cgroupfs"), (1, "cgroupfs"), (2, "systemd")])
def test_classes_are_updated_from_the_entries_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, version: int, driver: str
) -> None:
    """After a full read, the entries that came or went are enough (no directory listed) to get what a
    full read would: pods started, pods gone, and a name whose live pods disagree on the class."""
    root, kubelet = node(tmp_path, version, driver)
    fs = HostFS(root)
    qos = KubeletPodQoS(fs)
    first = qos.read().classes
    assert first == EXPECTED
    unchanged = qos.update(set())
    assert unchanged is not None and unchanged.classes is first  # nothing changed: the same dict

    before = listings(fs)
    kubelet.add_pod("ns", "new-gu", str(uuid.uuid5(uuid.NAMESPACE_DNS, "new-gu")), PODS["gu-int"])
    kubelet.add_pod("ns", "new-be", str(uuid.uuid5(uuid.NAMESPACE_DNS, "new-be")), PODS["be"])
    kubelet.remove_pod(UIDS["bu"])
    # "gu" replaced by a BestEffort pod of the same name while the old one terminates: class unknown (the
    # simulated kubelet holds one pod per name, so the new one's directories are made here)
    replacement = str(uuid.uuid5(uuid.NAMESPACE_DNS, "gu-2"))
    for directory in pod_cgroup_dirs(root, replacement, "BestEffort"):
        directory.mkdir()
    (root / f"var/log/pods/ns_gu_{replacement}").mkdir()
    after = listings(fs)
    monkeypatch.undo()
    truth = KubeletPodQoS(fs).read().classes
    assert ("ns", "gu") not in truth and truth[("ns", "new-gu")] is QoS.GUARANTEED
    no_listing(monkeypatch)
    updated = qos.update(came_or_went(before, after))
    assert updated is not None and updated.classes == truth and updated.classes is not first
    assert first == EXPECTED  # the earlier answer is not changed under its holder

    before = listings(fs)
    kubelet.remove_pod(UIDS["gu"])  # the old "gu" is gone: the new one's class shows
    settled = qos.update(came_or_went(before, listings(fs)))
    assert settled is not None and settled.classes[("ns", "gu")] is QoS.BESTEFFORT


def test_an_update_needs_a_full_read_first(tmp_path: Path) -> None:
    root, _ = node(tmp_path, 2, "cgroupfs")
    qos = KubeletPodQoS(HostFS(root))
    assert qos.update({root / "var/log/pods/ns_x_uid"}) is None
    qos.read()
    assert qos.update({tmp_path / "elsewhere/poduid"}) is None  # not a directory the read listed


async def test_the_exporter_reads_only_the_named_pods_after_a_pod_event(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A refresh woken by pod directory events updates the classes from the entries the watches named; a
    resync (reasons None) and a change seen unnamed read them all."""
    root, kubelet = node(tmp_path, 2, "cgroupfs")
    held = [ContainerResources("c", frozenset())]

    class Kubelet:
        async def get_allocatable(self) -> AllocatableResources:
            return AllocatableResources(frozenset(range(8)))

        async def list(self) -> list[PodResources]:
            return [PodResources(p.namespace, p.name, tuple(held)) for p in kubelet.pods]

    exporter = NrtExporter(AgentSettings(node_name="n1", host_root=root), api_client_factory=lambda: None)
    entries: EntryLog = exporter._pod_entries
    await exporter.snapshot(Kubelet())  # type: ignore[arg-type]  # the first reading: in full
    fs = HostFS(root)
    before = listings(fs)
    kubelet.add_pod("ns", "late-gu", str(uuid.uuid5(uuid.NAMESPACE_DNS, "late")), PODS["gu"])
    for entry in came_or_went(before, listings(fs)):
        entries.add(entry)
    no_listing(monkeypatch)
    topology = await exporter.snapshot(Kubelet(), {"pods:/x"})  # type: ignore[arg-type]
    counted = [("ns", "gu"), ("ns", "gu-int"), ("ns", "late-gu")]
    assert topology.attribute(fingerprint.ATTRIBUTE) == fingerprint.fingerprint(counted)
    entries.lost()
    with pytest.raises(AssertionError, match="listed"):
        await exporter.snapshot(Kubelet(), {"pods:/x"})  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="listed"):
        await exporter.snapshot(Kubelet(), None)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [1, 2])
def test_the_simulated_kubelet_lays_pods_out_like_the_real_one(tmp_path: Path, version: int) -> None:
    """cgroupfs: kubepods/pod<uid>, kubepods/burstable/pod<uid>, kubepods/besteffort/pod<uid> in every
    hierarchy; systemd slices likewise; /var/log/pods/<namespace>_<name>_<uid>/<container>/."""
    root, kubelet = node(tmp_path, version, "cgroupfs")
    hierarchies = (
        ["sys/fs/cgroup"]
        if version == 2
        else [f"sys/fs/cgroup/{h}" for h in ("cpu,cpuacct", "cpuset", "memory")]
    )
    for hierarchy in hierarchies:
        pods = root / hierarchy / "kubepods"
        assert (pods / f"pod{UIDS['gu']}").is_dir()
        assert (pods / "burstable" / f"pod{UIDS['bu']}").is_dir()
        assert (pods / "besteffort" / f"pod{UIDS['be']}").is_dir()
    logs = root / "var/log/pods"
    assert (logs / f"ns_be_{UIDS['be']}" / "sidecar").is_dir()
    kubelet.remove_pod(UIDS["be"])
    assert not (root / hierarchies[0] / "kubepods/besteffort" / f"pod{UIDS['be']}").exists()
    assert not (logs / f"ns_be_{UIDS['be']}").exists()

    systemd_root, _ = node(tmp_path / "systemd", version, "systemd")
    top = systemd_root / hierarchies[0] / "kubepods.slice"
    escaped = {name: uid.replace("-", "_") for name, uid in UIDS.items()}
    assert (top / f"kubepods-pod{escaped['gu']}.slice").is_dir()
    assert (top / "kubepods-burstable.slice" / f"kubepods-burstable-pod{escaped['bu']}.slice").is_dir()
    assert (top / "kubepods-besteffort.slice" / f"kubepods-besteffort-pod{escaped['be']}.slice").is_dir()


def test_a_simulated_load_keeps_the_kubelets_cgroup(tmp_path: Path) -> None:
    root, _ = node(tmp_path, 2, "systemd")
    load = SimLoad(root)
    pod = load.add_pod("ns", "bu", UIDS["bu"], {"c": 1.0}, qos="guaranteed")
    assert pod.qos == "burstable"  # the class the kubelet gave it
    assert KubeletPodQoS(HostFS(root)).read().classes == EXPECTED


def test_missing_sources_are_problems(make_tree: Callable[[Mapping[str, str]], Path]) -> None:
    bare = make_tree({"sys/fs/cgroup/cgroup.controllers": "cpu memory\n", "var/log/pods/ns_p_u1/c/0.log": ""})
    fs = HostFS(bare)
    assert list_pod_log_dirs(fs, "var/log/pods") == {"u1": PodMeta("ns", "p")}
    reading = KubeletPodQoS(fs).read()
    assert reading.classes == {} and len(reading.problems) == 1 and "kubepods" in reading.problems[0]
    (bare / "sys/fs/cgroup/kubepods/burstable/podu1").mkdir(parents=True)
    assert list_pod_cgroups(fs) == {}  # "u1" is no UID
    uid = UIDS["bu"]
    (bare / f"sys/fs/cgroup/kubepods/burstable/pod{uid}").mkdir()
    (bare / f"var/log/pods/ns_p_{uid}").mkdir()
    assert KubeletPodQoS(fs).read().classes == {("ns", "p"): QoS.BURSTABLE}
    (bare / "var/lib/kubelet").mkdir(parents=True)
    (bare / "var/lib/kubelet/config.yaml").write_text("podLogsDir: /data/pod-logs\n")
    moved = KubeletPodQoS(fs).read()  # the kubelet's podLogsDir, which is empty
    assert moved.classes == {} and "data/pod-logs" in moved.problems[0]


async def test_the_exporter_counts_guaranteed_pods_by_their_cgroup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, _ = node(tmp_path, 2, "cgroupfs")

    class Kubelet:
        async def get_allocatable(self) -> AllocatableResources:
            return AllocatableResources(frozenset(range(8)))

        async def list(self) -> list[PodResources]:
            shared = ContainerResources("c", frozenset())
            pods = [PodResources("ns", name, (shared,)) for name in ("gu", "bu", "be", "not-started")]
            return [*pods, PodResources("ns", "gu-int", (ContainerResources("c", frozenset({2, 3})),))]

    settings = AgentSettings(node_name="n1", host_root=root)
    exporter = NrtExporter(settings, api_client_factory=lambda: None)
    with caplog.at_level(logging.DEBUG, logger="rmd_agent.nrt.exporter"):
        topology = await exporter.snapshot(Kubelet())  # type: ignore[arg-type]
        await exporter.snapshot(Kubelet())  # type: ignore[arg-type]
    assert topology.attribute(fingerprint.ATTRIBUTE) == fingerprint.fingerprint(
        [("ns", "gu"), ("ns", "gu-int")]
    )
    unknown = [r.getMessage() for r in caplog.records if "no QoS class" in r.getMessage()]
    assert unknown == ["no QoS class for pod ns/not-started: fingerprint decided from PodResources"]  # once

    everything = NrtExporter(
        AgentSettings(node_name="n1", host_root=root, nrt_pods_fingerprint_method="all"), lambda: None
    )
    assert everything.pod_qos is None
    all_pods = await everything.snapshot(Kubelet())  # type: ignore[arg-type]
    names = [("ns", n) for n in ("gu", "bu", "be", "not-started", "gu-int")]
    assert all_pods.attribute(fingerprint.ATTRIBUTE) == fingerprint.fingerprint(names)


def test_without_qos_classes_no_entries_are_noted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With fingerprint method all the exporter reads no QoS classes, so nothing would take the noted pod
    directory entries: none are noted (they piled up for the agent's life)."""
    root, _kubelet = node(tmp_path, 2, "cgroupfs")
    noted: list[object] = []

    async def idle() -> None:
        pass

    def watch(
        dirs: object, trigger: object, poll: float, entries: object = None
    ) -> Coroutine[Any, Any, None]:
        noted.append(entries)
        return idle()

    monkeypatch.setattr(exporter_module, "watch_pod_directories", watch)
    for method, expected in (("all", None), ("with-exclusive-resources", EntryLog)):
        settings = AgentSettings(node_name="n1", host_root=root, nrt_pods_fingerprint_method=method)
        watchers = NrtExporter(settings, api_client_factory=lambda: None)._watchers(None)  # type: ignore[arg-type]
        for coroutine in watchers:
            coroutine.close()
        assert noted[-1] is None if expected is None else isinstance(noted[-1], expected)
