"""rmd_agent.kube_object_writer: the per-node object writer both RmdNodeState and NodeResourceTopology use,
driven through an in-memory API server (MemoryClient): creation, writes only on change, conditional writes
and their conflicts, recreation after a deletion, the owner Node, giving up, and failures. Plus the request
mapping of kube.KubeObjectClient. The real API server is in tests/e2e/test_node_state.py and test_nrt.py."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from rmd_agent.errors import KubeApiError
from rmd_agent.kube import KubeObjectClient
from rmd_agent.kube_api import JSON, MERGE_PATCH
from rmd_agent.kube_object_writer import (
    ABSENT,
    ATTEMPTS,
    CREATED,
    UNCHANGED,
    Change,
    ObjectRef,
    ObjectWriter,
    node_owner_reference,
)
from rmd_agent.nrt import publisher
from rmd_agent.nrt.zones import NodeTopology

Obj = dict[str, Any]
REF = ObjectRef("example.com", "v1", "widgets", "Widget", "w-n1", "ns")
NODE = "n1"


def merged(target: Any, patch: Any) -> Any:
    """RFC 7386 applied, as the API server does for a merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merged(result.get(key), value)
    return result


class MemoryClient:
    """An API server holding one object with a status subresource, and Nodes (name -> uid).

    Like the real one: a write whose resourceVersion is not the stored one is 409, a write to a missing
    object 404, a create of an existing one 409; status is ignored on create and on main-resource writes.
    `calls` records every request; `refuse` makes the next request of a kind raise."""

    def __init__(self, nodes: dict[str, str] | None = None, ref: ObjectRef = REF) -> None:
        self.ref = ref
        self.nodes = {NODE: "uid-1"} if nodes is None else nodes
        self.stored: Obj | None = None
        self.calls: list[str] = []
        self.bodies: list[Obj] = []  # of writes, as sent
        self.refuse: dict[str, KubeApiError] = {}
        self._version = 0

    # -- what other actors do

    def edit(self, **labels: str) -> None:
        """Someone else's write: new labels, a new resourceVersion."""
        assert self.stored is not None
        self.stored["metadata"].setdefault("labels", {}).update(labels)
        self._bump()

    def delete(self) -> None:
        self.stored = None

    # -- the ObjectClient protocol

    async def get(self) -> Obj | None:
        self._request("get")
        return copy.deepcopy(self.stored)

    async def create(self, body: Obj) -> Obj:
        self._request("create", body)
        if self.stored is not None:
            raise KubeApiError(status=409, reason="AlreadyExists")
        self.stored = {k: copy.deepcopy(v) for k, v in body.items() if k != "status"}
        self._version += 1
        self.stored["metadata"]["uid"] = f"obj-{self._version}"
        return self._bump()

    async def replace(self, body: Obj) -> Obj:
        current = self._writable("replace", body)
        self.stored = {**copy.deepcopy(body), "status": current.get("status")}
        return self._bump()

    async def patch(self, body: Obj) -> Obj:
        current = self._writable("patch", body)
        self.stored = {**merged(current, {k: v for k, v in body.items() if k != "status"})}
        return self._bump()

    async def patch_status(self, body: Obj) -> Obj:
        current = self._writable("patch_status", body)
        current["status"] = merged(current.get("status") or {}, body.get("status"))
        return self._bump()

    async def node_uid(self, node: str) -> str | None:
        self._request("node")
        return self.nodes.get(node)

    # -- internals

    def _request(self, kind: str, body: Obj | None = None) -> None:
        self.calls.append(kind)
        if body is not None:
            self.bodies.append(copy.deepcopy(body))
        if kind in self.refuse:
            raise self.refuse.pop(kind)

    def _writable(self, kind: str, body: Obj) -> Obj:
        self._request(kind, body)
        if self.stored is None:
            raise KubeApiError(status=404, reason="NotFound")
        if body["metadata"]["resourceVersion"] != self.stored["metadata"]["resourceVersion"]:
            raise KubeApiError(status=409, reason="Conflict")
        return self.stored

    def _bump(self) -> Obj:
        assert self.stored is not None
        self._version += 1
        self.stored["metadata"]["resourceVersion"] = str(self._version)
        return copy.deepcopy(self.stored)

    def writes(self) -> list[str]:
        return [c for c in self.calls if c not in ("get", "node")]


