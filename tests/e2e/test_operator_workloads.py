"""The operator against a real API server and fake agents: RmdWorkloads applied, re-applied, removed.

Each test runs `rmd-operator run --standalone` as a subprocess scoped to the test's namespace, with short
intervals. The three nodes worker-node-1..3 are Node objects labelled like NFD labels RDT nodes; each has an
RmdNodeState (in the test's namespace) that the test writes the way an agent would, pointing at a fake agent:
a real grpc.aio server in this process implementing rmd.agent.v1.Agent with mTLS (certificates from
rmd_sim.pki), which checks the operator's client identity the way the agent does and keeps workloads in
memory. The fake agents run on their own event loop in a background thread, so the tests themselves are
plain synchronous code polling the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube_clients import KubeClients
from operator_process import OperatorProcess, operator_command
from rmd_agent.server.tls import is_allowed
from rmd_api.agent.v1 import agent_pb2, agent_pb2_grpc
from rmd_api.cpuset import parse_cpu_list
from rmd_sim import pki
from rmd_sim.control_plane import ControlPlane

pytestmark = pytest.mark.e2e

GROUP, VERSION = "intel.com", "v1alpha1"
NODES = ("worker-node-1", "worker-node-2", "worker-node-3")
RDT_LABEL = {"feature.node.kubernetes.io/cpu-rdt.RDTL3CA": "true"}
OPERATOR_IDENTITY = "rmd-operator"
FINALIZER = "intel.com/rmd-operator"
GUARANTEED = {"rdt": {"cache": {"max": 2, "min": 2}}}
WAIT = 30.0
# Short intervals: drift checks and retries within seconds.
FAST = {
    "drift_interval_seconds": "2",
    "retry_initial_seconds": "0.5",
    "retry_max_seconds": "2",
    "agent_call_timeout_seconds": "2",
    "watch_timeout_seconds": "10",
}
_T = TypeVar("_T")
Obj = dict[str, Any]
_add_servicer: Any = agent_pb2_grpc.add_AgentServicer_to_server  # generated without annotations


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- fake agents -----------------------------------------------------------------------------------------


class AgentLoop:
    """An event loop in a background thread, hosting the fake agents' gRPC servers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fake-agents", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=15)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class FakeAgent:
    """rmd.agent.v1.Agent for one node. mTLS (a server certificate for `identity`, client certificates from
    the CA, the operator's identity required) unless `tls` is False."""

    def __init__(
        self,
        loop: AgentLoop,
        ca: pki.CertificateAuthority,
        node: str,
        *,
        tls: bool = True,
        identity: str = "",
    ) -> None:
        self.node = node
        self.port = free_port()
        self._loop = loop
        self._lock = threading.Lock()
        self._workloads: dict[tuple[str, str], agent_pb2.Workload] = {}
        self._next_id = 1
        self.calls: list[str] = []
        self.reject: tuple[grpc.StatusCode, str] | None = None
        self._server: grpc.aio.Server | None = None
        self._credentials: grpc.ServerCredentials | None = None
        if tls:
            name = identity or f"rmd-agent.{node}"
            pair = ca.issue_server(name, dns_names=[name], ip_addresses=[])
            self._credentials = grpc.ssl_server_credentials(
                [(pair.key_pem, pair.cert_pem)], root_certificates=ca.cert_pem, require_client_auth=True
            )

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- test side (any thread)

    def start(self) -> FakeAgent:
        self._loop.run(self._start())
        return self

    def stop(self) -> None:
        self._loop.run(self._stop())

    def holds(self, namespace: str, name: str) -> agent_pb2.Workload | None:
        with self._lock:
            w = self._workloads.get((namespace, name))
            return agent_pb2.Workload.FromString(w.SerializeToString()) if w is not None else None

    def names(self) -> set[tuple[str, str]]:
        with self._lock:
            return set(self._workloads)

    def lose(self, namespace: str, name: str) -> None:
        with self._lock:
            del self._workloads[(namespace, name)]

    def seed(self, namespace: str, name: str, uid: str) -> None:
        with self._lock:
            self._store(
                agent_pb2.WorkloadRef(namespace=namespace, name=name, uid=uid), agent_pb2.WorkloadSpec()
            )

    def count(self, method: str) -> int:
        with self._lock:
            return self.calls.count(method)

    # -- server side (the agents' loop)

    async def _start(self) -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        _add_servicer(_Service(self), server)
        address = f"127.0.0.1:{self.port}"
        if self._credentials is None:
            server.add_insecure_port(address)
        else:
            server.add_secure_port(address, self._credentials)
        await server.start()
        self._server = server

    async def _stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    def _store(
        self, ref: agent_pb2.WorkloadRef, spec: agent_pb2.WorkloadSpec
    ) -> tuple[agent_pb2.Workload, bool]:
        key = (ref.namespace, ref.name)
        old = self._workloads.get(key)
        if old is not None and old.ref.uid == ref.uid and old.spec == spec:
            return old, False
        if old is None:
            workload_id, self._next_id = self._next_id, self._next_id + 1
        else:
            workload_id = int(old.id)
        cpus: set[int] = set()
        for item in spec.core_ids:
            cpus |= parse_cpu_list(item)
        w = agent_pb2.Workload(
            ref=ref, spec=spec, id=str(workload_id), cos_name=f"COS{workload_id + 1}", status="Successful"
        )
        w.cpus.extend(sorted(cpus))
        self._workloads[key] = w
        return w, True


