"""The whole system, end to end: the real control plane (etcd, kube-apiserver, controller-manager, scheduler),
three simulated nodes worker-node-1..3 (each: simulated hardware with a FUSE resctrl, a simulated kubelet
joined to the API server, and a real `rmd-agent serve` process over mTLS) and the real operator process, all
from `rmd_sim.cluster.SimCluster`, shared by the module.

Every scenario is checked from both ends: through the API (RmdWorkload status entries: status, id, cosName,
coreIds, the agent's message) and through the nodes (each agent's ListWorkloads over mTLS, the resctrl
groups in the simulated kernel, and the kernel's rules: `check_resctrl() == []`). Each test works in a
namespace of its own; its teardown deletes every RmdWorkload there and checks that nothing is left on any
node (no workload held, no group of ours), after putting the cluster back in its baseline (operator running
with the module's settings, every agent running on loopback with mTLS).

Covered: the shared samples (../shared/samples) reach Successful on exactly the nodes they name; the
acceptance cases of reference rmd-operator-and-rmd.md §7.4 1-10 and 12-15 (11, the pod flow, is tested
elsewhere); the operator SIGKILLed while 30 workloads are being applied, then restarted; calls cut short
by their deadline (the same interruption, made certain); and an agent cut off the network.

Unreachable agent: the agent of worker-node-3 is moved into a Linux network namespace of its own
(`rmd_sim.netns`: a veth pair on a /30 of 10.250.0.0/16, a relay to the API server's loopback port), so the
operator dials it at its veth address with the certificate name rmd-agent.worker-node-3. The link is cut by
taking the namespace's end of the veth down: packets are dropped both ways, as on a real partition (the
agent cannot reach the API server either). Where network namespaces cannot be created (no CAP_NET_ADMIN /
CAP_SYS_ADMIN), the test falls back to SIGSTOP of the agent process, which also leaves connections open
and unanswered, and says so in its output. Entries that need the agent (a new workload, a new generation,
a deletion) turn Pending; an entry already Successful stays so, as docs/operator.md says (resctrl keeps
enforcing it without the agent).

The cluster runs on an event loop in a thread of its own (the simulated kubelets serve the agents from it),
so the tests are plain synchronous code that polls the API server and the agents.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_agent.plan.inventory import PoolConfig, pool_sizes
from rmd_agent.settings import AgentSettings
from rmd_api.agent.v1 import agent_pb2, agent_pb2_grpc
from rmd_api.cpuset import format_cpu_list, parse_cpu_list
from rmd_api.node_state import lease_duration_seconds
from rmd_sim.cluster import SYSTEM_NAMESPACE, SimCluster
from rmd_sim.control_plane import BinariesNotFound, find_bin_dir, repo_root
from rmd_sim.loop_thread import LoopThread
from rmd_sim.netns import can_create_namespaces
from rmd_sim.node import SimNode
from rmd_sim.resctrl import NON_GROUP_DIRS, RESCTRL
from rmd_sim.spec import NodeSpec

pytestmark = pytest.mark.e2e

NODES = ("worker-node-1", "worker-node-2", "worker-node-3")
GROUP, VERSION, PLURAL = "intel.com", "v1alpha1", "rmdworkloads"
FINALIZER = "intel.com/rmd-operator"
SAMPLES_DIR = Path(os.environ.get("RMD_SAMPLES_DIR", str(repo_root().parent / "shared" / "samples")))
ARTIFACTS = repo_root() / "artifacts" / "e2e" / "test_system"
TIER = "e2e.rmd.test/tier"  # a label of the tests' own (the simulated kubelets keep theirs in place)

# Short intervals so that retries and drift checks happen within seconds.
CALL_TIMEOUT = 5.0  # generous: CI machines are shared; an unreachable agent costs one such deadline
RETRY_MAX = 2.0
OPERATOR = {
    "drift_interval_seconds": 2.0,
    "retry_initial_seconds": 0.5,
    "retry_max_seconds": RETRY_MAX,
    "agent_call_timeout_seconds": CALL_TIMEOUT,
    "watch_timeout_seconds": 20,
}
AGENT = {"power_interval_seconds": 5.0, "nrt_poll_seconds": 5.0}
WAIT = 45.0
SPEC = NodeSpec.default()
POOLS = pool_sizes(PoolConfig(), SPEC.l3_ways, SPEC.min_cbm_bits)

Obj = dict[str, Any]
_T = TypeVar("_T")
_new_stub: Any = agent_pb2_grpc.AgentStub  # generated without annotations


# --- the nodes' side: agents and resctrl -------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """A resctrl group as the simulated kernel holds it."""

    cpus: frozenset[int]
    l3: dict[int, int]  # cache id -> capacity bitmask
    mb: dict[int, int]  # domain -> memory bandwidth value
    inode: int  # changes if the group is removed and made again


def _read_group(path: Path) -> Group:
    lines: dict[str, dict[int, int]] = {}
    for line in (path / "schemata").read_text().splitlines():
        name, _, items = line.strip().partition(":")
        base = 16 if name.startswith("L3") else 10
        lines[name] = {int(d): int(v.strip(), base) for d, v in (i.split("=") for i in items.split(";"))}
    cpus = parse_cpu_list((path / "cpus_list").read_text().strip() or "")
    return Group(frozenset(cpus), lines.get("L3", {}), lines.get("MB", {}), path.stat().st_ino)


def resctrl_groups(node: SimNode) -> dict[str, Group]:
    """Every group on the node ("" is the root group)."""
    base = node.mount.backing_root / RESCTRL
    groups = {"": _read_group(base)}
    for entry in sorted(base.iterdir()):
        if entry.is_dir() and entry.name not in NON_GROUP_DIRS:
            groups[entry.name] = _read_group(entry)
    return groups


def list_workloads(node: SimNode, *, tls: bool = True) -> list[agent_pb2.Workload]:
    """The agent's ListWorkloads, as the operator calls it (or in plaintext, for an --insecure agent)."""
    if tls:
        channel = grpc.secure_channel(
            node.endpoint, node.pki.channel_credentials(), options=node.channel_options()
        )
    else:
        channel = grpc.insecure_channel(node.endpoint, options=[("grpc.enable_http_proxy", 0)])
    with channel:
        stub: Any = _new_stub(channel)
        response = stub.ListWorkloads(agent_pb2.ListWorkloadsRequest(), timeout=10)
        return list(response.workloads)


