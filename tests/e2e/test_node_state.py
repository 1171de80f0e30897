"""The agent's RmdNodeState on the real control plane: NodeStateWriter runs in-process with a fake engine and
publishes to a real kube-apiserver (CRD crds/rmdnodestates.intel.com.yaml), as an identity that holds
exactly the RBAC documented in docs/node-state.md (applied from the document itself).

Covered: the object and its owner, the original workload map, writes only on change (resourceVersion
stays put), recreation after deletion, repair of an edited status, Ready=False when the engine is not
ready or fails and after stop (the object and its workloads stay), waiting for the Node, garbage
collection with the Node, and that the identity really is limited to what the document grants.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_agent import node_state
from rmd_agent.engine_api import AppliedWorkload, ContainerCpus, EngineUnavailable, NodeSummary
from rmd_agent.kube import api_client_factory
from rmd_agent.node_state import GROUP, PLURAL, VERSION, NodeStateWriter
from rmd_agent.plan.workload import Workload
from rmd_agent.settings import AgentSettings
from rmd_api.node_state import node_state_name
from rmd_sim.control_plane import ControlPlane, repo_root

pytestmark = pytest.mark.e2e

TIMEOUT = 30.0
RESYNC = 0.3  # seconds: verification rounds come quickly, so "nothing was written" means something
AGENT_SA = "rmd-agent"
Obj = dict[str, Any]


# -- a fake engine -------------------------------------------------------------------------------------------


def workload(
    name: str, namespace: str = "apps", *, wid: str, cos: str = "", **fields: Any
) -> AppliedWorkload:
    w = Workload(namespace, name, uid=f"uid-{name}", resolved=True, **fields)
    return AppliedWorkload(w, id=wid, cos_name=cos, pool="guaranteed" if cos else "shared")


@dataclass
class FakeEngine:
    """What the writer asks an Engine, answered from fields the test sets."""

    workloads: list[AppliedWorkload] = field(default_factory=list)
    readiness: tuple[bool, str] = (True, "")
    capabilities: dict[str, tuple[bool, str]] = field(
        default_factory=lambda: {"rdtL3Cat": (True, "11 ways"), "rapl": (False, "no powercap in sysfs")}
    )
    failing: bool = False  # every call raises, as an engine that is shutting down
    asked: int = 0  # ready() calls: one per refresh

    def _check(self) -> None:
        if self.failing:
            raise EngineUnavailable("the engine is closed")

    async def apply(self, workload: Workload) -> tuple[AppliedWorkload, bool]:
        raise NotImplementedError

    async def remove(self, namespace: str, name: str, uid: str = "") -> bool:
        raise NotImplementedError

    async def container_cpus(self, namespace: str, pod: str, uid: str, container: str) -> ContainerCpus:
        raise NotImplementedError

    async def list(self) -> list[AppliedWorkload]:
        self._check()
        return list(self.workloads)

    async def node(self) -> NodeSummary:
        self._check()
        return NodeSummary("n", dict(self.capabilities), 8, 1, (), 16, 1, len(self.workloads))

    async def ready(self) -> tuple[bool, str]:
        self.asked += 1
        self._check()
        return self.readiness


def two_workloads() -> list[AppliedWorkload]:
    return [
        workload(
            "gold-db", wid="1", cos="COS1", core_ids=frozenset({4, 5, 6, 7}), cache_max=2, cache_min=2,
            mba_percentage=50, policy="gold",
        ),
        workload("batch", wid="2", core_ids=frozenset({9}), pstate_ratio=3.0, pstate_monitoring="on"),
    ]  # fmt: skip


# -- cluster fixtures ----------------------------------------------------------------------------------------


@dataclass
class Cluster:
    cp: ControlPlane
    admin: Any  # ApiClient as cluster admin, for the test's own reads and edits
    namespace: str
    agent_kubeconfig: Path  # the agent's identity, with exactly the documented RBAC

    async def _objects(self, method: str, *args: Any, **kwargs: Any) -> Any:
        api = client.CustomObjectsApi(self.admin)
        return await asyncio.to_thread(getattr(api, method), GROUP, VERSION, *args, **kwargs)

    async def get(self, node: str, namespace: str | None = None) -> Obj | None:
        try:
            result: Obj = await self._objects(
                "get_namespaced_custom_object", namespace or self.namespace, PLURAL, node_state_name(node)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def delete(self, node: str) -> None:
        await self._objects("delete_namespaced_custom_object", self.namespace, PLURAL, node_state_name(node))

    async def patch_status(self, node: str, patch: Obj) -> None:
        await self._objects(
            "patch_namespaced_custom_object_status",
            self.namespace,
            PLURAL,
            node_state_name(node),
            {"status": patch},
            _content_type="application/merge-patch+json",
        )

    async def label(self, node: str, labels: dict[str, str]) -> None:
        await self._objects(
            "patch_namespaced_custom_object",
            self.namespace,
            PLURAL,
            node_state_name(node),
            {"metadata": {"labels": labels}},
            _content_type="application/merge-patch+json",
        )

    def create_node(self, name: str) -> str:
        node = client.CoreV1Api(self.admin).create_node(
            client.V1Node(metadata=client.V1ObjectMeta(name=name))
        )
        assert node.metadata is not None and node.metadata.uid
        return node.metadata.uid

    def delete_node(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            client.CoreV1Api(self.admin).delete_node(name)

    def settings(self, node: str, **overrides: Any) -> AgentSettings:
        values: dict[str, Any] = {
            "node_name": node,
            "node_state_namespace": self.namespace,
            "advertise_address": "10.0.0.5",
            "grpc_listen": "0.0.0.0:50051",
            "node_state_resync_seconds": RESYNC,
            "kubeconfig": str(self.agent_kubeconfig),
        }
        values.update(overrides)
        return AgentSettings(**values)


def documented_rbac() -> list[Obj]:
    """The RBAC manifests of docs/node-state.md, parsed from the document."""
    text = (repo_root() / "docs" / "node-state.md").read_text()
    section = text.split("\n## RBAC\n", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    return [doc for doc in yaml.safe_load_all(block) if doc]


def rbac_for(namespace: str) -> list[Obj]:
    """The documented manifests for the agent ServiceAccount in `namespace`; cluster-scoped names suffixed
    so tests do not share them."""
    docs = documented_rbac()
    assert sorted(d["kind"] for d in docs) == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    for doc in docs:
        if doc["kind"] in ("Role", "RoleBinding"):
            doc["metadata"]["namespace"] = namespace
        else:
            doc["metadata"]["name"] += f"-{namespace}"
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] += f"-{namespace}"
        for subject in doc.get("subjects", ()):
            assert subject == {"kind": "ServiceAccount", "name": AGENT_SA, "namespace": "rmd"}
            subject["namespace"] = namespace
    return docs


@pytest.fixture
def cluster(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Cluster]:
    manifests = tmp_path / "rbac.yaml"
    manifests.write_text(yaml.safe_dump_all(rbac_for(namespace)))
    control_plane.kubectl("apply", "-f", str(manifests))
    # A client certificate for the ServiceAccount's user name: RBAC matches ServiceAccount subjects by it.
    kubeconfig = control_plane.kubeconfig_for(
        f"system:serviceaccount:{namespace}:{AGENT_SA}",
        ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
        path=tmp_path / "agent.kubeconfig",
    )
    with control_plane.api_client() as admin:
        try:
            yield Cluster(control_plane, admin, namespace, kubeconfig)
        finally:
            control_plane.kubectl("delete", "--ignore-not-found", "-f", str(manifests), check=False)


@pytest.fixture
def node_name(cluster: Cluster) -> Iterator[str]:
    name = f"ns-{uuid.uuid4().hex[:8]}"
    yield name
    cluster.delete_node(name)


@contextlib.asynccontextmanager
async def writing(
    settings: AgentSettings, engine: FakeEngine, **options: Any
) -> AsyncIterator[NodeStateWriter]:
    writer = NodeStateWriter(settings, engine, api_client_factory(settings), **options)
    task = asyncio.create_task(writer.run())
    try:
        yield writer
    finally:
        writer.stop()
        await asyncio.wait_for(task, TIMEOUT)


async def eventually(probe: Callable[[], Awaitable[Any]], what: str, within: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.05)


def ready_of(obj: Obj | None) -> Obj | None:
    for condition in ((obj or {}).get("status") or {}).get("conditions") or ():
        if condition["type"] == "Ready":
            result: Obj = condition
            return result
    return None


async def published(cluster: Cluster, node: str, status: str = "True", reason: str = "AgentReady") -> Obj:
    async def probe() -> Obj | None:
        obj = await cluster.get(node)
        condition = ready_of(obj)
        return obj if condition and (condition["status"], condition["reason"]) == (status, reason) else None

    result: Obj = await eventually(probe, f"RmdNodeState of {node} with Ready={status} ({reason})")
    return result


async def rounds(writer: NodeStateWriter, count: int) -> None:
    """Wait until the writer has completed `count` more refreshes."""
    target = writer.syncs + count

    async def done() -> bool:
        return writer.syncs >= target

    await eventually(done, f"{count} refreshes")


async def wrote(writer: NodeStateWriter, count: int) -> int:
    """`writer.writes` once it reached `count`, or after 2 s: the API server shows a write a moment before the
    writer has its answer and counts it."""

    async def reached() -> bool:
        return writer.writes >= count

    with contextlib.suppress(AssertionError):
        await eventually(reached, f"{count} writes", within=2.0)
    return writer.writes


# -- tests ---------------------------------------------------------------------------------------------------


async def test_publishes_the_node_state_with_owner_and_original_workload_map(
    cluster: Cluster, node_name: str
) -> None:
    uid = cluster.create_node(node_name)
    async with writing(cluster.settings(node_name), FakeEngine(two_workloads())):
        obj = await published(cluster, node_name)
    meta = obj["metadata"]
    assert meta["name"] == f"rmd-node-state-{node_name}" and meta["namespace"] == cluster.namespace
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": uid}]
    assert obj["spec"] == {"node": node_name, "nodeUid": uid}
    status = obj["status"]
    assert status["endpoint"] == "10.0.0.5:50051"
    assert status["capabilities"] == {
        "rdtL3Cat": {"supported": True, "detail": "11 ways"},
        "rapl": {"supported": False, "detail": "no powercap in sysfs"},
    }
    assert status["workloads"] == {
        "gold-db": {
            "Namespace": "apps", "ID": "1", "Core IDs": "4-7", "Status": "Successful", "Cos Name": "COS1",
            "Cache Max": "2", "Cache Min": "2", "MBA Percentage": "50", "Origin": "gRPC", "Policy": "gold",
        },
        "batch": {
            "Namespace": "apps", "ID": "2", "Core IDs": "9", "Status": "Successful", "Cache Max": "0",
            "Cache Min": "0", "Origin": "gRPC", "P-State Ratio": "3.000000", "P-State Monitoring": "on",
        },
    }  # fmt: skip


async def test_status_is_written_only_when_it_changes(cluster: Cluster, node_name: str) -> None:
    cluster.create_node(node_name)
    engine = FakeEngine(two_workloads())
    async with writing(cluster.settings(node_name), engine) as writer:
        first = await published(cluster, node_name)
        assert await wrote(writer, 2) == 2  # the create, then the status (ignored on create)
        # Many refreshes, several of them re-reading the object: nothing changed, so nothing is written.
        for _ in range(5):
            writer.notify("test")
            await rounds(writer, 2)
        unchanged = await cluster.get(node_name)
        assert unchanged is not None
        assert unchanged["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        assert writer.writes == 2

        engine.workloads.append(workload("late", wid="3", core_ids=frozenset({10})))
        writer.notify("applied apps/late")

        async def has_late() -> Obj | None:
            obj = await cluster.get(node_name)
            return obj if "late" in obj["status"]["workloads"] else None  # type: ignore[index]

        added = await eventually(has_late, "the new workload")
        assert await wrote(writer, 3) == 3
        assert added["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]

        engine.workloads = [w for w in engine.workloads if w.workload.name != "gold-db"]
        writer.notify("removed apps/gold-db")

        async def without_gold() -> Obj | None:
            obj = await cluster.get(node_name)
            return obj if "gold-db" not in obj["status"]["workloads"] else None  # type: ignore[index]

        removed = await eventually(without_gold, "the removed workload to go")
        assert set(removed["status"]["workloads"]) == {"batch", "late"}
        assert await wrote(writer, 4) == 4


async def test_a_writer_told_of_every_change_asks_the_engine_only_then(
    cluster: Cluster, node_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an engine that notifies every change (the agent's), a quiet node costs no engine reads between
    resyncs; a change still shows at once, and an engine that is not ready is asked until it is."""
    monkeypatch.setattr(node_state, "ENGINE_POLL_SECONDS", 0.05)
    cluster.create_node(node_name)
    engine = FakeEngine(two_workloads())
    settings = cluster.settings(node_name, node_state_resync_seconds=600.0)
    async with writing(settings, engine, poll_engine=False) as writer:
        await published(cluster, node_name)
        asked = engine.asked
        await asyncio.sleep(1.0)
        assert engine.asked == asked

        engine.workloads.append(workload("late", wid="3", core_ids=frozenset({10})))
        writer.notify("applied apps/late")
        told = time.monotonic()

        async def has_late() -> Obj | None:
            obj = await cluster.get(node_name)
            return obj if obj and "late" in obj["status"]["workloads"] else None

        await eventually(has_late, "the new workload")
        assert time.monotonic() - told < 1.0

        engine.readiness = (False, "resctrl is not mounted")
        writer.notify("readiness")
        await published(cluster, node_name, "False", "EngineNotReady")
        engine.readiness = (True, "")  # recovers without a notification: still asked, so it shows
        await published(cluster, node_name)
        await asyncio.sleep(0.3)
        asked = engine.asked
        await asyncio.sleep(0.5)
        assert engine.asked == asked


