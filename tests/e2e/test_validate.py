"""`rmdctl validate` end to end: the real control plane (etcd, kube-apiserver, controller-manager, scheduler),
two simulated nodes (FUSE resctrl, a simulated kubelet joined to the API server, a real `rmd-agent serve`
over mTLS) and the real operator, from `rmd_sim.cluster.SimCluster`, shared by the module.

A healthy cluster gives exit status 0 and no warning or error. Then each case injects one misconfiguration,
waits until `rmdctl validate` reports exactly the finding expected (node, check, severity, words of the
message, a fix) with the exit status that goes with it, reverts it, and waits until the report is quiet
again, so the next case starts from a healthy cluster.

SimCluster runs the operator as a process, while the chart runs it as a Deployment, which is what rmdctl
judges the operator's health by. So the module gives the operator a stand-in Deployment with the chart's
labels: its pod is scheduled by the real scheduler and "runs" on a simulated kubelet, and the real
deployment and replicaset controllers keep its status. The operator-down case stops the process and makes
the stand-in's pod unschedulable. The NUMA-aware scheduler case does the same for a scheduler: its
KubeSchedulerConfiguration in a ConfigMap and a Deployment mounting it.

The cluster runs on an event loop in a thread of its own; rmdctl runs in this thread, as `main()` (and once
as the console command, to check the real entry point).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_api.names import NODE_RESOURCE_TOPOLOGY as NRT
from rmd_api.node_state import node_state_name
from rmd_operator.ctl import main as rmdctl
from rmd_sim.cluster import SYSTEM_NAMESPACE, SimCluster
from rmd_sim.control_plane import BinariesNotFound, find_bin_dir, repo_root
from rmd_sim.hosttree import write_kubelet_config
from rmd_sim.loop_thread import LoopThread
from rmd_sim.spec import NodeSpec

pytestmark = pytest.mark.e2e

NODES = ("worker-node-1", "worker-node-2")
EXTRA_NODE = "worker-node-3"
# A heartbeat every second: a killed agent's Lease expires within 3 s.
AGENT = {"heartbeat_seconds": 1.0, "power_interval_seconds": 5.0}
WAIT = 40.0
ARTIFACTS = repo_root() / "artifacts" / "e2e" / "test_validate"
RMD_LABELS = {"app.kubernetes.io/part-of": "rmd-k8s", "app.kubernetes.io/name": "rmd"}
NO_RDT = NodeSpec(
    name="no-rdt",
    rdt=False,
    resctrl_mounted=False,
    mba=False,
    l3_mon=False,
    cores_per_socket=4,
    threads_per_core=1,
)

Obj = dict[str, Any]
_T = TypeVar("_T")


@dataclass(frozen=True)
class Report:
    status: int
    findings: list[Obj]

    def find(self, node: str | None, check: str) -> list[Obj]:
        return [f for f in self.findings if f["node"] == node and f["check"] == check]

    def problems(self) -> list[Obj]:
        return [f for f in self.findings if f["severity"] in ("warning", "error")]


class Harness:
    def __init__(self, cluster: SimCluster, loop: LoopThread) -> None:
        self.cluster = cluster
        self.loop = loop
        self.api = cluster.api_client()
        self.core: Any = client.CoreV1Api(self.api)
        self.apps: Any = client.AppsV1Api(self.api)
        self.objects: Any = client.CustomObjectsApi(self.api)

    def validate(self, *args: str) -> Report:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = rmdctl(
                [
                    "validate",
                    "--kubeconfig",
                    str(self.cluster.kubeconfig),
                    "-n",
                    SYSTEM_NAMESPACE,
                    "--json",
                    *args,
                ]
            )
        return Report(status, json.loads(out.getvalue())["findings"])

    def wait(self, probe: Callable[[Report], bool], what: str, timeout: float = WAIT) -> Report:
        deadline = time.monotonic() + timeout
        while True:
            report = self.validate()
            if probe(report):
                return report
            if time.monotonic() > deadline:
                shown = json.dumps([f for f in report.findings if f["severity"] != "ok"], indent=1)
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what}; last report:\n{shown}"
                )
            time.sleep(0.5)

    def wait_quiet(self, timeout: float = WAIT) -> Report:
        return self.wait(lambda r: r.status == 0 and not r.problems(), "a report without problems", timeout)

    # -- agents and nodes

    def restart_agent(self, node: str, **settings: Any) -> None:
        sim = self.cluster.nodes[node]
        self.loop.run(sim.stop_agent())
        sim.extra_settings = {**AGENT, **settings}
        self.loop.run(sim.start_agent())
        self.wait_published(node)

    def wait_published(self, node: str) -> None:
        endpoint = self.cluster.nodes[node].endpoint
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            with contextlib.suppress(ApiException):
                state = self.objects.get_namespaced_custom_object(
                    "intel.com", "v1alpha1", SYSTEM_NAMESPACE, "rmdnodestates", node_state_name(node)
                )
                status = state.get("status") or {}
                ready = [c for c in status.get("conditions") or () if c.get("type") == "Ready"]
                if status.get("endpoint") == endpoint and ready and ready[0].get("status") == "True":
                    return
            time.sleep(0.2)
        raise AssertionError(f"the agent of {node} did not publish Ready at {endpoint}")

    def kubelet_config(self, node: str, **changes: Any) -> None:
        """Rewrite the node's kubelet config file and restart its agent, which reads it at start."""
        sim = self.cluster.nodes[node]
        write_kubelet_config(dataclasses.replace(sim.spec, **changes), sim.root)
        self.restart_agent(node)

    def nrt(self, node: str) -> Obj:
        obj: Obj = self.objects.get_cluster_custom_object(NRT.group, NRT.version, NRT.plural, node)
        return obj

    # -- stand-in Deployments

    def deployment(self, name: str, component: str, volumes: list[Obj] | None = None) -> None:
        labels = {**RMD_LABELS, "app.kubernetes.io/component": component}
        selector = {"app.kubernetes.io/name": "rmd", "app.kubernetes.io/component": component}
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": selector},
                    "spec": {
                        "automountServiceAccountToken": False,
                        "containers": [{"name": component, "image": f"stand-in/{component}:1"}],
                        "volumes": volumes or [],
                    },
                },
            },
        }
        self.apps.create_namespaced_deployment(SYSTEM_NAMESPACE, body)

    def wait_available(self, name: str) -> None:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            status = self.apps.read_namespaced_deployment_status(name, SYSTEM_NAMESPACE).status
            if (status.available_replicas or 0) >= 1:
                return
            time.sleep(0.2)
        raise AssertionError(f"Deployment {name} did not become available")

    def close(self) -> None:
        self.api.close()