class _Service(agent_pb2_grpc.AgentServicer):
    def __init__(self, agent: FakeAgent) -> None:
        self.agent = agent

    async def _admit(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        with self.agent._lock:
            self.agent.calls.append(method)
        if self.agent._credentials is not None:
            names = tuple(name.decode() for name in context.auth_context().get("peer_dns", ()))
            if not is_allowed(names, frozenset({OPERATOR_IDENTITY})):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"client {names} not allowed")

    async def ApplyWorkload(
        self, request: agent_pb2.ApplyWorkloadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> agent_pb2.ApplyWorkloadResponse:
        await self._admit("ApplyWorkload", context)
        if self.agent.reject is not None:
            await context.abort(*self.agent.reject)
        with self.agent._lock:
            w, changed = self.agent._store(request.ref, request.spec)
        return agent_pb2.ApplyWorkloadResponse(workload=w, changed=changed)

    async def RemoveWorkload(
        self, request: agent_pb2.RemoveWorkloadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> agent_pb2.RemoveWorkloadResponse:
        await self._admit("RemoveWorkload", context)
        key = (request.ref.namespace, request.ref.name)
        with self.agent._lock:
            held = self.agent._workloads.get(key)
            found = held is not None and (not request.ref.uid or held.ref.uid == request.ref.uid)
            if found:
                del self.agent._workloads[key]
        return agent_pb2.RemoveWorkloadResponse(found=found)

    async def ListWorkloads(
        self, request: agent_pb2.ListWorkloadsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> agent_pb2.ListWorkloadsResponse:
        await self._admit("ListWorkloads", context)
        with self.agent._lock:
            return agent_pb2.ListWorkloadsResponse(workloads=list(self.agent._workloads.values()))


# --- fixtures --------------------------------------------------------------------------------------------


@dataclass
class Pki:
    ca: pki.CertificateAuthority
    ca_file: Path
    cert_file: Path
    key_file: Path


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    ca = pki.CertificateAuthority("rmd-test-ca")
    operator = ca.issue_client(OPERATOR_IDENTITY, dns_names=[OPERATOR_IDENTITY])
    directory = tmp_path_factory.mktemp("operator-tls")
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    (directory / "tls.crt").write_bytes(operator.cert_pem)
    (directory / "tls.key").write_bytes(operator.key_pem)
    (directory / "tls.key").chmod(0o600)
    return Pki(ca, directory / "ca.crt", directory / "tls.crt", directory / "tls.key")


@pytest.fixture(scope="module")
def agent_loop() -> Iterator[AgentLoop]:
    loop = AgentLoop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Iterator[Any]:
    with control_plane.api_client() as api_client:
        yield api_client


@pytest.fixture(scope="module")
def cluster_nodes(api: Any) -> Iterator[None]:
    """worker-node-1..3 as Node objects (no kubelet behind them), labelled as NFD labels RDT nodes."""
    core = client.CoreV1Api(api)
    for node in NODES:
        with contextlib.suppress(ApiException):
            core.delete_node(node)
        wait_for(partial(_node_gone, core, node), what=f"old node {node} gone")
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node, labels=dict(RDT_LABEL))))
    yield
    for node in NODES:
        with contextlib.suppress(ApiException):
            core.delete_node(node)


def _node_gone(core: Any, node: str) -> bool:
    try:
        core.read_node(node)
    except ApiException as exc:
        return bool(exc.status == 404)
    return False


