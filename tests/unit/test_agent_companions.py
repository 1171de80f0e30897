"""NotifyingEngine (companions.py): change notifications, and one node summary per change for its callers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rmd_agent.companions import Companions, NotifyingEngine, _first_client
from rmd_agent.settings import AgentSettings


class FakeEngine:
    def __init__(self) -> None:
        self.readings = 0
        self.fail = False
        self.gate: asyncio.Event | None = None

    async def apply(self, workload: Any) -> tuple[str, bool]:
        return "applied", workload == "new"

    async def remove(self, namespace: str, name: str, uid: str = "") -> bool:
        return name == "held"

    async def node(self) -> str:
        self.readings += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise OSError("resctrl unreadable")
        return f"summary {self.readings}"


def make(max_age: float = 60.0) -> tuple[NotifyingEngine, FakeEngine, list[int]]:
    inner, notified = FakeEngine(), []
    engine = NotifyingEngine(inner, lambda: notified.append(1), summary_max_age=max_age)  # type: ignore[arg-type]
    return engine, inner, notified


@pytest.mark.asyncio
async def test_changes_notify_and_unchanged_calls_do_not() -> None:
    engine, _, notified = make()
    await engine.apply("same")  # type: ignore[arg-type]
    await engine.remove("ns", "absent")
    assert notified == []
    await engine.apply("new")  # type: ignore[arg-type]
    await engine.remove("ns", "held")
    assert notified == [1, 1]


@pytest.mark.asyncio
async def test_one_reading_per_change_shared_by_concurrent_and_later_callers() -> None:
    engine, inner, _ = make()
    inner.gate = asyncio.Event()
    both = asyncio.gather(engine.node(), engine.node())
    await asyncio.sleep(0)
    inner.gate.set()
    assert await both == ["summary 1", "summary 1"]
    assert await engine.node() == "summary 1" and inner.readings == 1
    await engine.apply("new")  # type: ignore[arg-type]
    assert await engine.node() == "summary 2"
    await engine.apply("same")  # type: ignore[arg-type]
    assert await engine.node() == "summary 2" and inner.readings == 2


@pytest.mark.asyncio
async def test_a_summary_expires_and_a_failed_reading_is_not_kept() -> None:
    engine, inner, _ = make(max_age=0.0)
    assert await engine.node() == "summary 1"
    await asyncio.sleep(0.01)
    assert await engine.node() == "summary 2"
    engine.summary_max_age = 60.0
    await engine.apply("new")  # type: ignore[arg-type]
    inner.fail = True
    with pytest.raises(OSError):
        await engine.node()
    inner.fail = False
    assert await engine.node() == "summary 4"


def test_the_client_that_checked_the_kubeconfig_is_the_first_one_handed_out() -> None:
    made: list[object] = []

    def factory() -> object:
        made.append(object())
        return made[-1]

    checked = object()
    clients = _first_client(checked, factory)
    assert clients() is checked and made == []  # the NRT export's: no second client built at the start
    assert clients() is made[0] and clients() is made[1]  # the others' own


class TellingEngine(FakeEngine):
    """An engine that tells its listeners of its own changes (engine_api.ChangeNotifier), as NodeEngine."""

    def __init__(self) -> None:
        super().__init__()
        self.listeners: list[Any] = []

    def add_change_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    async def apply(self, workload: Any) -> tuple[str, bool]:
        applied, changed = await super().apply(workload)
        if changed:
            for listener in self.listeners:
                listener()
        return applied, changed


@pytest.mark.asyncio
async def test_changes_the_engine_makes_by_itself_notify_once_and_renew_the_summary() -> None:
    inner, notified = TellingEngine(), []
    engine = NotifyingEngine(inner, lambda: notified.append(1))  # type: ignore[arg-type]
    assert engine.notifies_all
    assert await engine.node() == "summary 1"
    for listener in inner.listeners:  # e.g. a reconcile once resctrl is mounted again
        listener()
    assert notified == [1]
    assert await engine.node() == "summary 2"
    await engine.apply("new")  # type: ignore[arg-type]
    assert notified == [1, 1]  # told by the engine, not a second time by the wrapper
    assert not NotifyingEngine(FakeEngine(), lambda: None).notifies_all  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_without_a_kubernetes_api_the_warning_is_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """serve() calls start_export() before the engine starts and start() after: a missing Kubernetes API is
    warned about once, not by both."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings = AgentSettings(
        node_name="n1", host_root=tmp_path, nrt_enabled=True, power_enabled=False, device_plugin_enabled=False
    )
    companions = Companions(settings, FakeEngine(), CollectorRegistry(), None)  # type: ignore[arg-type]
    await companions.start_export()
    await companions.start(50051)
    await companions.stop(grace=1.0)
    assert sum("no Kubernetes API" in r.getMessage() for r in caplog.records) == 1