def agent_metrics(node: SimNode) -> str:
    conn = http.client.HTTPConnection(node.agent_host, node.http_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def contiguous(mask: int) -> bool:
    run = mask >> ((mask & -mask).bit_length() - 1)
    return mask != 0 and run & (run + 1) == 0


def l3_domains(cpus: set[int] | frozenset[int]) -> set[int]:
    return {SPEC.cpu_location(cpu)[0] for cpu in cpus}  # one L3 (cache id) per socket


def pool_bits(offset: int, ways: int) -> int:
    return ((1 << ways) - 1) << offset


# Layout [ shared | best effort | guaranteed | OS ] with bit 0 on the right (rmd_agent.plan.resctrl_layout):
# the guaranteed pool sits right above the OS's own ways.
GUARANTEED_POOL = pool_bits(POOLS.os, POOLS.guaranteed)


# --- the cluster, on its own event loop --------------------------------------------------------------------


class System:
    """The module's cluster and what the tests do with it."""

    def __init__(self, cluster: SimCluster, loop: LoopThread) -> None:
        self.cluster = cluster
        self.loop = loop
        self.api = cluster.api_client()
        # Typed loosely: the client's own annotations say `object` for every custom object.
        self.objects: Any = client.CustomObjectsApi(self.api)
        self.core: Any = client.CoreV1Api(self.api)
        self.leases: Any = client.CoordinationV1Api(self.api)

    def node(self, name: str) -> SimNode:
        return self.cluster.nodes[name]

    # -- waiting

    def wait(
        self,
        probe: Callable[[], _T | None],
        what: str | Callable[[], str],
        timeout: float = WAIT,
        interval: float = 0.2,
    ) -> _T:
        """Poll `probe` until it returns something true; `what` (or what it returns) describes the wait."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                value = probe()
            except (ApiException, grpc.RpcError) as exc:
                last = exc
            else:
                if value:
                    return value
                last = value
            if time.monotonic() > deadline:
                described = what if isinstance(what, str) else what()
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {described}; last seen: {last!r}\n"
                    f"--- operator log ---\n{self.cluster.operator_log_tail(60)}"
                )
            time.sleep(interval)

    # -- RmdWorkloads

    def create(self, namespace: str, name: str, spec: Obj) -> Obj:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RmdWorkload", "metadata": {"name": name}}
        created: Obj = self.objects.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, {**body, "spec": spec}
        )
        return created

    def get(self, namespace: str, name: str) -> Obj | None:
        try:
            got: Obj = self.objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return got

    def names(self, namespace: str) -> list[str]:
        listed = self.objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        return sorted(item["metadata"]["name"] for item in listed.get("items", []))

    def patch_spec(self, namespace: str, name: str, spec: Obj) -> None:
        self.objects.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"spec": spec},
            _content_type="application/merge-patch+json",
        )

    def delete(self, namespace: str, name: str) -> None:
        self.objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def states(self, namespace: str, name: str) -> dict[str, Obj]:
        obj = self.get(namespace, name) or {}
        return dict((obj.get("status") or {}).get("workloadStates") or {})

    def wait_states(
        self, namespace: str, name: str, expected: Mapping[str, str], timeout: float = WAIT
    ) -> dict[str, Obj]:
        """Wait until the workload's status has exactly these nodes, with these statuses."""

        def probe() -> dict[str, Obj] | None:
            states = self.states(namespace, name)
            return states if {n: e.get("status") for n, e in states.items()} == dict(expected) else None

        def what() -> str:
            return f"{namespace}/{name} to be {dict(expected)}; it is {self.states(namespace, name)}"

        return self.wait(probe, what, timeout)

    def wait_gone(self, namespace: str, name: str, timeout: float = WAIT) -> None:
        self.wait(lambda: self.get(namespace, name) is None, f"{namespace}/{name} to be deleted", timeout)

    def events(self, namespace: str, name: str) -> list[tuple[str, str]]:
        listed = self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        return [(e.reason or "", e.message or "") for e in listed.items]

    # -- the nodes

    def held(self, node: str, namespace: str) -> dict[str, agent_pb2.Workload]:
        """What the node's agent holds for `namespace`, by name (asserting no name is held twice)."""
        mine = [w for w in list_workloads(self.node(node)) if w.ref.namespace == namespace]
        twice = [name for name, n in Counter(w.ref.name for w in mine).items() if n > 1]
        assert not twice, f"{node} holds {twice} more than once"
        return {w.ref.name: w for w in mine}

    def set_tier(self, node: str, tier: str | None) -> None:
        self.core.patch_node(node, {"metadata": {"labels": {TIER: tier}}})

    # -- the operator and the agents

    def restart_operator(self, sig: int = signal.SIGTERM, **settings: Any) -> None:
        self.loop.run(self.cluster.stop_operator(sig))
        self.cluster.operator_settings = {**OPERATOR, **settings}
        self.loop.run(self.cluster.start_operator())

    def restart_agent(self, node: str, sig: int = signal.SIGTERM, **settings: Any) -> None:
        sim = self.node(node)
        self.loop.run(sim.stop_agent(sig))
        sim.extra_settings = {**AGENT, **settings}
        self.loop.run(sim.start_agent())

    def agent_state(self, node: str) -> Obj:
        obj: Obj = self.objects.get_namespaced_custom_object(
            GROUP, VERSION, SYSTEM_NAMESPACE, "rmdnodestates", f"rmd-node-state-{node}"
        )
        return obj

    def ready_condition(self, node: str) -> Obj:
        conditions = (self.agent_state(node).get("status") or {}).get("conditions") or ()
        return next((c for c in conditions if c.get("type") == "Ready"), {})

    def lease(self, node: str) -> Any:
        return self.leases.read_namespaced_lease(f"rmd-agent-{node}", SYSTEM_NAMESPACE)

    def wait_agent_published(self, node: str) -> None:
        """Until the agent's RmdNodeState names its current endpoint and says Ready."""
        endpoint = self.node(node).endpoint

        def probe() -> bool:
            status = self.agent_state(node).get("status") or {}
            ready = [c for c in status.get("conditions") or () if c.get("type") == "Ready"]
            return status.get("endpoint") == endpoint and bool(ready) and ready[0].get("status") == "True"

        self.wait(probe, f"the RmdNodeState of {node} to be ready at {endpoint}")

    def baseline(self) -> None:
        """Back to the module's setup: every agent on loopback with mTLS and running, and the operator
        running with the module's settings."""
        for name, sim in self.cluster.nodes.items():
            if name in self.cluster.networks:
                self.loop.run(self.cluster.rejoin_node(name))
                self.wait_agent_published(name)
            elif sim.extra_settings != AGENT or sim.process is None or sim.process.poll() is not None:
                self.restart_agent(name)
                self.wait_agent_published(name)
        operator = self.cluster.operator
        if self.cluster.operator_settings != OPERATOR or operator is None or operator.poll() is not None:
            self.restart_operator()

    def close(self) -> None:
        self.api.close()


@pytest.fixture(scope="module")
def system(request: pytest.FixtureRequest) -> Iterator[System]:
    try:
        find_bin_dir()
    except BinariesNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so the e2e control plane is required: {exc}", pytrace=False)
        pytest.skip(f"e2e control plane unavailable: {exc}")
    parent = "/dev/shm" if Path("/dev/shm").is_dir() else None
    workdir = Path(tempfile.mkdtemp(prefix="rmd-sys-", dir=parent))  # short: unix socket paths
    loop = LoopThread()
    cluster = SimCluster(workdir, nodes=NODES, operator_settings=OPERATOR, agent_settings=AGENT)
    failed_before = request.session.testsfailed
    try:
        loop.run(cluster.__aenter__())
        harness = System(cluster, loop)
        try:
            yield harness
        finally:
            harness.close()
    finally:
        if request.session.testsfailed > failed_before:
            cluster.save_logs(ARTIFACTS)
        try:
            loop.run(cluster.stop())
        finally:
            loop.close()
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def ns(system: System) -> Iterator[str]:
    """A namespace for the test. Afterwards: baseline restored, every RmdWorkload in it deleted, and every
    node left with nothing of it (no workload held, no resctrl group of ours, the kernel's rules kept)."""
    name = f"sys-{uuid.uuid4().hex[:8]}"
    system.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        try:
            system.baseline()
            for workload in system.names(name):
                with contextlib.suppress(ApiException):
                    system.delete(name, workload)
            system.wait(lambda: not system.names(name), f"every RmdWorkload in {name} to be deleted", 90)
            problems = []
            for node in NODES:
                sim = system.node(node)
                if held := sorted(system.held(node, name)):
                    problems.append(f"{node} still holds {held}")
                ours = {w.cos_name for w in list_workloads(sim)}
                leftover = {g for g in resctrl_groups(sim) if g.startswith(f"rmd-{name}.") and g not in ours}
                for group in leftover:  # removed as an admin would, so that later tests start clean
                    with contextlib.suppress(OSError):
                        (sim.root / RESCTRL / group).rmdir()
                if leftover:
                    problems.append(f"{node} had groups no workload owns: {sorted(leftover)}")
                if violations := sim.check_resctrl():
                    problems.append(f"{node} breaks the kernel's rules: {violations}")
            assert not problems, "; ".join(problems)
        finally:
            for node in NODES:
                with contextlib.suppress(ApiException):
                    system.set_tier(node, None)
            with contextlib.suppress(ApiException):
                system.core.delete_namespace(name)


# --- checks shared by the tests -------------------------------------------------------------------------


def assert_entry_matches_agent(entry: Obj, held: agent_pb2.Workload, uid: str) -> None:
    """A Successful status entry says what the agent enforces."""
    assert entry["status"] == "Successful", entry
    assert held.ref.uid == uid
    assert entry["id"] == held.id
    assert entry["cosName"] == held.cos_name
    assert entry["coreIds"] == [format_cpu_list(held.cpus)]


def assert_group_enforces(system: System, node: str, held: agent_pb2.Workload, entry: Obj) -> Group:
    """The workload's group exists on the node with its CPUs (all of them, for a group of its own), holding
    the masks the agent reports; for guaranteed cache, the entry's `max` contiguous ways inside the
    guaranteed pool on each of its cache ids, which the OS group never overlaps (case 13)."""
    groups = resctrl_groups(system.node(node))
    assert held.cos_name in groups, f"{node}: no group {held.cos_name}"
    group = groups[held.cos_name]
    cpus = frozenset(held.cpus)
    if held.pool == "shared":
        assert cpus <= group.cpus
    else:
        assert group.cpus == cpus
    for allocation in held.cache:
        assert group.l3[allocation.cache_id] == int(allocation.mask, 16)
    if held.pool == "guaranteed":
        ways = entry["rdt"]["cache"]["max"]
        for domain in l3_domains(cpus):
            mask = group.l3[domain]
            assert mask.bit_count() == ways, f"{node}: {mask:x} on cache id {domain}, {ways} ways asked"
            assert contiguous(mask) and mask & ~GUARANTEED_POOL == 0, f"{mask:x} outside the pool"
            assert groups[""].l3[domain] & mask == 0, "the OS group overlaps a guaranteed group"
    return group


def refusal(exc: ApiException) -> str:
    """The API server's message in a refusal."""
    return str(json.loads(exc.body or "{}").get("message", ""))


def shared(cores: str) -> Obj:
    return {"coreIds": [cores], "rdt": {"cache": {"max": 0, "min": 0}}}


def guaranteed(cores: str, ways: int = 1) -> Obj:
    return {"coreIds": [cores], "rdt": {"cache": {"max": ways, "min": ways}}}


# --- tests -----------------------------------------------------------------------------------------------


def _samples() -> list[Path]:
    if not SAMPLES_DIR.is_dir():
        return []
    paths = sorted(SAMPLES_DIR.glob("*.yaml"))
    return [p for p in paths if yaml.safe_load(p.read_text())["kind"] == "RmdWorkload"]


def test_samples_reach_successful_on_the_nodes_they_name(system: System, ns: str) -> None:
    samples = _samples()
    if not samples:
        pytest.skip(f"no RmdWorkload samples in {SAMPLES_DIR}")
    labels = {n: system.core.read_node(n).metadata.labels or {} for n in NODES}
    expected: dict[str, set[str]] = {}
    for path in samples:
        system.cluster.kubectl("apply", "-n", ns, "-f", str(path))  # unchanged, as users apply them
        doc = yaml.safe_load(path.read_text())
        selector = doc["spec"].get("nodeSelector") or {}
        if selector:
            named = {n for n, have in labels.items() if all(have.get(k) == v for k, v in selector.items())}
        else:
            named = set(doc["spec"]["nodes"])
        expected[doc["metadata"]["name"]] = named
    assert all(expected.values()), expected  # every sample names some of these nodes

    for name, nodes in expected.items():
        system.wait_states(ns, name, dict.fromkeys(nodes, "Successful"))
    held = {node: system.held(node, ns) for node in NODES}
    for name, nodes in expected.items():
        obj = system.get(ns, name)
        assert obj is not None
        for node in NODES:
            if node not in nodes:
                assert name not in held[node], f"{name} applied on {node}, which it does not name"
                continue
            entry = obj["status"]["workloadStates"][node]
            assert_entry_matches_agent(entry, held[node][name], obj["metadata"]["uid"])
            assert_group_enforces(system, node, held[node][name], entry)
            pstate = obj["spec"].get("pstate") or (obj["spec"].get("plugins") or {}).get("pstate")
            if pstate:
                assert float(entry["plugins"]["pstate"]["ratio"]) == float(pstate["ratio"])
    for node in NODES:
        assert system.node(node).check_resctrl() == []


def test_guaranteed_cache_on_explicit_cores(system: System, ns: str) -> None:  # cases 1 and 13
    created = system.create(ns, "gold", {**guaranteed("2-3", ways=2), "nodes": list(NODES)})
    states = system.wait_states(ns, "gold", dict.fromkeys(NODES, "Successful"))
    for node in NODES:
        held = system.held(node, ns)["gold"]
        assert held.pool == "guaranteed"
        assert_entry_matches_agent(states[node], held, created["metadata"]["uid"])
        assert states[node]["coreIds"] == ["2-3"]
        assert states[node]["rdt"] == {"cache": {"max": 2, "min": 2}}
        group = assert_group_enforces(system, node, held, states[node])
        assert group.cpus == {2, 3}
        assert group.l3[0].bit_count() == 2  # CPUs 2-3 sit on cache id 0
        assert system.node(node).check_resctrl() == []


def test_overlapping_cores_fail_and_leave_the_first_alone(system: System, ns: str) -> None:  # case 2
    system.create(ns, "first", {**guaranteed("4-5", ways=2), "nodes": ["worker-node-1"]})
    first = system.wait_states(ns, "first", {"worker-node-1": "Successful"})["worker-node-1"]
    before = resctrl_groups(system.node("worker-node-1"))[first["cosName"]]

    system.create(ns, "second", {**guaranteed("5-6"), "nodes": ["worker-node-1"]})
    entry = system.wait_states(ns, "second", {"worker-node-1": "Failed"})["worker-node-1"]
    assert f"CPU 5 is already assigned to workload {ns}/first" in entry["response"]
    assert "id" not in entry
    assert system.states(ns, "first")["worker-node-1"] == first
    assert resctrl_groups(system.node("worker-node-1"))[first["cosName"]] == before
    assert "second" not in system.held("worker-node-1", ns)

    # A conflict may pass later: freeing the CPU lets the second in without any change to it.
    system.delete(ns, "first")
    entry = system.wait_states(ns, "second", {"worker-node-1": "Successful"})["worker-node-1"]
    assert entry["coreIds"] == ["5-6"]
    assert system.node("worker-node-1").check_resctrl() == []


def test_leaving_nodes_by_spec_and_by_labels(system: System, ns: str) -> None:  # case 3
    system.create(ns, "shrink", {**guaranteed("6"), "nodes": list(NODES)})
    states = system.wait_states(ns, "shrink", dict.fromkeys(NODES, "Successful"))
    system.patch_spec(ns, "shrink", {"nodes": ["worker-node-1"]})
    after = system.wait_states(ns, "shrink", {"worker-node-1": "Successful"})
    assert after["worker-node-1"]["id"] == states["worker-node-1"]["id"]  # left alone where it stays
    for node in ("worker-node-2", "worker-node-3"):
        assert "shrink" not in system.held(node, ns)
        assert states[node]["cosName"] not in resctrl_groups(system.node(node))
        assert system.node(node).check_resctrl() == []

    for node in ("worker-node-1", "worker-node-2"):
        system.set_tier(node, "gold")
    system.create(ns, "picky", {**guaranteed("7"), "nodeSelector": {TIER: "gold"}})
    states = system.wait_states(ns, "picky", {"worker-node-1": "Successful", "worker-node-2": "Successful"})
    system.set_tier("worker-node-2", "silver")
    system.wait_states(ns, "picky", {"worker-node-1": "Successful"})
    assert "picky" not in system.held("worker-node-2", ns)
    assert states["worker-node-2"]["cosName"] not in resctrl_groups(system.node("worker-node-2"))
    assert "picky" in system.held("worker-node-1", ns)

    system.set_tier("worker-node-2", "gold")
    states = system.wait_states(ns, "picky", {"worker-node-1": "Successful", "worker-node-2": "Successful"})
    held = system.held("worker-node-2", ns)["picky"]
    assert states["worker-node-2"]["id"] == held.id
    assert_group_enforces(system, "worker-node-2", held, states["worker-node-2"])


def test_deletion_is_finished_across_operator_and_agent_restarts(system: System, ns: str) -> None:  # 4
    system.create(ns, "doomed", {**guaranteed("8"), "nodes": list(NODES)})
    states = system.wait_states(ns, "doomed", dict.fromkeys(NODES, "Successful"))

    system.loop.run(system.cluster.stop_operator(signal.SIGKILL))
    system.delete(ns, "doomed")
    obj = system.get(ns, "doomed")
    assert obj is not None and obj["metadata"]["deletionTimestamp"]
    assert FINALIZER in obj["metadata"]["finalizers"]
    system.restart_agent("worker-node-2", signal.SIGKILL)  # an agent restarts meanwhile, too
    time.sleep(1)
    for node in NODES:
        assert "doomed" in system.held(node, ns)  # nobody removed it while the operator was down
    system.loop.run(system.cluster.start_operator())
    system.wait_gone(ns, "doomed")
    for node in NODES:
        assert "doomed" not in system.held(node, ns)
        assert states[node]["cosName"] not in resctrl_groups(system.node(node))

    # Deleted while one of its agents is down: the finalizer waits for that agent.
    system.create(ns, "waits", {**guaranteed("9"), "nodes": ["worker-node-1", "worker-node-2"]})
    system.wait_states(ns, "waits", {"worker-node-1": "Successful", "worker-node-2": "Successful"})
    system.loop.run(system.node("worker-node-2").stop_agent())
    system.delete(ns, "waits")
    entry = system.wait_states(ns, "waits", {"worker-node-2": "Pending"})["worker-node-2"]
    assert "to be removed" in entry["response"]
    assert "waits" not in system.held("worker-node-1", ns)
    time.sleep(2)
    assert system.get(ns, "waits") is not None
    system.loop.run(system.node("worker-node-2").start_agent())
    system.wait_gone(ns, "waits")
    assert "waits" not in system.held("worker-node-2", ns)


def test_all_cores_minus_reserved(system: System, ns: str) -> None:  # case 5
    spec = {
        "allCores": True,
        "reservedCoreIds": ["0-11", "32-63"],
        "rdt": {"cache": {"max": 0, "min": 0}},
        "nodes": ["worker-node-3"],
    }
    system.create(ns, "most", spec)
    entry = system.wait_states(ns, "most", {"worker-node-3": "Successful"})["worker-node-3"]
    assert entry["coreIds"] == ["12-31"]
    held = system.held("worker-node-3", ns)["most"]
    assert set(held.cpus) == set(range(12, 32))
    assert resctrl_groups(system.node("worker-node-3"))[held.cos_name].cpus == set(range(12, 32))


def test_node_selector_beats_nodes(system: System, ns: str) -> None:  # case 6
    for node in ("worker-node-2", "worker-node-3"):
        system.set_tier(node, "bronze")
    system.create(ns, "both", {**shared("10"), "nodes": ["worker-node-1"], "nodeSelector": {TIER: "bronze"}})
    system.wait_states(ns, "both", {"worker-node-2": "Successful", "worker-node-3": "Successful"})
    assert "both" not in system.held("worker-node-1", ns)
    time.sleep(1)
    assert set(system.states(ns, "both")) == {"worker-node-2", "worker-node-3"}


def test_agent_decisions_reach_the_status(system: System, ns: str) -> None:  # cases 7-10
    node = "worker-node-2"
    on = {"nodes": [node]}
    # 7: the pool follows max/min; max > 0 with min = 0 is refused (by the API server already).
    system.create(ns, "g", {**guaranteed("12", ways=2), **on})
    system.create(ns, "b", {"coreIds": ["13"], "rdt": {"cache": {"max": 3, "min": 1}}, **on})
    system.create(ns, "s", {**shared("14"), **on})
    with pytest.raises(ApiException) as rejected:
        system.create(ns, "bad", {"coreIds": ["15"], "rdt": {"cache": {"max": 2, "min": 0}}, **on})
    assert rejected.value.status == 422 and "needs min > 0" in refusal(rejected.value)
    for name in ("g", "b", "s"):
        system.wait_states(ns, name, {node: "Successful"})
    held = system.held(node, ns)
    assert {n: held[n].pool for n in ("g", "b", "s")} == {"g": "guaranteed", "b": "besteffort", "s": "shared"}

    # 8: MBA only with guaranteed cache and within range (the API checks both), and in the node's mode
    # (percent here: the agent refuses MBps).
    def with_mba(cores: str, ways: tuple[int, int], mba: Obj) -> Obj:
        return {"coreIds": [cores], "rdt": {"cache": {"max": ways[0], "min": ways[1]}, "mba": mba}, **on}

    # The node's MBA step is 10%: 55% is held as 60%, and the status says so (#13 item 5).
    system.create(ns, "mba", with_mba("16", (1, 1), {"percentage": 55}))
    system.create(ns, "mbps", with_mba("18", (1, 1), {"mbps": 100}))
    entry = system.wait_states(ns, "mba", {node: "Successful"})[node]
    assert entry["rdt"]["mba"] == {
        "percentage": 55,
        "applied": 60,
        "rounded": True,
        "message": "MBA 55% rounded up to 60%: the node's MBA step (bandwidth_gran) is 10%",
    }
    mba = system.held(node, ns)["mba"]
    assert resctrl_groups(system.node(node))[mba.cos_name].mb[1] == 60  # CPU 16 is on socket 1
    entry = system.wait_states(ns, "mbps", {node: "Failed"})[node]
    assert "takes a percentage" in entry["response"]
    with pytest.raises(ApiException) as rejected:
        system.create(ns, "mba-be", with_mba("17", (2, 1), {"percentage": 50}))
    assert rejected.value.status == 422 and "needs guaranteed cache" in refusal(rejected.value)
    with pytest.raises(ApiException) as rejected:
        system.create(ns, "too-much", with_mba("19", (1, 1), {"percentage": 150}))
    assert rejected.value.status == 422

    # 9: a policy gives the platform's values; an unknown one is refused by the API.
    system.create(ns, "gold", {"coreIds": ["20"], "policy": "gold", **on})
    entry = system.wait_states(ns, "gold", {node: "Successful"})[node]
    assert entry["policy"] == "gold"
    cache = entry["rdt"]["cache"]
    assert cache["max"] == cache["min"] > 0
    gold = system.held(node, ns)["gold"]
    assert gold.pool == "guaranteed"
    assert resctrl_groups(system.node(node))[gold.cos_name].l3[1].bit_count() == cache["max"]
    with pytest.raises(ApiException) as rejected:
        system.create(ns, "platinum", {"coreIds": ["21"], "policy": "platinum", **on})
    assert rejected.value.status == 422 and "platinum" in refusal(rejected.value)

    # 10: the guaranteed pool of cache id 0 runs out; freeing ways lets the refused one in, unasked.
    free = POOLS.guaranteed - 2  # "g" holds 2 of cache id 0's guaranteed ways
    fill = [f"fill-{i}" for i in range(free)]
    for i, name in enumerate(fill):
        system.create(ns, name, {**guaranteed(str(33 + i)), **on})  # 32-47: socket 0's second threads
    for name in fill:
        system.wait_states(ns, name, {node: "Successful"})
    system.create(ns, "over", {**guaranteed("8"), **on})
    entry = system.wait_states(ns, "over", {node: "Failed"})[node]
    assert "not enough guaranteed cache on cache id 0" in entry["response"]
    system.delete(ns, "g")
    system.wait_states(ns, "over", {node: "Successful"})
    assert system.node(node).check_resctrl() == []


def test_min_cbm_bits_and_the_os_share_are_honoured(system: System, ns: str) -> None:  # case 14
    """A fourth node whose CPU needs at least 2 ways per mask (min_cbm_bits=2), joined for this test."""
    cluster = system.cluster
    spec = NodeSpec(min_cbm_bits=2)
    extra = SimNode(
        "worker-node-4",
        cluster.workdir / "worker-node-4",
        cluster.pki,
        spec=spec,
        kubeconfig=cluster.kubeconfig,
        labels={},  # not an RDT-labelled node: selector workloads of other tests never reach it
        node_state_namespace=SYSTEM_NAMESPACE,
        agent_settings=dict(AGENT),
    )
    system.loop.run(extra.start())
    try:
        on = {"nodes": ["worker-node-4"]}
        system.create(ns, "one-way", {**guaranteed("3"), **on})
        system.create(ns, "two-ways", {**guaranteed("4", ways=2), **on})
        entry = system.wait_states(ns, "one-way", {"worker-node-4": "Failed"})["worker-node-4"]
        assert "min_cbm_bits" in entry["response"]
        system.wait_states(ns, "two-ways", {"worker-node-4": "Successful"})
        workloads = {w.ref.name: w for w in list_workloads(extra)}
        assert set(workloads) == {"two-ways"}
        groups = resctrl_groups(extra)
        pools = pool_sizes(PoolConfig(), spec.l3_ways, spec.min_cbm_bits)
        assert pools.os >= 2 and pools.os + pools.guaranteed + pools.besteffort + pools.shared == spec.l3_ways
        for name, group in groups.items():
            for mask in group.l3.values():
                assert mask.bit_count() >= 2, f"group {name!r} has a mask of {mask:x}"
        assert groups[workloads["two-ways"].cos_name].l3[0].bit_count() == 2
        assert groups[""].l3[0].bit_count() >= pools.os  # the OS keeps its share
        assert extra.check_resctrl() == []
        for name in ("one-way", "two-ways"):
            system.delete(ns, name)
            system.wait_gone(ns, name)
        assert list_workloads(extra) == []
    finally:
        system.loop.run(extra.stop())
        with contextlib.suppress(ApiException):
            system.core.delete_node("worker-node-4")


def test_agent_restart_keeps_the_node_as_it_was(system: System, ns: str) -> None:  # case 12
    system.create(ns, "kept", {**guaranteed("28-29", ways=2), "nodes": list(NODES)})
    system.create(ns, "kept-too", {**shared("30"), "nodes": list(NODES)})
    for name in ("kept", "kept-too"):
        system.wait_states(ns, name, dict.fromkeys(NODES, "Successful"))
    node = "worker-node-1"
    before_held = system.held(node, ns)
    before_groups = resctrl_groups(system.node(node))
    before_states = {name: system.states(ns, name) for name in ("kept", "kept-too")}

    system.loop.run(system.node(node).stop_agent(signal.SIGKILL))
    time.sleep(3)  # drift checks fail meanwhile: resctrl still enforces, so the entries stay Successful
    for name in ("kept", "kept-too"):
        assert system.states(ns, name)[node]["status"] == "Successful"
    system.loop.run(system.node(node).start_agent())
    system.wait_agent_published(node)
    time.sleep(3)  # drift checks against the restarted agent

    assert system.held(node, ns) == before_held  # same ids, groups, CPUs
    after_groups = resctrl_groups(system.node(node))
    for name in ("kept", "kept-too"):
        cos = before_held[name].cos_name
        assert after_groups[cos] == before_groups[cos]  # same inode: never removed and made again
        assert system.states(ns, name) == before_states[name]
        reasons = [reason for reason, message in system.events(ns, name) if node in message]
        assert reasons.count("Applied") == 1 and "DriftRepaired" not in reasons, reasons
    assert system.node(node).check_resctrl() == []


def test_a_killed_agent_turns_not_ready_within_three_heartbeats(system: System, ns: str) -> None:
    """Issue #13 item 1: after kill -9 the RmdNodeState said Ready=True forever. The agent renews a Lease
    every heartbeat_seconds; when it stops, the operator marks the node Ready=False (HeartbeatExpired) within
    three renewals, its entries say the agent cannot confirm them, new workloads wait with that reason, and
    everything returns with the agent."""
    node = "worker-node-3"
    system.create(ns, "enforced", {**guaranteed("12"), "nodes": [node]})
    system.wait_states(ns, "enforced", {node: "Successful"})
    lease = system.lease(node)
    period = AgentSettings().heartbeat_seconds
    assert lease.spec.lease_duration_seconds == lease_duration_seconds(period)
    transitions = lease.spec.lease_transitions or 0

    system.loop.run(system.node(node).stop_agent(signal.SIGKILL))
    killed = time.monotonic()
    ready = system.wait(
        lambda: (c := system.ready_condition(node)).get("status") == "False" and c,
        "the RmdNodeState to turn Ready=False",
        3 * period + 15,
        interval=0.05,
    )
    took = time.monotonic() - killed
    print(f"agent killed -> Ready=False ({ready['reason']}) in {took:.1f}s; renewal every {period:g}s")
    assert ready["reason"] == "HeartbeatExpired", ready
    assert f"rmd-agent-{node}" in ready["message"]
    assert took <= 3 * period
    system.wait(
        lambda: "cannot confirm" in system.states(ns, "enforced")[node].get("response", ""),
        "the entry to say the agent cannot confirm it",
    )
    assert system.states(ns, "enforced")[node]["status"] == "Successful"  # resctrl still enforces it
    system.create(ns, "waits", {**guaranteed("13"), "nodes": [node]})
    entry = system.wait_states(ns, "waits", {node: "Pending"})[node]
    assert "HeartbeatExpired" in entry["response"], entry

    system.loop.run(system.node(node).start_agent())
    system.wait_agent_published(node)
    assert system.ready_condition(node)["reason"] == "AgentReady"
    assert (system.lease(node).spec.lease_transitions or 0) == transitions + 1  # a new start holds it
    system.wait_states(ns, "waits", {node: "Successful"})
    system.wait(
        lambda: system.states(ns, "enforced")[node].get("response") == "Success: OK",
        "the entry to be confirmed again",
    )


def test_a_workload_deleted_while_its_agent_was_down_is_removed_when_it_restarts(
    system: System, ns: str
) -> None:
    """Issue #13 item 2: a workload applied, its agent killed, the workload deleted and its finalizer
    removed by hand, the agent started again: its group stayed and blocked the CPU until the operator was
    restarted. The operator now sweeps a restarted agent's node at once."""
    node = "worker-node-2"
    system.create(ns, "burst-00", {**guaranteed("14"), "nodes": [node]})
    cos = system.wait_states(ns, "burst-00", {node: "Successful"})[node]["cosName"]
    system.loop.run(system.node(node).stop_agent(signal.SIGKILL))
    system.delete(ns, "burst-00")
    system.objects.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        "burst-00",
        {"metadata": {"finalizers": None}},
        _content_type="application/merge-patch+json",
    )
    system.wait_gone(ns, "burst-00")
    assert cos in resctrl_groups(system.node(node))  # the kernel still holds it

    system.loop.run(system.node(node).start_agent())  # returns once the agent serves
    started = time.monotonic()
    system.wait(
        lambda: "burst-00" not in system.held(node, ns), "the orphan to be removed", 60, interval=0.05
    )
    took = time.monotonic() - started
    print(f"agent restarted -> orphaned workload removed in {took:.1f}s")
    assert cos not in resctrl_groups(system.node(node))
    system.create(ns, "burst-01", {**guaranteed("14"), "nodes": [node]})  # the CPU is free again
    system.wait_states(ns, "burst-01", {node: "Successful"})