@pytest.fixture(autouse=True)
def _reset_node_labels(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "cluster_nodes" in request.fixturenames:
        for node in NODES:
            set_labels(request.getfixturevalue("api"), node, dict(RDT_LABEL))


@dataclass
class Env(KubeClients):
    api: Any
    namespace: str
    tls: Pki
    loop: AgentLoop
    control_plane: ControlPlane
    tmp: Path
    operators: list[OperatorProcess]
    agents: list[FakeAgent]

    def agent(self, node: str, *, tls: bool = True, identity: str = "", start: bool = True) -> FakeAgent:
        fake = FakeAgent(self.loop, self.tls.ca, node, tls=tls, identity=identity)
        self.agents.append(fake)
        return fake.start() if start else fake

    def operator(self, **settings: str) -> OperatorProcess:
        liveness = free_port()
        flags = {
            **FAST,
            "namespaces": self.namespace,
            "node_state_namespace": self.namespace,
            "agent_ca": str(self.tls.ca_file),
            "client_cert": str(self.tls.cert_file),
            "client_key": str(self.tls.key_file),
            "liveness_listen": f"127.0.0.1:{liveness}",
            "log_level": "debug",
            **settings,
        }
        argv = [*operator_command(), "run", "--standalone"]
        for key, value in flags.items():
            flag = "--" + key.replace("_", "-")
            argv += [flag] if value == "true" else [f"--no-{flag[2:]}"] if value == "false" else [flag, value]
        log_path = self.tmp / f"operator-{len(self.operators)}.log"
        proc = OperatorProcess(argv, self.control_plane.env(), log_path, liveness)
        self.operators.append(proc)
        proc.wait_alive()
        return proc

    # -- RmdNodeStates, written here the way each node's agent writes its own

    def node_state(
        self, node: str, endpoint: str, *, rdt: bool = True, ready: bool = True, reason: str = "Ready"
    ) -> None:
        name = f"rmd-node-state-{node}"
        with contextlib.suppress(ApiException):
            self.objects.create_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                "rmdnodestates",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "RmdNodeState",
                    "metadata": {"name": name},
                    "spec": {"node": node},
                },
            )
        status = {
            "endpoint": endpoint,
            "capabilities": {
                "resctrlMounted": {"supported": rdt, "detail": "/sys/fs/resctrl" if rdt else "not mounted"},
                "rdtL3Cat": {
                    "supported": rdt,
                    "detail": "11 ways (cbm_mask 7ff)" if rdt else "no L3 cache allocation on this CPU",
                },
                "mba": {"supported": rdt, "detail": "10% steps" if rdt else "no MBA"},
                "cpufreq": {"supported": True, "detail": "intel_pstate"},
            },
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": reason,
                    "message": "serving" if ready else "engine starting",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
        self.objects.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            self.namespace,
            "rmdnodestates",
            name,
            {"status": status},
            _content_type="application/merge-patch+json",
        )

    def agents_for(self, *nodes: str, **kwargs: Any) -> dict[str, FakeAgent]:
        out = {}
        for node in nodes:
            out[node] = self.agent(node, **kwargs)
            self.node_state(node, out[node].endpoint)
        return out

    # -- RmdWorkloads

    def create(self, name: str, spec: Obj) -> Obj:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "RmdWorkload",
            "metadata": {"name": name},
            "spec": spec,
        }
        created: Obj = self.objects.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "rmdworkloads", body
        )
        return created

    def get(self, name: str) -> Obj | None:
        try:
            got: Obj = self.objects.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "rmdworkloads", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return got

    def patch_spec(self, name: str, spec: Obj) -> Obj:
        patched: Obj = self.objects.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            "rmdworkloads",
            name,
            {"spec": spec},
            _content_type="application/merge-patch+json",
        )
        return patched

    def delete(self, name: str) -> None:
        self.objects.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, "rmdworkloads", name)

    def states(self, name: str) -> dict[str, Obj]:
        obj = self.get(name) or {}
        return dict((obj.get("status") or {}).get("workloadStates") or {})

    def events(self, name: str) -> list[tuple[str, str, str]]:
        events = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}")
        return [(e.type, e.reason, e.message or "") for e in events.items]

    def wait(self, predicate: Callable[[], _T | None], what: str, timeout: float = WAIT) -> _T:
        return wait_for(predicate, what=what, timeout=timeout, logs=self.operators)

    def wait_states(self, name: str, expected: dict[str, str], timeout: float = WAIT) -> dict[str, Obj]:
        """Wait until the workload's status has exactly these nodes with these statuses."""

        def check() -> dict[str, Obj] | None:
            states = self.states(name)
            got = {node: str(entry.get("status")) for node, entry in states.items()}
            return states if got == expected else None

        return self.wait(check, f"{name} states {expected}; now {self.states(name)}", timeout)

    def wait_event(
        self, name: str, reason: str, contains: str = "", timeout: float = WAIT
    ) -> tuple[str, str, str]:
        def check() -> tuple[str, str, str] | None:
            return next((e for e in self.events(name) if e[1] == reason and contains in e[2]), None)

        return self.wait(check, f"event {reason} ({contains!r}) on {name}; have {self.events(name)}", timeout)