async def test_engine_not_ready_or_failing_shows_in_ready_and_keeps_the_workloads(
    cluster: Cluster, node_name: str
) -> None:
    cluster.create_node(node_name)
    engine = FakeEngine(two_workloads())
    async with writing(cluster.settings(node_name), engine) as writer:
        ready = await published(cluster, node_name)
        engine.readiness = (False, "the CPU supports RDT but resctrl is not mounted at /sys/fs/resctrl")
        writer.notify()
        not_ready = await published(cluster, node_name, "False", "EngineNotReady")
        condition = ready_of(not_ready)
        assert condition is not None
        assert condition["message"] == engine.readiness[1]
        assert condition["lastTransitionTime"] >= ready_of(ready)["lastTransitionTime"]  # type: ignore[index]

        engine.failing = True
        writer.notify()
        failing = await published(cluster, node_name, "False", "EngineUnavailable")
        assert ready_of(failing)["message"] == "the engine is closed"  # type: ignore[index]
        # An engine that cannot answer says nothing about the workloads: the map stays as it was.
        assert failing["status"]["workloads"] == ready["status"]["workloads"]
        assert failing["status"]["capabilities"] == ready["status"]["capabilities"]


async def test_stop_marks_not_ready_and_keeps_the_object(cluster: Cluster, node_name: str) -> None:
    cluster.create_node(node_name)
    async with writing(cluster.settings(node_name), FakeEngine(two_workloads())):
        before = await published(cluster, node_name)
    after = await cluster.get(node_name)
    assert after is not None, "the object must stay for the operator's cleanup"
    condition = ready_of(after)
    assert condition is not None and (condition["status"], condition["reason"]) == ("False", "AgentStopped")
    assert after["status"]["workloads"] == before["status"]["workloads"]
    assert after["status"]["endpoint"] == before["status"]["endpoint"]