def build(uid: str | None) -> Obj:
    metadata: Obj = {"name": REF.name, "namespace": REF.namespace}
    if uid is not None:
        metadata["ownerReferences"] = [node_owner_reference(NODE, uid)]
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": metadata, "spec": {"size": 1}}


def status_of(value: str) -> Any:
    """A desire: status.value should be `value`."""

    def desire(current: Obj, _: str | None) -> Change | None:
        if (current.get("status") or {}).get("value") == value:
            return None
        return Change("patch_status", {"status": {"value": value}})

    return desire


def writer(api: MemoryClient, *, needs_node: bool = True) -> ObjectWriter:
    return ObjectWriter(api, NODE, needs_node=needs_node)


# -- creation and writes only on change ----------------------------------------------------------------------


async def test_creates_the_missing_object_owned_by_its_node_then_writes_its_status() -> None:
    api = MemoryClient()
    w = writer(api)
    assert await w.sync(build, [status_of("a")]) == CREATED
    assert api.calls == ["node", "get", "create", "patch_status"]  # status is ignored on create
    assert api.stored is not None and api.stored["status"] == {"value": "a"}
    assert api.stored["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-1"}
    ]
    assert w.current == api.stored
    assert (w.writes, w.conflicts) == (2, 0)


async def test_nothing_changed_costs_no_request_and_verify_only_reads() -> None:
    api = MemoryClient()
    w = writer(api)
    await w.sync(build, [status_of("a")])
    api.calls.clear()
    assert await w.sync(build, [status_of("a")]) == UNCHANGED
    assert api.calls == []
    assert await w.sync(build, [status_of("a")], verify=True) == UNCHANGED
    assert api.calls == ["node", "get"]
    assert w.writes == 2


async def test_a_change_is_one_write_conditional_on_the_version_read() -> None:
    api = MemoryClient()
    w = writer(api)
    await w.sync(build, [status_of("a")])
    assert w.current is not None
    version = w.current["metadata"]["resourceVersion"]
    api.calls.clear()
    assert await w.sync(build, [status_of("b")]) == "status patched"
    assert api.calls == ["patch_status"]
    assert api.bodies[-1] == {"metadata": {"resourceVersion": version}, "status": {"value": "b"}}
    assert api.stored is not None and api.stored["status"] == {"value": "b"}


async def test_each_change_is_judged_on_the_object_the_previous_one_left() -> None:
    api = MemoryClient()
    w = writer(api)
    await w.sync(build, [])
    seen: list[str] = []

    def size(current: Obj, _: str | None) -> Change | None:
        return None if current["spec"]["size"] == 2 else Change("patch", {"spec": {"size": 2}}, "resized")

    def record(current: Obj, _: str | None) -> Change | None:
        seen.append(current["metadata"]["resourceVersion"])
        return None

    await w.sync(build, [size, record])
    assert api.stored is not None and api.stored["spec"]["size"] == 2
    assert seen == [api.stored["metadata"]["resourceVersion"]]


# -- conflicts and deletion ----------------------------------------------------------------------------------


async def test_a_concurrent_edit_is_reread_not_overwritten() -> None:
    api = MemoryClient()
    w = writer(api)
    await w.sync(build, [status_of("a")])
    api.edit(team="infra")
    api.calls.clear()
    assert await w.sync(build, [status_of("b")]) == "status patched"
    assert api.calls == ["patch_status", "get", "patch_status"]
    assert api.stored is not None and api.stored["metadata"]["labels"] == {"team": "infra"}
    assert api.stored["status"] == {"value": "b"}
    assert w.conflicts == 1


async def test_a_replace_carries_the_version_and_meets_an_edit_with_a_reread() -> None:
    api = MemoryClient()
    w = writer(api, needs_node=False)
    await w.sync(build, [])

    def bigger(current: Obj, _: str | None) -> Change | None:
        if current["spec"]["size"] == 3:
            return None
        return Change("replace", {**copy.deepcopy(current), "spec": {"size": 3}})

    api.edit(team="infra")
    assert await w.sync(build, [bigger]) == "replaced"
    sent = [b for b, c in zip(api.bodies, api.writes(), strict=True) if c == "replace"]
    assert [b["metadata"]["resourceVersion"] for b in sent] == ["2", "3"]  # stale, then the one re-read
    assert api.stored is not None and api.stored["spec"] == {"size": 3}
    assert w.conflicts == 1