def wait_for(
    predicate: Callable[[], _T | None],
    *,
    what: str,
    timeout: float = WAIT,
    logs: list[OperatorProcess] | None = None,
) -> _T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = "\n".join(p.log()[-6000:] for p in logs or [])
            raise AssertionError(f"timed out waiting for {what}\n--- operator log ---\n{tail}")
        time.sleep(0.2)


def set_labels(api: Any, node: str, labels: dict[str, str]) -> None:
    core = client.CoreV1Api(api)
    meta = core.read_node(node).metadata
    current: dict[str, str] = (meta.labels if meta is not None else None) or {}
    patch: dict[str, str | None] = {key: None for key in current if key not in labels}
    patch.update(labels)
    core.patch_node(node, {"metadata": {"labels": patch}})


@pytest.fixture
def env(  # noqa: PLR0917  # pytest fixtures take their dependencies as parameters
    control_plane: ControlPlane,
    api: Any,
    namespace: str,
    tls: Pki,
    agent_loop: AgentLoop,
    cluster_nodes: None,
    tmp_path: Path,
) -> Iterator[Env]:
    e = Env(api, namespace, tls, agent_loop, control_plane, tmp_path, [], [])
    try:
        yield e
    finally:
        for proc in e.operators:
            proc.stop()
        for fake in e.agents:
            with contextlib.suppress(Exception):
                fake.stop()
        # With no operator left to remove its finalizer, a leftover workload would keep the namespace
        # Terminating for the rest of the session.
        leftovers = e.objects.list_namespaced_custom_object(GROUP, VERSION, namespace, "rmdworkloads")
        for item in leftovers.get("items", []):
            with contextlib.suppress(ApiException):
                e.objects.patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    "rmdworkloads",
                    item["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                    _content_type="application/merge-patch+json",
                )


# --- tests -----------------------------------------------------------------------------------------------


def test_applies_on_its_nodes_and_reports_each(env: Env) -> None:
    agents = env.agents_for(*NODES)
    env.operator()
    created = env.create(
        "web", {"coreIds": ["0-3", "8"], **GUARANTEED, "nodes": ["worker-node-1", "worker-node-2"]}
    )

    states = env.wait_states("web", {"worker-node-1": "Successful", "worker-node-2": "Successful"})
    uid = created["metadata"]["uid"]
    for node in ("worker-node-1", "worker-node-2"):
        held = agents[node].holds(env.namespace, "web")
        assert held is not None
        assert held.ref.uid == uid  # identified by uid, not by name only
        assert list(held.spec.core_ids) == ["0-3,8"]
        assert (held.spec.cache.max, held.spec.cache.min) == (2, 2)
        entry = states[node]
        assert entry["id"] == held.id
        assert entry["cosName"] == held.cos_name
        assert entry["coreIds"] == ["0-3,8"]
        assert entry["response"] == "Success: OK"
        assert entry["rdt"] == {"cache": {"max": 2, "min": 2}}
    assert agents["worker-node-3"].names() == set()
    assert agents["worker-node-3"].count("ApplyWorkload") == 0

    obj = env.get("web")
    assert obj is not None
    assert obj["status"]["summary"] == "2/2 Successful"
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Applied")
    assert FINALIZER in obj["metadata"]["finalizers"]
    event = env.wait_event("web", "Applied", "worker-node-1")
    assert event[0] == "Normal"

    # The operator wrote nothing to the agents' RmdNodeStates (no finalizers, no annotations).
    state = env.objects.get_namespaced_custom_object(
        GROUP, VERSION, env.namespace, "rmdnodestates", "rmd-node-state-worker-node-1"
    )
    assert not state["metadata"].get("finalizers")
    assert not any("rmd-operator" in k or "kopf" in k for k in (state["metadata"].get("annotations") or {}))


