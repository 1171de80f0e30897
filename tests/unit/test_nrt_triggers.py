"""Refresh triggers (rmd_agent.nrt.triggers): kubelet state files replaced by rename, directories that appear
later, the polling fallback, PodResources answers compared by content, and coalescing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from rmd_agent.errors import KubeletUnavailable
from rmd_agent.kubelet.podresources import ContainerResources, PodResources
from rmd_agent.nrt import triggers
from rmd_agent.nrt.triggers import (
    EntryLog,
    RefreshTrigger,
    poll_pod_qos,
    poll_pod_resources,
    watch_kubelet_state,
    watch_pod_directories,
)
from rmd_sim.kubelet import write_atomically

POLL = 0.05
NO_POLL = 3600.0  # an interval no test waits for: what fires then came from inotify


async def fired(trigger: RefreshTrigger, within: float = 5.0) -> frozenset[str]:
    reasons = await trigger.wait(within)
    assert reasons, f"nothing fired within {within}s"
    return reasons


async def quiet(trigger: RefreshTrigger, within: float = 0.3) -> None:
    assert await trigger.wait(within) == frozenset()


@pytest.fixture
async def watching(tmp_path: Path) -> AsyncIterator[tuple[Path, RefreshTrigger]]:
    kubelet = tmp_path / "var/lib/kubelet"
    kubelet.mkdir(parents=True)
    trigger = RefreshTrigger()
    task = asyncio.create_task(watch_kubelet_state(kubelet, trigger, NO_POLL))
    await asyncio.sleep(0.1)  # let the watches be set up
    trigger.take()
    yield kubelet, trigger
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_state_file_replaced_by_rename_fires(watching: tuple[Path, RefreshTrigger]) -> None:
    kubelet, trigger = watching
    write_atomically(kubelet / "cpu_manager_state", '{"policyName":"static"}')
    assert "kubelet-state:cpu_manager_state" in await fired(trigger)
    (kubelet / "unrelated").write_text("x")
    write_atomically(kubelet / "config.yaml", "kind: KubeletConfiguration\n")
    await quiet(trigger)
    (kubelet / "memory_manager_state").write_text("{}")  # written in place: close-write
    assert "kubelet-state:memory_manager_state" in await fired(trigger)


async def assert_checkpoint_write_fires(kubelet: Path, trigger: RefreshTrigger) -> None:
    """Once the watches are rebuilt, a write of the device manager's checkpoint fires the trigger."""
    await asyncio.sleep(0.1)
    trigger.take()
    write_atomically(kubelet / "device-plugins/kubelet_internal_checkpoint", "{}")
    assert "kubelet-state:kubelet_internal_checkpoint" in await fired(trigger)


async def test_the_device_plugin_directory_is_watched_once_it_appears(
    watching: tuple[Path, RefreshTrigger],
) -> None:
    kubelet, trigger = watching
    (kubelet / "device-plugins").mkdir()
    await fired(trigger)  # the layout changed; watches are rebuilt
    await assert_checkpoint_write_fires(kubelet, trigger)


