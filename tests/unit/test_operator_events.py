"""The operator's Event poster (events.py) over a fake CoreV1Api: the Event's body, order, retries of server
trouble, and refusals dropped. The real API server sees these Events in the e2e tests."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from rmd_operator import events as events_module
from rmd_operator.events import MESSAGE_LIMIT, EventPoster, event_body
from rmd_operator.status import EventText

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "ns", "uid": "u1"}}
NOW = datetime.datetime(2026, 11, 25, 12, 0, tzinfo=datetime.UTC)


def test_the_body_names_the_object_and_the_operator() -> None:
    body = event_body(
        POD, EventText("Warning", "CacheWaysNotGuaranteed", "x" * 2000), instance="op-1", now=NOW
    )
    assert body["metadata"] == {"generateName": "web.", "namespace": "ns"}
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "web",
        "namespace": "ns",
        "uid": "u1",
    }
    assert (body["type"], body["reason"]) == ("Warning", "CacheWaysNotGuaranteed")
    assert len(body["message"]) == MESSAGE_LIMIT and body["message"].endswith("x...")  # cut, and says so
    assert body["source"] == {"component": "rmd-operator"} and body["reportingInstance"] == "op-1"
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-11-25T12:00:00Z"


def test_a_cluster_scoped_object_gets_its_event_in_default() -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "u2"}}
    body = event_body(node, EventText("Normal", "R", "m"), instance="i", now=NOW)
    assert body["metadata"]["namespace"] == "default" and "namespace" not in body["involvedObject"]


class FakeCore:
    def __init__(self, failures: list[int | None]) -> None:
        self.failures = failures  # per call: an HTTP status to fail with, or None to succeed
        self.created: list[tuple[str, str]] = []
        self.calls = 0
        self.api_client = self

    def create_namespaced_event(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.calls += 1
        status = self.failures.pop(0) if self.failures else None
        if status is not None:
            raise ApiException(status=status, reason="test")
        self.created.append((namespace, body["reason"]))

    def close(self) -> None:
        pass


@pytest.mark.asyncio
async def test_events_are_posted_in_order_server_trouble_retried_refusals_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events_module, "_TRIES", (0.0, 0.0))
    monkeypatch.setattr(events_module, "_SENDERS", 1)  # one sender: the order of the calls is the queue's
    core = FakeCore([500, None, 403, 503, 503, 503])
    poster = EventPoster(core, "op-1")
    for reason in ("First", "Refused", "NeverThrough", "Last"):
        poster.post(POD, EventText("Normal", reason, "m"))
    await poster.close()
    # First: 500 then through; Refused: 403, dropped at once; NeverThrough: 3 server errors = all tries spent
    assert core.created == [("ns", "First"), ("ns", "Last")]
    assert core.calls == 2 + 1 + 3 + 1


@pytest.mark.asyncio
async def test_several_events_are_in_flight_at_once() -> None:
    class SlowCore(FakeCore):
        def __init__(self) -> None:
            super().__init__([])
            self.active = self.most = 0
            self.lock = threading.Lock()

        def create_namespaced_event(self, namespace: str, body: dict[str, Any], **kwargs: Any) -> None:
            with self.lock:
                self.active += 1
                self.most = max(self.most, self.active)
            time.sleep(0.05)
            with self.lock:
                self.active -= 1
            super().create_namespaced_event(namespace, body, **kwargs)

    core = SlowCore()
    poster = EventPoster(core, "op-1")
    for i in range(8):
        poster.post(POD, EventText("Normal", f"R{i}", "m"))
    await poster.close()
    assert len(core.created) == 8 and core.most == events_module._SENDERS > 1


def test_an_event_posted_once_has_a_name_of_its_object_and_key() -> None:
    once = EventText("Warning", "CacheWaysPodRejected", "m", once="rejected/TopologyAffinityError")
    body = event_body(POD, once, instance="op-1", now=NOW)
    name = body["metadata"]["name"]
    assert "generateName" not in body["metadata"] and name.startswith("web.") and len(name) == 4 + 16
    # The same object and key (another operator process): the same name. Another key or pod: another.
    assert event_body(POD, once, instance="op-2", now=NOW)["metadata"]["name"] == name
    other_key = EventText("Warning", "CacheWaysPodRejected", "m", once="rejected/OutOfcpu")
    assert event_body(POD, other_key, instance="op-1", now=NOW)["metadata"]["name"] != name
    other_pod = {**POD, "metadata": {**POD["metadata"], "uid": "u2"}}
    assert event_body(other_pod, once, instance="op-1", now=NOW)["metadata"]["name"] != name
    long_pod = {**POD, "metadata": {**POD["metadata"], "name": "p" * 253}}
    assert len(event_body(long_pod, once, instance="op-1", now=NOW)["metadata"]["name"]) == 253


@pytest.mark.asyncio
async def test_an_event_posted_once_is_not_posted_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "_TRIES", (0.0, 0.0))
    core = FakeCore([None, 409])  # the second create: AlreadyExists (409), as from the API server
    poster = EventPoster(core, "op-1")
    for _ in range(2):
        poster.post(POD, EventText("Warning", "Once", "m", once="k"))
    await poster.close()
    assert core.created == [("ns", "Once")] and core.calls == 2  # not retried