def test_both_spec_layouts_are_one_request(env: Env) -> None:
    agents = env.agents_for("worker-node-1")
    env.operator()
    env.create(
        "v01",
        {
            "coreIds": ["4"],
            "cache": {"max": 1, "min": 1},
            "pstate": {"ratio": "2.0", "monitoring": "on"},
            "nodes": ["worker-node-1"],
        },
    )
    env.create(
        "v03",
        {
            "coreIds": ["5"],
            "rdt": {"cache": {"max": 1, "min": 1}},
            "plugins": {"pstate": {"ratio": "2.0", "monitoring": "on"}},
            "nodes": ["worker-node-1"],
        },
    )
    env.wait_states("v01", {"worker-node-1": "Successful"})
    states = env.wait_states("v03", {"worker-node-1": "Successful"})
    v01 = agents["worker-node-1"].holds(env.namespace, "v01")
    v03 = agents["worker-node-1"].holds(env.namespace, "v03")
    assert v01 is not None and v03 is not None
    v01.spec.ClearField("core_ids")
    v03.spec.ClearField("core_ids")
    assert v01.spec == v03.spec
    assert states["worker-node-1"]["plugins"] == {"pstate": {"ratio": "2.0", "monitoring": "on"}}


def test_rejection_is_failed_with_the_agents_message_and_retried(env: Env) -> None:
    agents = env.agents_for("worker-node-1", "worker-node-2")
    message = "not enough cache left on cache_id 0: 2 ways asked, 1 free in the guaranteed pool"
    agents["worker-node-2"].reject = (grpc.StatusCode.RESOURCE_EXHAUSTED, message)
    env.operator()
    env.create("db", {"coreIds": ["2"], **GUARANTEED, "nodes": ["worker-node-1", "worker-node-2"]})

    states = env.wait_states("db", {"worker-node-1": "Successful", "worker-node-2": "Failed"})
    assert states["worker-node-2"]["response"] == f"Fail: {message}"
    assert "id" not in states["worker-node-2"]
    warning = env.wait_event("db", "Rejected", message)
    assert warning[0] == "Warning"
    assert "worker-node-2" in warning[2]
    obj = env.get("db")
    assert obj is not None
    assert obj["status"]["summary"] == "1/2 Successful, 1 Failed"

    # Capacity may free up: the rejection is retried at the drift interval, and recovery is an Event too.
    agents["worker-node-2"].reject = None
    env.wait_states("db", {"worker-node-1": "Successful", "worker-node-2": "Successful"})
    assert env.wait_event("db", "Recovered", "worker-node-2")[0] == "Normal"


def test_invalid_request_is_not_retried_until_the_spec_changes(env: Env) -> None:
    agents = env.agents_for("worker-node-1")
    agents["worker-node-1"].reject = (
        grpc.StatusCode.INVALID_ARGUMENT,
        "CPUs 200 are not online on this node",
    )
    env.operator()
    env.create("bad", {"coreIds": ["200"], **GUARANTEED, "nodes": ["worker-node-1"]})
    env.wait_states("bad", {"worker-node-1": "Failed"})
    calls = agents["worker-node-1"].count("ApplyWorkload")
    time.sleep(5)  # more than two drift intervals
    assert agents["worker-node-1"].count("ApplyWorkload") == calls
    agents["worker-node-1"].reject = None
    env.patch_spec("bad", {"coreIds": ["2"]})
    env.wait_states("bad", {"worker-node-1": "Successful"})


def test_unreachable_agent_is_pending_and_recovers_without_anyone_acting(env: Env) -> None:
    agents = env.agents_for("worker-node-2")
    down = env.agent("worker-node-1", start=False)  # its RmdNodeState names a port nobody listens on yet
    env.node_state("worker-node-1", down.endpoint)
    env.operator()
    env.create("api", {"coreIds": ["1"], **GUARANTEED, "nodes": ["worker-node-1", "worker-node-2"]})

    states = env.wait_states("api", {"worker-node-1": "Pending", "worker-node-2": "Successful"})
    assert states["worker-node-1"]["response"].startswith("Pending: UNAVAILABLE")
    assert env.wait_event("api", "AgentUnreachable", "worker-node-1")[0] == "Warning"
    assert agents["worker-node-2"].holds(env.namespace, "api") is not None  # not held up by worker-node-1

    down.start()  # nothing else changes: the operator's backoff retries find it
    env.wait_states("api", {"worker-node-1": "Successful", "worker-node-2": "Successful"})
    assert down.holds(env.namespace, "api") is not None
    assert env.wait_event("api", "Recovered", "worker-node-1")[0] == "Normal"