def test_rmd_operator_users_find_the_node_states_with_the_documented_commands(
    system: System, ns: str
) -> None:
    """docs/migration.md: rmd-operator kept RmdNodeStates in `default`, so its `kubectl describe rmdnodestate
    rmd-node-state-<node>` needs `-n <release namespace>` here; `get -A` finds them without knowing it."""
    node = "worker-node-1"
    system.create(ns, "seen", {**guaranteed("15"), "nodes": [node]})
    cos = system.wait_states(ns, "seen", {node: "Successful"})[node]["cosName"]
    listed = system.cluster.kubectl("get", "rmdnodestates", "-A").stdout
    assert any(
        line.split()[:2] == [SYSTEM_NAMESPACE, f"rmd-node-state-{node}"] for line in listed.splitlines()
    )

    def described() -> str | None:
        out = system.cluster.kubectl(
            "describe", "rmdnodestate", "-n", SYSTEM_NAMESPACE, f"rmd-node-state-{node}"
        )
        return out.stdout if cos in out.stdout else None

    text = system.wait(described, "the RmdNodeState to list the workload")
    assert "Cos Name:" in text and "Core IDs:" in text and "Namespace:" in text
    seed = system.cluster.kubectl("describe", "rmdnodestate", f"rmd-node-state-{node}", check=False)
    assert seed.returncode != 0 and "NotFound" in seed.stderr  # the seed's command, in `default`