# --- the cases ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    inject: Callable[[Harness], None]
    revert: Callable[[Harness], None]
    node: str | None  # None: a cluster finding
    check: str
    severity: str
    says: str  # words of the message
    status: int  # the exit status: 2 errors, 1 warnings, 0 nothing worse than info
    also: tuple[tuple[str | None, str], ...] = ()  # (node, check) of problems that follow from it

    def expected(self, report: Report) -> bool:
        """The finding is there, and no other problem but those that follow from it."""
        found = any(
            f["severity"] == self.severity and self.says in f["message"]
            for f in report.find(self.node, self.check)
        )
        allowed = {(self.node, self.check), *self.also}
        return found and all((f["node"], f["check"]) in allowed for f in report.problems())


def kill_agent(h: Harness) -> None:
    h.loop.run(h.cluster.nodes["worker-node-1"].stop_agent(signal.SIGKILL))


def no_rdt_node(h: Harness) -> None:
    h.loop.run(h.cluster.add_node(EXTRA_NODE, NO_RDT))
    h.wait_published(EXTRA_NODE)


def remove_no_rdt_node(h: Harness) -> None:
    h.loop.run(h.cluster.remove_node(EXTRA_NODE))
    # The garbage collector deletes the node's RmdNodeState and NodeResourceTopology with the Node.
    h.wait(
        lambda r: not any(f["node"] == EXTRA_NODE for f in r.findings), f"{EXTRA_NODE} gone from the report"
    )


def delete_nrt(h: Harness) -> None:
    h.objects.delete_cluster_custom_object(NRT.group, NRT.version, NRT.plural, "worker-node-1")


def stale_nrt(h: Harness) -> None:
    """An NRT still saying what an earlier kubelet config said: the agent reads single-numa-node now."""
    nrt = h.nrt("worker-node-1")
    for attribute in nrt["attributes"]:
        if attribute["name"] == "topologyManagerPolicy":
            attribute["value"] = "best-effort"
    h.objects.replace_cluster_custom_object(NRT.group, NRT.version, NRT.plural, "worker-node-1", nrt)


CRD_FILE = repo_root() / "crds" / "rmdworkloads.intel.com.yaml"