def test_node_selector_takes_precedence_over_nodes(env: Env) -> None:
    agents = env.agents_for(*NODES)
    for node in ("worker-node-1", "worker-node-3"):
        set_labels(env.api, node, {**RDT_LABEL, "tier": "gold"})
    env.operator()
    env.create(
        "sel", {"coreIds": ["6"], **GUARANTEED, "nodes": ["worker-node-2"], "nodeSelector": {"tier": "gold"}}
    )
    env.wait_states("sel", {"worker-node-1": "Successful", "worker-node-3": "Successful"})
    assert agents["worker-node-2"].names() == set()


def test_node_removed_from_spec_loses_the_workload(env: Env) -> None:
    agents = env.agents_for("worker-node-1", "worker-node-2")
    env.operator()
    env.create("svc", {"coreIds": ["3"], **GUARANTEED, "nodes": ["worker-node-1", "worker-node-2"]})
    env.wait_states("svc", {"worker-node-1": "Successful", "worker-node-2": "Successful"})

    env.patch_spec("svc", {"nodes": ["worker-node-1"]})
    env.wait_states("svc", {"worker-node-1": "Successful"})
    assert agents["worker-node-2"].names() == set()
    assert agents["worker-node-1"].holds(env.namespace, "svc") is not None
    assert env.wait_event("svc", "Removed", "worker-node-2")[0] == "Normal"


def test_relabelled_node_loses_the_workload(env: Env) -> None:
    agents = env.agents_for("worker-node-1", "worker-node-2")
    for node in ("worker-node-1", "worker-node-2"):
        set_labels(env.api, node, {**RDT_LABEL, "cache": "pinned"})
    env.operator()
    env.create("lbl", {"coreIds": ["3"], **GUARANTEED, "nodeSelector": {"cache": "pinned"}})
    env.wait_states("lbl", {"worker-node-1": "Successful", "worker-node-2": "Successful"})

    set_labels(env.api, "worker-node-2", dict(RDT_LABEL))
    env.wait_states("lbl", {"worker-node-1": "Successful"})
    assert agents["worker-node-2"].names() == set()

    set_labels(env.api, "worker-node-2", {**RDT_LABEL, "cache": "pinned"})  # and back
    env.wait_states("lbl", {"worker-node-1": "Successful", "worker-node-2": "Successful"})


def test_delete_removes_it_from_every_node(env: Env) -> None:
    agents = env.agents_for(*NODES)
    env.operator()
    env.create("gone", {"coreIds": ["7"], **GUARANTEED, "nodes": list(NODES)})
    env.wait_states("gone", dict.fromkeys(NODES, "Successful"))
    env.delete("gone")
    env.wait(lambda: env.get("gone") is None, "the object to be deleted")
    for node in NODES:
        assert agents[node].names() == set(), node


def test_delete_while_the_operator_is_down_is_finished_after_restart(env: Env) -> None:
    agents = env.agents_for(*NODES)
    operator = env.operator()
    created = env.create(
        "late", {"coreIds": ["9"], **GUARANTEED, "nodes": ["worker-node-1", "worker-node-2"]}
    )
    env.wait_states("late", {"worker-node-1": "Successful", "worker-node-2": "Successful"})
    assert operator.stop() == 0

    # While the operator is down: a status write it never made (worker-node-3 holds it, the status does not
    # say so), then the user deletes the object. The finalizer keeps it.
    agents["worker-node-3"].seed(env.namespace, "late", created["metadata"]["uid"])
    env.delete("late")
    time.sleep(1)
    pending = env.get("late")
    assert pending is not None
    assert pending["metadata"].get("deletionTimestamp")
    assert FINALIZER in pending["metadata"]["finalizers"]
    assert agents["worker-node-1"].holds(env.namespace, "late") is not None

    env.operator()
    env.wait(lambda: env.get("late") is None, "the object to be deleted after the restart")
    for node in NODES:
        assert agents[node].names() == set(), node


def test_delete_waits_for_an_unreachable_node(env: Env) -> None:
    agents = env.agents_for("worker-node-1", "worker-node-2")
    env.operator()
    env.create("held", {"coreIds": ["9"], **GUARANTEED, "nodes": ["worker-node-1", "worker-node-2"]})
    env.wait_states("held", {"worker-node-1": "Successful", "worker-node-2": "Successful"})
    agents["worker-node-2"].stop()
    env.delete("held")
    env.wait_event("held", "RemoveFailed", "worker-node-2")
    obj = env.get("held")
    assert obj is not None  # kept until the node confirms
    assert agents["worker-node-1"].names() == set()
    agents["worker-node-2"].start()
    env.wait(lambda: env.get("held") is None, "the object to be deleted once worker-node-2 is back")
    assert agents["worker-node-2"].names() == set()