def test_no_plaintext_fallback(system: System, ns: str) -> None:  # case 15
    node = "worker-node-3"
    system.restart_agent(node, insecure=True)
    system.wait_agent_published(node)
    system.create(ns, "tls", {**shared("31"), "nodes": ["worker-node-1", node]})
    states = system.wait_states(ns, "tls", {"worker-node-1": "Successful", node: "Pending"})
    response = states[node]["response"]
    assert response.startswith("Pending: UNAVAILABLE") and "handshake failed" in response.lower(), response
    time.sleep(3)  # several retries
    assert list_workloads(system.node(node), tls=False) == []  # the operator never sent it anything
    assert 'grpc_method="ApplyWorkload"' not in agent_metrics(system.node(node))
    assert any(reason == "AgentUnreachable" for reason, _ in system.events(ns, "tls"))
    assert "PLAINTEXT" not in system.cluster.operator_log_tail(400)

    # Only when the operator is told to talk plaintext does it.
    system.restart_operator(insecure_agents=True)
    system.wait(
        lambda: system.states(ns, "tls").get(node, {}).get("status") == "Successful", "plaintext apply"
    )
    assert [w.ref.name for w in list_workloads(system.node(node), tls=False)] == ["tls"]
    assert "PLAINTEXT" in system.cluster.operator_log_tail(400)  # said loudly


