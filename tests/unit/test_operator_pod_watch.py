"""The operator's pod watch (pod_watch.py) over a fake CoreV1Api: paging, the filter, resuming, relisting
after 410 Gone with the deletions it missed, and the byte-stream line splitter. The real API server is in
tests/e2e/test_operator_pods.py (the operator runs standalone there, so its pods come through this watch)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from rmd_operator.pod_watch import BOUND, ListExpired, PodWatch, split_lines, wanted

Obj = dict[str, Any]
WAYS = "intel.com/l3_cache_ways"


def pod(uid: str, *, ways: bool = True, namespace: str = "ns", node: str | None = "n1") -> Obj:
    limits: Obj = {"cpu": "2", "memory": "1Gi"}
    if ways:
        limits[WAYS] = "2"
    spec: Obj = {"containers": [{"name": "app", "resources": {"limits": limits}}]}
    if node is not None:
        spec["nodeName"] = node
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": namespace, "resourceVersion": "1"},
        "spec": spec,
    }


class Response:
    def __init__(self, payload: Any = None, lines: list[Obj] | None = None, chunk: int = 7) -> None:
        self.data = json.dumps(payload).encode() if payload is not None else b""
        self._stream = b"".join(json.dumps(line).encode() + b"\n" for line in lines or [])
        self._chunk = chunk
        self.released = False

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        for at in range(0, len(self._stream), self._chunk):  # cut across lines on purpose
            yield self._stream[at : at + self._chunk]

    def release_conn(self) -> None:
        self.released = True

    def shutdown(self) -> None:
        pass


class FakeCore:
    """Answers list and watch calls from queues; records every call's arguments."""

    def __init__(self, pages: list[Any], watches: list[Any]) -> None:
        self.pages = pages  # each: a list of pods (paged by `limit`) or an exception
        self.watches = watches  # each: a list of events or an exception
        self.calls: list[Obj] = []
        self._listing: list[Obj] = []

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Response:
        return self.list_pod_for_all_namespaces(namespace=namespace, **kwargs)

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Response:
        self.calls.append(kwargs)
        if kwargs.get("watch"):
            answer = self.watches.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return Response(lines=answer)
        if "_continue" not in kwargs:
            answer = self.pages.pop(0)
            if isinstance(answer, Exception):
                raise answer
            self._listing = list(answer)
        page, self._listing = self._listing[: kwargs["limit"]], self._listing[kwargs["limit"] :]
        meta: Obj = {"resourceVersion": "100"}
        if self._listing:
            meta["continue"] = f"token-{len(self._listing)}"
        return Response({"items": page, "metadata": meta})


def make(core: FakeCore, **kwargs: Any) -> tuple[PodWatch, list[tuple[str | None, str]]]:
    got: list[tuple[str | None, str]] = []
    watch = PodWatch(core, lambda kind, body: got.append((kind, body["metadata"]["uid"])), **kwargs)
    return watch, got


def event(kind: str, body: Obj, version: str = "1") -> Obj:
    body = json.loads(json.dumps(body))
    body["metadata"]["resourceVersion"] = version
    return {"type": kind, "object": body}


def test_wanted_needs_a_node_a_cache_ways_limit_and_a_handled_namespace() -> None:
    assert wanted(pod("a"), ())
    assert not wanted(pod("a", ways=False), ())
    assert not wanted(pod("a", node=None), ())
    assert wanted(pod("a", namespace="x"), ("x", "y"))
    assert not wanted(pod("a", namespace="z"), ("x", "y"))


def test_lines_are_joined_across_chunks_and_blank_lines_dropped() -> None:
    assert list(split_lines(iter([b'{"a":', b"1}\n\n{", b'"b":2}\n{"c"', b":3}"]))) == [
        b'{"a":1}',
        b'{"b":2}',
        b'{"c":3}',
    ]


def test_the_list_comes_in_pages_and_only_wanted_pods_are_delivered() -> None:
    listed = [pod(f"p{i}", ways=i % 3 == 0) for i in range(10)]
    core = FakeCore([listed], [])
    watch, got = make(core, page_size=4)
    assert watch._list() == "100"
    assert got == [(None, "p0"), (None, "p3"), (None, "p6"), (None, "p9")]
    lists = [c for c in core.calls if not c.get("watch")]
    assert len(lists) == 3  # 10 pods, 4 a page
    assert all(c["field_selector"] == BOUND and c["limit"] == 4 for c in lists)
    assert [c.get("_continue") for c in lists] == [None, "token-6", "token-2"]