def older_crd(h: Harness) -> None:
    """The RmdWorkload CRD of an older release: its status lacks a field this release has."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    installed = client.ApiextensionsV1Api(h.api).read_custom_resource_definition(crd["metadata"]["name"])
    older = copy.deepcopy(crd)
    status = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    status.pop(sorted(status)[-1])
    older["metadata"]["resourceVersion"] = installed.metadata.resource_version
    client.ApiextensionsV1Api(h.api).replace_custom_resource_definition(crd["metadata"]["name"], older)


def current_crd(h: Harness) -> None:
    h.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))


def operator_down(h: Harness) -> None:
    """The operator process stopped, and its Deployment's new pod cannot be scheduled."""
    h.loop.run(h.cluster.stop_operator())
    patch = {"spec": {"template": {"spec": {"nodeSelector": {"e2e.rmd.test/no-such-node": "true"}}}}}
    h.apps.patch_namespaced_deployment("rmd-operator", SYSTEM_NAMESPACE, patch)


def operator_up(h: Harness) -> None:
    patch = [{"op": "remove", "path": "/spec/template/spec/nodeSelector"}]
    h.apps.patch_namespaced_deployment(
        "rmd-operator", SYSTEM_NAMESPACE, patch, _content_type="application/json-patch+json"
    )
    h.loop.run(h.cluster.start_operator())
    h.wait_available("rmd-operator")


def short_certificate(h: Harness) -> None:
    h.cluster.nodes["worker-node-2"].cert_validity = datetime.timedelta(minutes=10)
    h.restart_agent("worker-node-2")


def long_certificate(h: Harness) -> None:
    h.cluster.nodes["worker-node-2"].cert_validity = None
    h.restart_agent("worker-node-2")


SCHEDULER_CONFIG = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "leaderElection": {"leaderElect": False},
    "profiles": [
        {
            "schedulerName": "topology-aware-scheduler",
            "plugins": {
                "filter": {"enabled": [{"name": "NodeResourceTopologyMatch"}]},
                "score": {"enabled": [{"name": "NodeResourceTopologyMatch"}]},
            },
            # A fixed resync method that needs the agents to fingerprint every pod; they count only pods with
            # exclusive resources (the default), so the scheduler would never trust their NRTs.
            "pluginConfig": [
                {
                    "name": "NodeResourceTopologyMatch",
                    "args": {"cacheResyncPeriodSeconds": 5, "cache": {"resyncMethod": "All"}},
                }
            ],
        }
    ],
}


def mismatched_scheduler(h: Harness) -> None:
    body = {
        "metadata": {"name": "topology-aware-scheduler-config"},
        "data": {"config.yaml": yaml.safe_dump(SCHEDULER_CONFIG)},
    }
    h.core.create_namespaced_config_map(SYSTEM_NAMESPACE, body)
    volume = {"name": "config", "configMap": {"name": "topology-aware-scheduler-config"}}
    h.deployment("topology-aware-scheduler", "scheduler", [volume])
    h.wait_available("topology-aware-scheduler")


def no_scheduler(h: Harness) -> None:
    h.apps.delete_namespaced_deployment("topology-aware-scheduler", SYSTEM_NAMESPACE)
    h.core.delete_namespaced_config_map("topology-aware-scheduler-config", SYSTEM_NAMESPACE)


def get_disabled(h: Harness) -> None:
    kubelet = h.cluster.nodes["worker-node-2"].kubelet
    assert kubelet is not None
    kubelet.get_enabled = False
    h.restart_agent("worker-node-2")  # its lookups ask Get again at start


def get_enabled(h: Harness) -> None:
    kubelet = h.cluster.nodes["worker-node-2"].kubelet
    assert kubelet is not None
    kubelet.get_enabled = True
    h.restart_agent("worker-node-2")


def restart(node: str, **settings: Any) -> Callable[[Harness], None]:
    return lambda h: h.restart_agent(node, **settings)


def kubelet_config(node: str, **changes: Any) -> Callable[[Harness], None]:
    return lambda h: h.kubelet_config(node, **changes)