def test_operator_killed_mid_reconcile_duplicates_and_leaks_nothing(system: System, ns: str) -> None:
    """30 workloads on every node (8 with guaranteed cache, 4 per cache id, and 22 shared); the operator is
    SIGKILLed as soon as an agent holds the first one, and started again."""
    names = [f"w{i:02d}" for i in range(30)]
    cpus = [*range(12, 16), *range(28, 32), *range(40, 62)]  # socket 0, socket 1, then either
    cores = {name: str(cpu) for name, cpu in zip(names, cpus, strict=True)}
    docs = [
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "RmdWorkload",
            "metadata": {"name": name},
            "spec": {**(guaranteed(cores[name]) if i < 8 else shared(cores[name])), "nodes": list(NODES)},
        }
        for i, name in enumerate(names)
    ]
    manifest = system.cluster.workdir / f"{ns}.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))

    def successful() -> int:
        listed = system.objects.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        return sum(
            e.get("status") == "Successful"
            for item in listed.get("items", [])
            for e in ((item.get("status") or {}).get("workloadStates") or {}).values()
        )

    system.cluster.kubectl("apply", "-n", ns, "-f", str(manifest))
    system.wait(lambda: system.held("worker-node-1", ns), "a first workload applied", 60, interval=0.02)
    system.loop.run(system.cluster.stop_operator(signal.SIGKILL))
    applied = sum(len(system.held(node, ns)) for node in NODES)
    reported = successful()
    print(f"operator killed with {applied} of 90 applications done and {reported} reported")
    assert min(applied, reported) < len(names) * len(NODES), "the operator finished before it was killed"
    system.loop.run(system.cluster.start_operator())

    uids = {}
    for name in names:
        system.wait_states(ns, name, dict.fromkeys(NODES, "Successful"), timeout=90)
        obj = system.get(ns, name)
        assert obj is not None
        uids[name] = obj["metadata"]["uid"]
    for node in NODES:
        workloads = list_workloads(system.node(node))
        mine = [w for w in workloads if w.ref.namespace == ns]
        assert sorted(w.ref.name for w in mine) == names  # each exactly once
        assert all(w.ref.uid == uids[w.ref.name] for w in mine)  # and no owned orphan
        held = {w.ref.name: w for w in mine}
        for name in names:
            assert_entry_matches_agent(system.states(ns, name)[node], held[name], uids[name])
        groups = resctrl_groups(system.node(node))
        own = {g for g in groups if g.startswith(f"rmd-{ns}.")}  # the guaranteed ones' own groups
        assert own == {held[n].cos_name for n in names[:8]} and len(own) == 8, own
        for name in names[:8]:
            assert groups[held[name].cos_name].cpus == {int(cores[name])}
        assert {held[n].cos_name for n in names[8:]} == {"rmd-shared"}
        assert groups["rmd-shared"].cpus == {int(cores[n]) for n in names[8:]}
        assert system.node(node).check_resctrl() == []