def test_spec_change_is_reapplied(env: Env) -> None:
    agents = env.agents_for("worker-node-1")
    env.operator()
    env.create("grow", {"coreIds": ["1"], **GUARANTEED, "nodes": ["worker-node-1"]})
    env.wait_states("grow", {"worker-node-1": "Successful"})
    patched = env.patch_spec("grow", {"coreIds": ["1-2"], "rdt": {"cache": {"max": 3, "min": 3}}})

    def applied() -> Obj | None:
        obj = env.get("grow") or {}
        status = obj.get("status") or {}
        entry = (status.get("workloadStates") or {}).get("worker-node-1") or {}
        done = status.get("observedGeneration") == patched["metadata"]["generation"] and entry.get(
            "coreIds"
        ) == ["1-2"]
        return obj if done else None

    obj = env.wait(applied, "generation 2 applied")
    assert obj["status"]["workloadStates"]["worker-node-1"]["rdt"] == {"cache": {"max": 3, "min": 3}}
    held = agents["worker-node-1"].holds(env.namespace, "grow")
    assert held is not None
    assert (list(held.spec.core_ids), held.spec.cache.max) == (["1-2"], 3)
    assert env.wait_event("grow", "Updated", "generation 2")[0] == "Normal"


def test_drift_is_repaired_by_the_periodic_check(env: Env) -> None:
    agents = env.agents_for("worker-node-1")
    env.operator()
    env.create("drift", {"coreIds": ["4"], **GUARANTEED, "nodes": ["worker-node-1"]})
    env.wait_states("drift", {"worker-node-1": "Successful"})
    applies = agents["worker-node-1"].count("ApplyWorkload")

    agents["worker-node-1"].lose(env.namespace, "drift")  # e.g. the node's state was wiped
    env.wait(lambda: agents["worker-node-1"].holds(env.namespace, "drift"), "the workload re-applied")
    assert agents["worker-node-1"].count("ApplyWorkload") == applies + 1
    assert env.wait_event("drift", "DriftRepaired", "worker-node-1")[0] == "Normal"
    # While nothing drifts, checks only list; they do not re-apply.
    time.sleep(5)
    assert agents["worker-node-1"].count("ApplyWorkload") == applies + 1
    assert agents["worker-node-1"].count("ListWorkloads") >= 2


def test_node_without_rdt_gets_an_entry_saying_why(env: Env) -> None:
    agents = env.agents_for("worker-node-1")
    plain = env.agent("worker-node-3")
    env.node_state("worker-node-3", plain.endpoint, rdt=False)
    env.operator()
    env.create("cache", {"coreIds": ["2"], **GUARANTEED, "nodes": ["worker-node-1", "worker-node-3"]})
    states = env.wait_states("cache", {"worker-node-1": "Successful", "worker-node-3": "Failed"})
    assert "does not support RDT L3 cache allocation" in states["worker-node-3"]["response"]
    assert "no L3 cache allocation on this CPU" in states["worker-node-3"]["response"]
    assert plain.count("ApplyWorkload") == 0
    assert env.wait_event("cache", "Unsupported", "worker-node-3")[0] == "Warning"
    assert agents["worker-node-1"].holds(env.namespace, "cache") is not None

    # A P-state alone asks nothing of RDT: such a workload does go to that node.
    env.create(
        "freq", {"coreIds": ["5"], "plugins": {"pstate": {"ratio": "1.5"}}, "nodes": ["worker-node-3"]}
    )
    env.wait_states("freq", {"worker-node-3": "Successful"})

    # An agent that later reports RDT support gets the cache workload without any change to it.
    env.node_state("worker-node-3", plain.endpoint, rdt=True)
    env.wait_states("cache", {"worker-node-1": "Successful", "worker-node-3": "Successful"})