async def test_an_object_deleted_behind_its_back_is_created_again_for_the_current_node() -> None:
    api = MemoryClient()
    w = writer(api)
    await w.sync(build, [status_of("a")])
    first = api.stored
    api.delete()
    api.nodes[NODE] = "uid-2"  # the Node was re-created meanwhile
    api.calls.clear()
    assert await w.sync(build, [status_of("b")]) == CREATED  # no verify: the write finds it gone
    assert api.calls == ["patch_status", "node", "create", "patch_status"]
    assert api.stored is not None and first is not None
    assert api.stored["metadata"]["uid"] != first["metadata"]["uid"]
    assert api.stored["metadata"]["ownerReferences"][0]["uid"] == "uid-2"
    assert api.stored["status"] == {"value": "b"}
    assert w.conflicts == 1


async def test_verify_finds_a_deleted_object_and_creates_it() -> None:
    api = MemoryClient()
    w = writer(api)
    await w.sync(build, [status_of("a")])
    api.delete()
    assert await w.sync(build, [status_of("a")]) == UNCHANGED  # trusts memory
    assert api.stored is None
    assert await w.sync(build, [status_of("a")], verify=True) == CREATED
    assert api.stored is not None and api.stored["status"] == {"value": "a"}


async def test_an_object_created_meanwhile_is_compared_not_overwritten() -> None:
    api = MemoryClient()
    w = writer(api)
    assert await w.sync(None, []) == ABSENT  # the writer now knows the object absent
    await api.create(build("uid-1"))
    api.edit(team="infra")
    api.calls.clear()
    assert await w.sync(build, [status_of("a")]) == "status patched"
    assert api.calls == ["node", "create", "get", "patch_status"]
    assert api.stored is not None and api.stored["metadata"]["labels"] == {"team": "infra"}
    assert (w.writes, w.conflicts) == (1, 0)


async def test_gives_up_with_a_conflict_when_the_object_keeps_changing() -> None:
    api = MemoryClient()
    w = writer(api)
    await w.sync(build, [status_of("a")])
    original = api.patch_status

    async def always_stale(body: Obj) -> Obj:
        api.edit(by="someone")
        return await original(body)

    api.patch_status = always_stale  # type: ignore[method-assign]
    with pytest.raises(KubeApiError) as gave_up:
        await w.sync(build, [status_of("b")])
    assert gave_up.value.status == 409 and "Widget w-n1 keeps changing" in str(gave_up.value.reason)
    assert api.calls.count("patch_status") == 1 + ATTEMPTS
    assert w.conflicts == ATTEMPTS


# -- the Node ------------------------------------------------------------------------------------------------


async def test_no_object_while_its_node_is_missing_when_it_needs_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = MemoryClient(nodes={})
    w = writer(api)
    with caplog.at_level(logging.WARNING):
        assert await w.sync(build, [status_of("a")], verify=True) == ABSENT
        assert await w.sync(build, [status_of("a")]) == ABSENT  # not looked for again until verify
        assert await w.sync(build, [status_of("a")], verify=True) == ABSENT
    assert api.calls == ["node", "get", "node", "get"]
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["Node n1 not found: Widget w-n1 is not created until it exists"]  # once
    api.nodes[NODE] = "uid-9"
    assert await w.sync(build, [status_of("a")], verify=True) == CREATED
    assert api.stored is not None and api.stored["metadata"]["ownerReferences"][0]["uid"] == "uid-9"