def test_applies_cut_short_by_their_deadline_leave_nothing_half_done(system: System, ns: str) -> None:
    """The same interruption as a crash, made certain: with a deadline shorter than an apply takes, the
    operator gives up on calls the agent is in the middle of (a loaded node, or a too short
    agent_call_timeout_seconds). Once the deadline is sane again every workload is applied once, and no
    half-made group is left behind or mistaken for another tool's."""
    node = "worker-node-1"
    names = [f"cut-{i}" for i in range(5)]  # one guaranteed way each: the 11-way cache's pool holds 5
    system.restart_operator(agent_call_timeout_seconds=0.02)
    for i, name in enumerate(names):
        system.create(ns, name, {**guaranteed(str(2 + i)), "nodes": [node]})

    def attempted() -> bool:
        statuses = [system.states(ns, n).get(node, {}).get("status") for n in names]
        return None not in statuses and "Pending" in statuses

    system.wait(attempted, "every workload attempted, and calls given up on", 60)
    time.sleep(4)  # a few more attempts, each cut short
    system.restart_operator()

    for name in names:
        system.wait_states(ns, name, {node: "Successful"})
    held = system.held(node, ns)
    assert sorted(held) == names
    groups = resctrl_groups(system.node(node))
    own = {g for g in groups if g.startswith(f"rmd-{ns}.")}
    assert own == {held[n].cos_name for n in names}, f"groups {own}, held {sorted(held)}"
    for i, name in enumerate(names):
        assert groups[held[name].cos_name].cpus == {2 + i}
    assert system.node(node).check_resctrl() == []