async def test_recreated_after_deletion_and_repaired_after_an_edit(cluster: Cluster, node_name: str) -> None:
    cluster.create_node(node_name)
    async with writing(cluster.settings(node_name), FakeEngine(two_workloads())):
        first = await published(cluster, node_name)
        await cluster.delete(node_name)

        async def recreated() -> Obj | None:
            obj = await cluster.get(node_name)
            is_new = obj is not None and obj["metadata"]["uid"] != first["metadata"]["uid"]
            return obj if is_new and ready_of(obj) else None

        again = await eventually(recreated, "the object to be recreated")
        assert again["status"]["workloads"] == first["status"]["workloads"]

        await cluster.patch_status(node_name, {"workloads": {"gold-db": None}, "endpoint": "10.9.9.9:1"})

        async def repaired() -> Obj | None:
            obj = await cluster.get(node_name)
            status = (obj or {}).get("status") or {}
            return (
                obj
                if "gold-db" in status.get("workloads", {}) and status["endpoint"] != "10.9.9.9:1"
                else None
            )

        fixed = await eventually(repaired, "the edited status to be written back")
        assert fixed["status"]["endpoint"] == "10.0.0.5:50051"


async def test_a_stale_read_is_never_written_over_a_change(cluster: Cluster, node_name: str) -> None:
    """With no resync in sight the writer trusts its memory; its conditional patches then meet an object
    someone else changed (409) or deleted (404), and it re-reads instead of overwriting."""
    cluster.create_node(node_name)
    engine = FakeEngine(two_workloads())
    async with writing(cluster.settings(node_name, node_state_resync_seconds=600.0), engine) as writer:
        await published(cluster, node_name)
        await cluster.label(node_name, {"team": "infra"})
        engine.workloads.append(workload("late", wid="3", core_ids=frozenset({10})))
        writer.notify("applied apps/late")

        async def has_late() -> Obj | None:
            obj = await cluster.get(node_name)
            return obj if obj and "late" in obj["status"]["workloads"] else None

        obj = await eventually(has_late, "the new workload")
        assert writer.conflicts == 1
        assert obj["metadata"]["labels"]["team"] == "infra"

        await cluster.delete(node_name)
        engine.workloads.pop()
        writer.notify("removed apps/late")

        async def recreated() -> Obj | None:
            obj = await cluster.get(node_name)
            return obj if obj and ready_of(obj) and "late" not in obj["status"]["workloads"] else None

        await eventually(recreated, "the object to be recreated at once")
        assert writer.conflicts == 2