CASES = [
    # The operator marks it HeartbeatExpired within seconds; before that, rmdctl judges the Lease itself.
    Case(
        "agent-killed",
        kill_agent,
        restart("worker-node-1"),
        "worker-node-1",
        "agent",
        "error",
        "eartbeat",
        2,
        # Nothing keeps its NodeResourceTopology current meanwhile, and its device plugin's devices are gone.
        also=(("worker-node-1", "nrt"), ("worker-node-1", "device-plugin")),
    ),
    Case(
        "cpu-manager-none",
        kubelet_config("worker-node-2", cpu_manager_policy="none"),
        kubelet_config("worker-node-2"),
        "worker-node-2",
        "cpu-manager",
        "warning",
        "cpuManagerPolicy is 'none'",
        1,
    ),
    Case(
        "topology-managers-differ",
        kubelet_config("worker-node-2", topology_manager_policy="best-effort"),
        kubelet_config("worker-node-2"),
        None,
        "topology-consistency",
        "warning",
        "policy best-effort, scope container: worker-node-2",
        1,
    ),
    Case(
        "no-rdt",
        no_rdt_node,
        remove_no_rdt_node,
        EXTRA_NODE,
        "rdt",
        "warning",
        "no RDT L3 cache allocation",
        1,
    ),
    Case(
        "nrt-deleted",
        delete_nrt,
        restart("worker-node-1"),
        "worker-node-1",
        "nrt",
        "warning",
        "no NodeResourceTopology",
        1,
    ),
    Case(
        "nrt-stale",
        stale_nrt,
        restart("worker-node-1"),
        "worker-node-1",
        "nrt",
        "warning",
        "stale: it says topology manager policy best-effort",
        1,
    ),
    Case(
        "device-plugin-unregistered",
        restart("worker-node-2", device_plugin_enabled=False),
        restart("worker-node-2"),
        "worker-node-2",
        "device-plugin",
        "warning",
        "0 allocatable",
        1,
    ),
    Case(
        "crd-older", older_crd, current_crd, None, "crd", "warning", "rmdworkloads.intel.com: the schema", 1
    ),
    Case("operator-down", operator_down, operator_up, None, "operator", "error", "the operator is down", 2),
    Case(
        "certificate-expiring",
        short_certificate,
        long_certificate,
        "worker-node-2",
        "certificate",
        "warning",
        "expires in",
        1,
    ),
    Case(
        "scheduler-cache-mismatch",
        mismatched_scheduler,
        no_scheduler,
        None,
        "scheduler",
        "error",
        "resyncs its cache with method All",
        2,
    ),
    # Not a problem: the agent uses List (docs/troubleshooting.md); said as info, and the exit status stays 0.
    Case(
        "pod-resources-get-disabled",
        get_disabled,
        get_enabled,
        "worker-node-2",
        "pod-resources-get",
        "info",
        "pod lookups use List",
        0,
    ),
]


# --- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    try:
        find_bin_dir()
    except BinariesNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so the e2e control plane is required: {exc}", pytrace=False)
        pytest.skip(f"e2e control plane unavailable: {exc}")
    parent = "/dev/shm" if Path("/dev/shm").is_dir() else None
    workdir = Path(tempfile.mkdtemp(prefix="rmd-val-", dir=parent))  # short: unix socket paths
    loop = LoopThread()
    cluster = SimCluster(workdir, nodes=NODES, agent_settings=AGENT)
    failed_before = request.session.testsfailed
    try:
        loop.run(cluster.__aenter__())
        h = Harness(cluster, loop)
        try:
            h.deployment("rmd-operator", "operator")  # the operator's stand-in (module docstring)
            h.wait_available("rmd-operator")
            for node in NODES:  # validate looks only at nodes with an RmdNodeState (or an agent pod)
                h.wait_published(node)
            yield h
        finally:
            h.close()
    finally:
        if request.session.testsfailed > failed_before:
            cluster.save_logs(ARTIFACTS)
        try:
            loop.run(cluster.stop())
        finally:
            loop.close()
            shutil.rmtree(workdir, ignore_errors=True)


# --- tests -------------------------------------------------------------------------------------------------


def test_a_healthy_cluster_is_quiet(harness: Harness) -> None:
    report = harness.wait_quiet()
    checks = {(f["node"], f["check"]): f["severity"] for f in report.findings}
    for node in NODES:  # every node was looked at, certificate included (read at the agent's endpoint)
        for check in ("agent", "rdt", "cpu-manager", "nrt", "device-plugin", "certificate", "reserved-cpus"):
            assert checks[(node, check)] == "ok", (node, check)
    assert checks[(None, "operator")] == "ok"
    assert checks[(None, "scheduler")] == "info"  # none deployed: said, not a problem
    # The console command, as people run it: -q prints nothing on a healthy cluster.
    env = {**os.environ, "KUBECONFIG": str(harness.cluster.kubeconfig)}
    done = subprocess.run(
        [sys.executable, "-m", "rmd_operator.ctl", "validate", "-n", SYSTEM_NAMESPACE, "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_injected_misconfiguration_is_reported(harness: Harness, case: Case) -> None:
    harness.wait_quiet()
    case.inject(harness)
    try:
        report = harness.wait(
            case.expected, f"only {case.severity} {case.check} of {case.node or 'the cluster'}: {case.says}"
        )
        finding = next(f for f in report.find(case.node, case.check) if case.says in f["message"])
        assert finding["fix"], finding
        assert report.status == case.status, report.problems()
    finally:
        case.revert(harness)
    harness.wait_quiet()