def test_unreachable_agent_is_reported_and_recovers(system: System, ns: str) -> None:
    """worker-node-3's agent runs in a network namespace of its own and its link is cut (see the module
    docstring; SIGSTOP of the agent where namespaces cannot be made). Workloads on worker-node-1 go on; the
    entries on worker-node-3 that need its agent turn Pending within the retry interval, deletion waits, and
    once the link is back everything converges unasked."""
    node = "worker-node-3"
    both = {"nodes": ["worker-node-1", node]}
    isolation = can_create_namespaces()
    if isolation is None:
        network = system.loop.run(system.cluster.isolate_node(node))
        system.wait_agent_published(node)
        assert system.node(node).endpoint.startswith(network.address + ":")
        cut, restore = network.cut, network.restore
    else:
        print(f"network namespaces unavailable ({isolation}): SIGSTOP of the agent instead")
        process = system.node(node).process
        assert process is not None
        pid = process.pid

        def cut() -> None:
            os.kill(pid, signal.SIGSTOP)

        def restore() -> None:
            os.kill(pid, signal.SIGCONT)

    system.create(ns, "steady", {**shared("40"), **both})
    system.create(ns, "changed", {**shared("41"), **both})
    system.create(ns, "leaving", {**shared("42"), "nodes": [node]})
    for name in ("steady", "changed"):
        system.wait_states(ns, name, {"worker-node-1": "Successful", node: "Successful"})
    system.wait_states(ns, "leaving", {node: "Successful"})

    cut()
    try:
        began = time.monotonic()
        system.create(ns, "new", {**shared("43"), **both})
        system.patch_spec(ns, "changed", {"coreIds": ["41", "44"]})
        system.delete(ns, "leaving")
        # Within the retry interval (one call deadline plus the longest backoff), the entries that need the
        # agent say it cannot be reached.
        budget = CALL_TIMEOUT + RETRY_MAX + 6.0
        for name in ("new", "changed"):
            entry = system.wait_states(ns, name, {"worker-node-1": "Successful", node: "Pending"}, budget)[
                node
            ]
            # Unreachable, or already marked not ready: the cut stops its heartbeat too (item 1 of issue #13).
            reasons = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "HeartbeatExpired")
            assert any(reason in entry["response"] for reason in reasons), entry
        entry = system.wait_states(ns, "leaving", {node: "Pending"}, budget)[node]
        assert "to be removed" in entry["response"]
        pending_after = time.monotonic() - began
        assert pending_after < budget + 2
        assert any(reason == "AgentUnreachable" for reason, _ in system.events(ns, "new"))
        # What the node already enforces stays Successful (resctrl does not need the agent, docs/operator.md),
        # and its entry says the agent cannot confirm it once the drift check finds the agent gone.
        system.wait(
            lambda: "cannot confirm" in system.states(ns, "steady")[node].get("response", ""),
            "the steady entry to say its agent cannot confirm it",
            budget + 30,
        )
        assert system.states(ns, "steady")[node]["status"] == "Successful"
        assert system.get(ns, "leaving") is not None  # its finalizer waits for the node
    finally:
        restore()

    print(f"entries Pending {pending_after:.1f}s after the cut")
    # The link is back: everything converges without anyone doing anything.
    restored = time.monotonic()
    for name in ("new", "changed", "steady"):
        system.wait_states(ns, name, {"worker-node-1": "Successful", node: "Successful"}, 90)
    system.wait_gone(ns, "leaving", 60)
    system.wait(
        lambda: system.states(ns, "steady")[node].get("response") == "Success: OK",
        "the steady entry to be confirmed again",
        90,
    )
    print(f"converged {time.monotonic() - restored:.1f}s after the link came back")
    held = system.held(node, ns)
    assert sorted(held) == ["changed", "new", "steady"]
    assert set(held["changed"].cpus) == {41, 44}
    assert system.states(ns, "changed")[node]["coreIds"] == ["41,44"]
    assert resctrl_groups(system.node(node))["rmd-shared"].cpus == {40, 41, 43, 44}
    assert system.node(node).check_resctrl() == []