def test_watch_events_are_filtered_and_resume_from_the_last_version() -> None:
    kept, other = pod("kept"), pod("other", ways=False)
    core = FakeCore(
        [[kept]],
        [
            [
                event("ADDED", other, "101"),
                event("MODIFIED", kept, "102"),
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "150"}}},
                event("DELETED", other, "151"),
                event("ADDED", pod("new"), "152"),
                event("DELETED", kept, "153"),
            ]
        ],
    )
    watch, got = make(core, timeout_seconds=7)
    version = watch._watch(watch._list())
    assert version == "153"
    assert got == [(None, "kept"), ("MODIFIED", "kept"), ("ADDED", "new"), ("DELETED", "kept")]
    call = core.calls[-1]
    assert call["watch"] and call["resource_version"] == "100" and call["allow_watch_bookmarks"]
    assert call["timeout_seconds"] == 7 and call["field_selector"] == BOUND


def test_a_pod_that_stops_being_wanted_still_reaches_the_flow_until_deleted() -> None:
    # e.g. it left a handled namespace's view in some other way: the flow decides, the watch only forwards
    first = pod("p")
    changed = pod("p", ways=False)
    core = FakeCore([[first]], [[event("MODIFIED", changed, "101"), event("DELETED", changed, "102")]])
    watch, got = make(core)
    watch._watch(watch._list())
    assert got == [(None, "p"), ("MODIFIED", "p"), ("DELETED", "p")]


def test_410_gone_lists_again_and_reports_the_deletions_it_missed() -> None:
    a, b, c = pod("a"), pod("b"), pod("c")
    core = FakeCore(
        [[a, b], [b, c]],
        [[{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}]],
    )
    watch, got = make(core)

    def stop_after_second_list(kind: str | None, body: Obj) -> None:
        got.append((kind, body["metadata"]["uid"]))
        if watch.lists == 1 and kind == "DELETED":
            watch._stopped.set()

    watch._deliver = stop_after_second_list
    watch.run()
    assert got == [(None, "a"), (None, "b"), (None, "b"), (None, "c"), ("DELETED", "a")]
    assert watch.lists == 2


def test_failed_requests_are_retried_with_the_same_version(monkeypatch: pytest.MonkeyPatch) -> None:
    core = FakeCore([[pod("a")]], [OSError("connection reset"), [event("ADDED", pod("b"), "120")]])
    watch, got = make(core)
    monkeypatch.setattr("rmd_operator.pod_watch._RETRY_SECONDS", (0.01, 0.01))

    def deliver(kind: str | None, body: Obj) -> None:
        got.append((kind, body["metadata"]["uid"]))
        if body["metadata"]["uid"] == "b":
            watch._stopped.set()

    watch._deliver = deliver
    watch.run()
    assert got == [(None, "a"), ("ADDED", "b")]
    watches = [c for c in core.calls if c.get("watch")]
    assert [c["resource_version"] for c in watches] == ["100", "100"]
    assert watch.lists == 1  # a dropped connection resumes; only 410 lists again


def test_an_expired_continue_token_starts_the_list_over() -> None:
    core = FakeCore([[pod("a"), pod("b"), pod("c")], [pod("a")]], [])
    watch, got = make(core, page_size=2)
    original = core.list_pod_for_all_namespaces

    def expire_once(**kwargs: Any) -> Response:
        if kwargs.get("_continue") and not getattr(expire_once, "done", False):
            expire_once.done = True  # type: ignore[attr-defined]
            raise ApiException(status=410, reason="Gone")
        return original(**kwargs)

    core.list_pod_for_all_namespaces = expire_once  # type: ignore[method-assign]
    with pytest.raises(ListExpired):
        watch._list()
    assert watch._list() == "100"
    # b came in the broken list's first page and is gone from the complete one: the flow hears it went
    assert got == [(None, "a"), (None, "b"), (None, "a"), ("DELETED", "b")]
    assert watch.lists == 1


def test_a_namespaced_watch_lists_and_watches_that_namespace_only() -> None:
    core = FakeCore(
        [[pod("a", namespace="x"), pod("b", namespace="y")]], [[event("ADDED", pod("c", namespace="x"))]]
    )
    watch, got = make(core, namespace="x")
    watch._watch(watch._list())
    assert got == [(None, "a"), ("ADDED", "c")]  # (a server would not send b; the filter holds anyway)
    assert [c.get("namespace") for c in core.calls] == ["x", "x"]