async def test_an_ownerless_object_until_the_node_appears_when_it_does_not_need_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = MemoryClient(nodes={})
    w = writer(api, needs_node=False)

    def owned(current: Obj, uid: str | None) -> Change | None:
        wanted = build(uid)["metadata"].get("ownerReferences")
        if uid is None or current["metadata"].get("ownerReferences") == wanted:
            return None
        return Change("patch", {"metadata": {"ownerReferences": wanted}})

    with caplog.at_level(logging.WARNING):
        assert await w.sync(build, [owned]) == CREATED
        assert await w.sync(build, [owned]) == UNCHANGED
    assert api.stored is not None and "ownerReferences" not in api.stored["metadata"]
    assert api.calls == ["node", "get", "create", "node"]  # looked for at every sync
    assert [r.getMessage() for r in caplog.records] == ["Node n1 not found: its Widget gets no owner"]
    api.nodes[NODE] = "uid-3"
    assert await w.sync(build, [owned]) == "patched"
    assert api.stored["metadata"]["ownerReferences"][0]["uid"] == "uid-3"


# -- updates only, failures ----------------------------------------------------------------------------------


async def test_without_build_it_only_updates_and_never_creates() -> None:
    api = MemoryClient()
    w = writer(api)
    assert await w.sync(None, [status_of("a")]) == ABSENT
    assert api.calls == ["get"]  # neither the Node nor a create
    await w.sync(build, [status_of("a")])
    assert await w.sync(None, [status_of("stopped")]) == "status patched"
    assert api.stored is not None and api.stored["status"] == {"value": "stopped"}


async def test_a_failure_makes_the_next_sync_read_everything_again() -> None:
    api = MemoryClient()
    w = writer(api)
    await w.sync(build, [status_of("a")])
    api.refuse["patch_status"] = KubeApiError(status=500, reason="Internal")
    with pytest.raises(KubeApiError):
        await w.sync(build, [status_of("b")])
    api.calls.clear()
    assert await w.sync(build, [status_of("b")]) == "status patched"
    assert api.calls == ["node", "get", "patch_status"]


async def test_a_missing_crd_is_an_error_not_a_create_loop() -> None:
    api = MemoryClient()
    api.refuse["create"] = KubeApiError(status=404, reason="NotFound")  # no such resource type
    w = writer(api)
    with pytest.raises(KubeApiError) as missing:
        await w.sync(build, [status_of("a")])
    assert missing.value.status == 404
    assert api.calls == ["node", "get", "create"]
    assert (w.writes, w.current) == (0, None)


async def test_a_write_is_logged_with_its_message_or_its_verb(caplog: pytest.LogCaptureFixture) -> None:
    api = MemoryClient()
    w = writer(api)
    quiet = Change("patch", {"spec": {"size": 5}}, "resized quietly", logging.DEBUG)
    with caplog.at_level(logging.DEBUG, logger="rmd_agent.kube_object_writer"):
        await w.sync(
            build, [status_of("a"), lambda current, _: None if current["spec"]["size"] == 5 else quiet]
        )
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "Widget ns/w-n1 created"),
        (logging.INFO, "Widget w-n1 status patched"),
        (logging.DEBUG, "resized quietly"),
    ]


# -- the NodeResourceTopology's replace ---------------------------------------------------------------------

NRT_REF = ObjectRef(publisher.GROUP, publisher.VERSION, publisher.PLURAL, "NodeResourceTopology", NODE)
FINGERPRINT = "topology.node.k8s.io/fingerprint"


async def publish(w: ObjectWriter, pfp: str, *, verify: bool = False) -> str:
    """What NrtPublisher.publish does, for a topology whose only content is its fingerprint."""
    topology = NodeTopology.of([], {"fingerprint": pfp})
    build, changes = publisher.desired_writes(NODE, topology, {FINGERPRINT: pfp})
    return await w.sync(build, changes, verify=verify)


async def test_nrt_replace_only_on_change_keeping_other_writers_metadata() -> None:
    api = MemoryClient(ref=NRT_REF)
    w = writer(api, needs_node=False)
    assert await publish(w, "pfp-1") == CREATED
    assert api.stored is not None
    api.stored["metadata"]["annotations"]["example.com/other"] = "x"
    api.stored["topologyPolicies"] = ["SingleNUMANodeContainerLevel"]  # deprecated: dropped on replace
    api.edit(team="infra")
    api.calls.clear()
    assert await publish(w, "pfp-1", verify=True) == "replaced"
    assert api.stored["attributes"] == [{"name": "fingerprint", "value": "pfp-1"}]
    assert "topologyPolicies" not in api.stored
    assert api.stored["metadata"]["labels"] == {"team": "infra"}
    assert api.stored["metadata"]["annotations"] == {FINGERPRINT: "pfp-1", "example.com/other": "x"}
    api.calls.clear()
    assert await publish(w, "pfp-1") == UNCHANGED
    assert await publish(w, "pfp-2") == "replaced"
    assert api.calls == ["replace"]
    assert api.stored["metadata"]["annotations"][FINGERPRINT] == "pfp-2"