async def test_waits_for_its_node_and_goes_with_it(cluster: Cluster, node_name: str) -> None:
    async with writing(cluster.settings(node_name), FakeEngine(two_workloads())) as writer:
        await rounds(writer, 5)
        assert await cluster.get(node_name) is None, "no object (so no orphan) while the Node does not exist"
        assert writer.writes == 0
        uid = cluster.create_node(node_name)
        obj = await published(cluster, node_name)
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
    # The agent stopped (Ready=False); deleting the Node lets the garbage collector delete the object.
    cluster.delete_node(node_name)

    async def gone() -> bool:
        return await cluster.get(node_name) is None

    await eventually(gone, "garbage collection with the Node", within=60.0)


async def test_the_identity_has_only_the_documented_access(cluster: Cluster, node_name: str) -> None:
    cluster.create_node(node_name)
    # Elsewhere than its namespace the agent may not write: the writer keeps failing and creates nothing.
    outside = cluster.settings(node_name, node_state_namespace="default")
    async with writing(outside, FakeEngine(two_workloads())) as writer:

        async def failed_twice() -> bool:
            return writer.failures >= 2

        await eventually(failed_twice, "refused writes")
        assert writer.writes == 0
    assert await cluster.get(node_name, namespace="default") is None

    with cluster.cp.api_client(cluster.agent_kubeconfig) as agent:
        objects = client.CustomObjectsApi(agent)
        for attempt in (
            lambda: objects.list_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL),
            lambda: objects.delete_namespaced_custom_object(
                GROUP, VERSION, cluster.namespace, PLURAL, node_state_name(node_name)
            ),
            lambda: client.CoreV1Api(agent).list_node(),
            lambda: client.CoreV1Api(agent).patch_node(node_name, {"metadata": {"labels": {"x": "y"}}}),
        ):
            with pytest.raises(ApiException) as refused:
                await asyncio.to_thread(attempt)
            assert refused.value.status == 403