async def test_a_directory_in_a_watched_one_is_awaited_without_polling(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """device-plugins/ absent (no device plugin ever registered): the kubelet directory's inotify watch sees
    it created, so nothing is polled while the exporter idles (a stat every interval did before)."""
    stamps: list[Path] = []
    real_stamp = triggers._stamp

    def counted(path: Path) -> tuple[int, int, int] | None:
        stamps.append(path)
        return real_stamp(path)

    monkeypatch.setattr(triggers, "_stamp", counted)
    kubelet = tmp_path / "var/lib/kubelet"
    kubelet.mkdir(parents=True)
    trigger = RefreshTrigger()
    task = asyncio.create_task(watch_kubelet_state(kubelet, trigger, POLL))
    try:
        await quiet(trigger, 10 * POLL)
        assert stamps == []
        (kubelet / "device-plugins").mkdir()
        assert "kubelet-state:layout" in await fired(trigger)
        await assert_checkpoint_write_fires(kubelet, trigger)
        assert stamps == []
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_directory_created_while_the_watches_are_set_up_is_not_missed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """device-plugins/ created after the look for it and before its parent's watch exists: no event will
    tell, so the watches are rebuilt at once."""
    kubelet = tmp_path / "var/lib/kubelet"
    kubelet.mkdir(parents=True)
    watch = triggers._Inotify.watch

    def racing(self: triggers._Inotify, directory: Path) -> None:
        (kubelet / "device-plugins").mkdir(exist_ok=True)
        watch(self, directory)

    monkeypatch.setattr(triggers._Inotify, "watch", racing)
    trigger = RefreshTrigger()
    task = asyncio.create_task(watch_kubelet_state(kubelet, trigger, NO_POLL))
    try:
        assert "kubelet-state:layout" in await fired(trigger)
        await assert_checkpoint_write_fires(kubelet, trigger)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_without_inotify_a_directory_that_appears_is_still_watched(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_inotify() -> None:
        raise triggers.InotifyUnavailable("not here")

    monkeypatch.setattr(triggers, "_Inotify", no_inotify)
    trigger = RefreshTrigger()
    task = asyncio.create_task(watch_kubelet_state(tmp_path, trigger, POLL))
    try:
        await asyncio.sleep(3 * POLL)
        (tmp_path / "device-plugins").mkdir()
        await fired(trigger)
        await asyncio.sleep(3 * POLL)
        trigger.take()
        write_atomically(tmp_path / "device-plugins/kubelet_internal_checkpoint", "{}")
        assert "kubelet-state:kubelet_internal_checkpoint" in await fired(trigger)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_without_inotify_the_files_are_polled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_inotify() -> None:
        raise triggers.InotifyUnavailable("not here")

    monkeypatch.setattr(triggers, "_Inotify", no_inotify)
    trigger = RefreshTrigger()
    task = asyncio.create_task(watch_kubelet_state(tmp_path, trigger, POLL))
    try:
        await asyncio.sleep(3 * POLL)
        write_atomically(tmp_path / "cpu_manager_state", "{}")
        assert "kubelet-state:cpu_manager_state" in await fired(trigger)
        await quiet(trigger)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_missing_kubelet_directory_is_waited_for(tmp_path: Path) -> None:
    kubelet = tmp_path / "kubelet"
    trigger = RefreshTrigger()
    task = asyncio.create_task(watch_kubelet_state(kubelet, trigger, POLL))
    try:
        await quiet(trigger, 3 * POLL)
        kubelet.mkdir()
        write_atomically(kubelet / "cpu_manager_state", "{}")
        await fired(trigger)
        await asyncio.sleep(0.2)
        trigger.take()
        write_atomically(kubelet / "cpu_manager_state", '{"x": 1}')
        assert "kubelet-state:cpu_manager_state" in await fired(trigger)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_pod_directories_fire_when_an_entry_comes_or_goes(tmp_path: Path) -> None:
    """A pod's cgroup or log directory appearing or going fires "pods"; what happens inside one does not."""
    logs, cgroups = tmp_path / "var/log/pods", tmp_path / "kubepods.slice"
    logs.mkdir(parents=True)
    cgroups.mkdir()
    trigger = RefreshTrigger()
    task = asyncio.create_task(watch_pod_directories([logs, cgroups], trigger, NO_POLL))
    try:
        await asyncio.sleep(0.1)
        trigger.take()
        (logs / "ns_a_uid").mkdir()
        assert {r.split(":")[0] for r in await fired(trigger)} == {"pods"}
        (logs / "ns_a_uid" / "c").mkdir()  # a container's log directory inside the pod's: not a pod
        await quiet(trigger)
        (cgroups / "kubepods-poduid.slice").mkdir()
        await fired(trigger)
        (cgroups / "kubepods-poduid.slice").rmdir()
        await fired(trigger)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_pod_directory_entries_are_named_in_the_log(tmp_path: Path) -> None:
    """Each entry that comes or goes is noted by its path; the log is incomplete at first, and again after
    anything that may have missed one (watches rebuilt)."""
    logs, cgroups = tmp_path / "var/log/pods", tmp_path / "kubepods"
    logs.mkdir(parents=True)
    cgroups.mkdir()
    trigger, entries = RefreshTrigger(), EntryLog()
    assert entries.take() is None  # nothing read yet: read everything
    task = asyncio.create_task(watch_pod_directories([logs, cgroups], trigger, NO_POLL, entries))
    try:
        await asyncio.sleep(0.1)
        trigger.take()
        assert entries.take() is None  # before the watches were in place: a full read
        assert entries.take() == set()
        (logs / "ns_a_uid").mkdir()
        (cgroups / "poduid").mkdir()
        await fired(trigger)
        await asyncio.sleep(0.05)
        assert entries.take() == {logs / "ns_a_uid", cgroups / "poduid"}
        (cgroups / "poduid").rmdir()
        await fired(trigger)
        assert entries.take() == {cgroups / "poduid"}
        cgroups.rename(tmp_path / "moved")  # the watches are rebuilt: what happened meanwhile is unnamed
        assert "pods:layout" in await fired(trigger)
        assert entries.take() is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def pods(*names: str, cpus: frozenset[int] = frozenset()) -> list[PodResources]:
    return [PodResources("ns", n, (ContainerResources("c", cpus),)) for n in names]


def scripted(answers: list[list[PodResources] | Exception]) -> Callable[[], object]:
    """A List function answering from `answers`, repeating the last one."""

    async def list_pods() -> list[PodResources]:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return list_pods


async def test_pod_resources_changes_fire_and_equal_answers_do_not() -> None:
    trigger = RefreshTrigger()
    answers: list[list[PodResources] | Exception] = [
        pods("a", "b"),
        list(reversed(pods("a", "b"))),  # same content, other order
        pods("a", "b", cpus=frozenset({1})),
    ]
    task = asyncio.create_task(poll_pod_resources(scripted(answers), trigger, POLL))  # type: ignore[arg-type]
    try:
        assert await fired(trigger) == {"podresources"}
        await quiet(trigger)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_pod_resources_outage_is_survived_and_recovery_fires() -> None:
    trigger = RefreshTrigger()
    answers: list[list[PodResources] | Exception] = [pods("a"), KubeletUnavailable("down"), pods("a")]
    task = asyncio.create_task(poll_pod_resources(scripted(answers), trigger, POLL))  # type: ignore[arg-type]
    try:
        assert await fired(trigger) == {"podresources:recovered"}
        await quiet(trigger)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_pod_qos_changes_fire() -> None:
    """A pod's class becoming known (its cgroup and log directory appear) fires once; an equal answer not."""
    trigger = RefreshTrigger()
    answers = iter([{("ns", "a"): "guaranteed"}, {("ns", "a"): "guaranteed", ("ns", "b"): "burstable"}])
    last: dict[tuple[str, str], str] = {}

    def read() -> dict[tuple[str, str], str]:
        nonlocal last
        last = next(answers, last)
        return last

    task = asyncio.create_task(poll_pod_qos(read, trigger, POLL))
    try:
        assert await fired(trigger) == {"pod-qos"}
        await quiet(trigger)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_reasons_fired_meanwhile_are_taken_together() -> None:
    trigger = RefreshTrigger()
    for reason in ("a", "b", "a"):
        trigger.fire(reason)
    assert await trigger.wait(0) == {"a", "b"}
    assert await trigger.wait(0.01) == frozenset()