def test_nrt_replace_leaves_the_object_it_read_as_it_was() -> None:
    current = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "metadata": {"name": NODE, "resourceVersion": "7", "annotations": {"example.com/other": "x"}},
        "zones": [{"name": "node-0", "resources": [{"name": "cpu", "available": "4"}]}],
        "attributes": [],
        "topologyPolicies": ["None"],
    }
    before = copy.deepcopy(current)
    desired = publisher.desired_object(
        NODE, NodeTopology.of([], {"fingerprint": "p"}), {FINGERPRINT: "p"}, None
    )
    body = publisher.merged_object(current, desired)
    assert current == before
    assert body["metadata"] == {
        "name": NODE,
        "resourceVersion": "7",
        "annotations": {"example.com/other": "x", FINGERPRINT: "p"},
    }
    assert "topologyPolicies" not in body and body["zones"] == []


async def test_nrt_keeps_its_owner_while_the_node_cannot_be_read() -> None:
    api = MemoryClient(ref=NRT_REF)
    w = writer(api, needs_node=False)
    await publish(w, "pfp-1")
    del api.nodes[NODE]
    api.calls.clear()
    assert await publish(w, "pfp-1", verify=True) == UNCHANGED
    assert api.stored is not None
    assert api.stored["metadata"]["ownerReferences"] == [node_owner_reference(NODE, "uid-1")]
    assert await publish(w, "pfp-2") == "replaced"
    assert api.stored["metadata"]["ownerReferences"] == [node_owner_reference(NODE, "uid-1")]


# -- kube.KubeObjectClient -----------------------------------------------------------------------------------


class Recorder:
    """Stands in for kube_api.KubeApi: records (method, path, query, body, content type) of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, Any, str]] = []
        self.status = 0

    async def call(
        self, method: str, path: str, *, query: Any = None, body: Any = None, content_type: str = JSON
    ) -> Any:
        self.calls.append((method, path, query, body, content_type))
        if self.status:
            raise KubeApiError(status=self.status)
        return {"method": method} if not path.startswith("/api/v1/nodes/") else {"metadata": {"uid": "uid-7"}}


@pytest.mark.parametrize(
    ("namespace", "where"),
    [
        ("ns", "/apis/example.com/v1/namespaces/ns/widgets"),
        (None, "/apis/example.com/v1/widgets"),
    ],
)
async def test_kube_client_requests(namespace: str | None, where: str) -> None:
    ref = ObjectRef("example.com", "v1", "widgets", "Widget", "w", namespace)
    recorder = Recorder()
    kube = KubeObjectClient(recorder, ref, "me")  # type: ignore[arg-type]
    write = {"fieldManager": "me", "fieldValidation": "Strict"}
    await kube.get()
    await kube.create({"b": 1})
    await kube.replace({"b": 2})
    await kube.patch({"b": 3})
    await kube.patch_status({"b": 4})
    assert await kube.node_uid("n1") == "uid-7"
    assert recorder.calls == [
        ("GET", f"{where}/w", None, None, JSON),
        ("POST", where, write, {"b": 1}, JSON),
        ("PUT", f"{where}/w", write, {"b": 2}, JSON),
        ("PATCH", f"{where}/w", write, {"b": 3}, MERGE_PATCH),
        ("PATCH", f"{where}/w/status", write, {"b": 4}, MERGE_PATCH),
        ("GET", "/api/v1/nodes/n1", None, None, JSON),
    ]
    recorder.status = 404
    assert await kube.get() is None and await kube.node_uid("n1") is None
    recorder.status = 409
    with pytest.raises(KubeApiError):
        await kube.get()