def test_node_without_agent_and_agent_not_ready_are_pending(env: Env) -> None:
    starting = env.agent("worker-node-2")
    env.node_state("worker-node-2", starting.endpoint, ready=False, reason="EngineStarting")
    env.operator()
    env.create(
        "wait", {"coreIds": ["2"], **GUARANTEED, "nodes": ["worker-node-1", "worker-node-2", "no-such-node"]}
    )
    states = env.wait_states(
        "wait", {"worker-node-1": "Pending", "worker-node-2": "Pending", "no-such-node": "Pending"}
    )
    assert "rmd-node-state-worker-node-1" in states["worker-node-1"]["response"]
    assert "EngineStarting" in states["worker-node-2"]["response"]
    assert "does not exist" in states["no-such-node"]["response"]
    assert starting.count("ApplyWorkload") == 0

    env.node_state("worker-node-2", starting.endpoint, ready=True)
    late = env.agent("worker-node-1")
    env.node_state("worker-node-1", late.endpoint)
    env.wait_states(
        "wait", {"worker-node-1": "Successful", "worker-node-2": "Successful", "no-such-node": "Pending"}
    )


def test_agent_restart_keeps_applied_workloads_successful(env: Env) -> None:
    agents = env.agents_for("worker-node-1")
    env.operator()
    env.create("keep", {"coreIds": ["2"], **GUARANTEED, "nodes": ["worker-node-1"]})
    env.wait_states("keep", {"worker-node-1": "Successful"})

    # The agent stops (its RmdNodeState stays, Ready=False): resctrl keeps enforcing, so nothing is lost.
    env.node_state("worker-node-1", agents["worker-node-1"].endpoint, ready=False, reason="AgentStopped")
    time.sleep(3)
    assert env.states("keep")["worker-node-1"]["status"] == "Successful"
    assert not [e for e in env.events("keep") if e[1] == "AgentNotReady"]

    # A change while it is down has to wait for it.
    env.patch_spec("keep", {"coreIds": ["2-3"]})
    states = env.wait_states("keep", {"worker-node-1": "Pending"})
    assert "AgentStopped" in states["worker-node-1"]["response"]
    env.node_state("worker-node-1", agents["worker-node-1"].endpoint, ready=True)
    states = env.wait_states("keep", {"worker-node-1": "Successful"})
    assert states["worker-node-1"]["coreIds"] == ["2-3"]


def test_agents_are_only_called_over_verified_tls_unless_insecure_is_set(env: Env) -> None:
    plaintext = env.agent("worker-node-1", tls=False)
    env.node_state("worker-node-1", plaintext.endpoint)
    impostor = env.agent("worker-node-2", identity="rmd-agent.worker-node-3")  # a valid cert, another node's
    env.node_state("worker-node-2", impostor.endpoint)
    operator = env.operator()
    env.create("tls", {"coreIds": ["2"], **GUARANTEED, "nodes": ["worker-node-1", "worker-node-2"]})
    states = env.wait_states("tls", {"worker-node-1": "Pending", "worker-node-2": "Pending"})
    assert states["worker-node-1"]["response"].startswith("Pending: UNAVAILABLE")
    assert states["worker-node-2"]["response"].startswith("Pending: UNAVAILABLE")
    time.sleep(3)  # several retries
    assert plaintext.calls == []  # never reached: no silent downgrade
    assert impostor.calls == []  # the handshake fails on the name before any call
    assert "PLAINTEXT" not in operator.log()
    operator.stop()

    insecure = env.operator(insecure_agents="true")
    env.wait(
        lambda: env.states("tls").get("worker-node-1", {}).get("status") == "Successful", "plaintext applied"
    )
    assert plaintext.holds(env.namespace, "tls") is not None
    assert "PLAINTEXT" in insecure.log()  # said loudly


def test_orphans_are_swept_in_scope_only(env: Env) -> None:
    agents = env.agents_for("worker-node-1")
    agents["worker-node-1"].seed(env.namespace, "ghost", "uid-of-a-deleted-object")
    agents["worker-node-1"].seed("some-other-namespace", "theirs", "uid-elsewhere")
    env.create("alive", {"coreIds": ["3"], **GUARANTEED, "nodes": ["worker-node-2"]})
    alive = env.get("alive")
    assert alive is not None
    agents["worker-node-1"].seed(env.namespace, "alive", alive["metadata"]["uid"])  # exists: not an orphan
    env.operator()
    env.wait(lambda: (env.namespace, "ghost") not in agents["worker-node-1"].names(), "the orphan removed")
    names = agents["worker-node-1"].names()
    assert ("some-other-namespace", "theirs") in names  # another operator's namespace: not ours to judge
    assert (env.namespace, "alive") in names


def test_liveness_endpoint(env: Env) -> None:
    operator = env.operator()
    status, body = operator.liveness()
    assert status == 200
    assert "rmd" in json.loads(body)
