"""`rmdctl validate`'s checks on Snapshots of plain dicts, shaped as the API server returns the objects:
a healthy two-node cluster says nothing worse than info, and each thing broken in it is reported, with its
severity, by the check that owns it, with something to do."""

from __future__ import annotations

import copy
import dataclasses
import datetime
from collections.abc import Callable
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from rmd_api.names import CACHE_WAYS_RESOURCE, NRT_REQUEUE_SECONDS_ANNOTATION
from rmd_api.node_state import topology_manager_detail
from rmd_operator.validate.checks import validate
from rmd_operator.validate.findings import EXIT_ERRORS, EXIT_OK, EXIT_WARNINGS, Finding, exit_status
from rmd_operator.validate.snapshot import PeerCertificate, Snapshot
from rmd_sim.pki import CertificateAuthority

REPO = Path(__file__).resolve().parents[2]
NS = "rmd-system"
NOW = datetime.datetime.now(UTC).replace(microsecond=0)
NODES = ("worker-1", "worker-2")
CA = CertificateAuthority("rmd-test-ca")

Obj = dict[str, Any]


def stamp(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def capabilities(**changes: tuple[bool, str]) -> Obj:
    caps = {
        "resctrlMounted": (True, "/sys/fs/resctrl (rw)"),
        "rdtL3Cat": (True, "11 ways (cbm_mask 7ff, min_cbm_bits 1), 16 CLOSIDs, cache ids 0,1"),
        "mba": (True, "percent, min 10, step 10"),
        "rapl": (True, "4 zones: package-0, dram, package-1, dram"),
        "cpuManagerPolicy": (True, "static"),
        "topologyManagerPolicy": (True, topology_manager_detail("single-numa-node", "container")),
        "podResources": (True, "kubelet.sock: 3 pod(s) listed"),
        "podResourcesGet": (True, "pod lookups use Get"),
        **changes,
    }
    return {k: {"supported": s, "detail": d} for k, (s, d) in caps.items()}


def node_state(node: str, ready: str = "True", reason: str = "AgentReady", message: str = "") -> Obj:
    return {
        "metadata": {"name": f"rmd-node-state-{node}", "namespace": NS},
        "spec": {"node": node},
        "status": {
            "endpoint": "10.0.0.1:50051",
            "capabilities": capabilities(),
            "conditions": [
                {
                    "type": "Ready",
                    "status": ready,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": (NOW - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ],
        },
    }


def lease(node: str, renewed_ago: float = 1.0, duration: int = 13) -> Obj:
    return {
        "metadata": {"name": f"rmd-agent-{node}", "namespace": NS},
        "spec": {
            "holderIdentity": f"rmd-agent-{node}_0001",
            "leaseDurationSeconds": duration,
            "renewTime": stamp(NOW - timedelta(seconds=renewed_ago)),
        },
    }


def zone(name: str, cpus: int, allocatable: int) -> Obj:
    return {
        "name": name,
        "type": "Node",
        "resources": [
            {
                "name": "cpu",
                "capacity": str(cpus),
                "allocatable": str(allocatable),
                "available": str(allocatable),
            }
        ],
    }


def nrt(node: str, policy: str = "single-numa-node", scope: str = "container", uid: str | None = None) -> Obj:
    return {
        "metadata": {
            "name": node,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid or f"uid-{node}"}
            ],
            "managedFields": [{"manager": "rmd-agent", "time": stamp(NOW - timedelta(minutes=5))}],
            "annotations": {NRT_REQUEUE_SECONDS_ANNOTATION: "3"},  # the agents' default
        },
        "attributes": [
            {"name": "nodeTopologyPodsFingerprint", "value": "pfp0v001ef46db3751d8e999"},
            {"name": "nodeTopologyPodsFingerprintMethod", "value": "with-exclusive-resources"},
            {"name": "topologyManagerPolicy", "value": policy},
            {"name": "topologyManagerScope", "value": scope},
        ],
        "zones": [zone("node-0", 32, 31), zone("node-1", 32, 32)],
    }


def node(name: str, ways: str | None = "10", capacity: str | None = "10") -> Obj:
    status: Obj = {"allocatable": {"cpu": "63"}, "capacity": {"cpu": "64"}}
    if ways is not None:
        status["allocatable"][CACHE_WAYS_RESOURCE] = ways
    if capacity is not None:
        status["capacity"][CACHE_WAYS_RESOURCE] = capacity
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "status": status}


def installed_crds() -> dict[str, Obj | None]:
    crds: dict[str, Obj | None] = {}
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        crd["status"] = {"conditions": [{"type": "Established", "status": "True"}]}
        crds[crd["metadata"]["name"]] = crd
    return crds


def deployment(name: str, component: str, available: int = 1, replicas: int = 1, **spec: Any) -> Obj:
    labels = {"app.kubernetes.io/part-of": "rmd-k8s", "app.kubernetes.io/component": component}
    selector = {"app.kubernetes.io/name": "rmd", "app.kubernetes.io/component": component}
    return {
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {"containers": [{"name": component}], **spec},
            },
        },
        "status": {"availableReplicas": available},
    }


def certificate(node: str, validity: timedelta = timedelta(days=7), ca: CertificateAuthority = CA) -> bytes:
    pem = ca.issue_server(
        f"rmd-agent.{node}", dns_names=[f"{node}.rmd-agent.{NS}.svc"], ip_addresses=[], validity=validity
    ).cert_pem
    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


def healthy(**changes: Any) -> Snapshot:
    parts: dict[str, Any] = {
        "nodes": {n: node(n) for n in NODES},
        "node_states": {n: node_state(n) for n in NODES},
        "leases": {n: lease(n) for n in NODES},
        "nrts": {n: nrt(n) for n in NODES},
        "crds": installed_crds(),
        "deployments": [deployment("rmd-operator", "operator")],
        "certificates": {n: PeerCertificate(certificate(n), "10.0.0.1:50051") for n in NODES},
    }
    return Snapshot(namespace=NS, now=NOW, **{**parts, **changes})


def with_state(snap: Snapshot, node_name: str, change: Callable[[Obj], None]) -> Snapshot:
    states = copy.deepcopy(dict(snap.node_states))
    change(states[node_name])
    return dataclasses.replace(snap, node_states=states)


def with_capability(snap: Snapshot, node_name: str, key: str, supported: bool, detail: str) -> Snapshot:
    def change(state: Obj) -> None:
        state["status"]["capabilities"][key] = {"supported": supported, "detail": detail}

    return with_state(snap, node_name, change)


def problems(findings: list[Finding]) -> list[tuple[str | None, str, str]]:
    return [(f.node, f.check, f.severity.value) for f in findings if f.severity.value in ("warning", "error")]


def one(findings: list[Finding], node_name: str | None, check: str) -> Finding:
    (found,) = [f for f in findings if f.node == node_name and f.check == check]
    return found


# --- a healthy cluster --------------------------------------------------------------------------------------


def test_a_healthy_cluster_has_no_problem_and_exits_0() -> None:
    findings = validate(healthy())
    assert problems(findings) == []
    assert exit_status(findings) == EXIT_OK
    for n in NODES:
        checks = {f.check for f in findings if f.node == n}
        assert checks == {
            "agent",
            "rdt",
            "mba",
            "rapl",
            "cpu-manager",
            "topology-manager",
            "reserved-cpus",
            "pod-resources",
            "pod-resources-get",
            "nrt",
            "device-plugin",
            "certificate",
        }
    assert (
        one(findings, "worker-1", "reserved-cpus").message == "1 reserved (node-0: 1, node-1: 0), 63 for pods"
    )
    assert one(findings, None, "scheduler").severity.value == "info"  # none deployed: said, not a problem
    assert "valid until" in one(findings, "worker-1", "certificate").message


def test_skip_leaves_a_check_out() -> None:
    findings = validate(healthy(), frozenset({"certificate", "rapl"}))
    assert not [f for f in findings if f.check in ("certificate", "rapl")]


# --- the agent ----------------------------------------------------------------------------------------------


def test_an_agent_without_rmdnodestate_is_an_error_and_nothing_else_is_judged() -> None:
    snap = healthy()
    snap = dataclasses.replace(snap, node_states={"worker-1": snap.node_states["worker-1"]})
    ds = deployment("rmd-agent", "agent")
    ds["status"] = {"desiredNumberScheduled": 2, "numberReady": 2}
    pod = {
        "metadata": {
            "name": "rmd-agent-x1",
            "namespace": NS,
            "labels": ds["spec"]["selector"]["matchLabels"],
        },
        "spec": {"nodeName": "worker-2"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    findings = validate(dataclasses.replace(snap, daemonsets=[ds], pods=[pod]))
    agent = one(findings, "worker-2", "agent")
    assert (
        agent.severity.value == "error"
        and "no RmdNodeState rmd-node-state-worker-2 in rmd-system" in agent.message
    )
    assert {f.check for f in findings if f.node == "worker-2"} == {"agent"}


@pytest.mark.parametrize(
    ("reason", "fix_says"),
    [
        ("AgentStopped", "shut down"),
        ("HeartbeatExpired", "renewing its heartbeat"),
        ("EngineNotReady", "cannot"),
    ],
)
def test_an_agent_not_ready_is_an_error_with_its_reason(reason: str, fix_says: str) -> None:
    def change(state: Obj) -> None:
        state["status"]["conditions"][0].update(status="False", reason=reason, message="why it is so")

    findings = validate(with_state(healthy(), "worker-1", change))
    agent = one(findings, "worker-1", "agent")
    assert agent.severity.value == "error"
    assert f"not Ready ({reason}: why it is so)" in agent.message
    assert fix_says in agent.fix
    assert exit_status(findings) == EXIT_ERRORS


def test_an_expired_heartbeat_behind_ready_true_is_an_error_that_suspects_the_operator() -> None:
    snap = healthy()
    leases = {**snap.leases, "worker-1": lease("worker-1", renewed_ago=30, duration=13)}
    findings = validate(dataclasses.replace(snap, leases=leases))
    agent = one(findings, "worker-1", "agent")
    assert agent.severity.value == "error"
    assert "heartbeat Lease expired 17s ago" in agent.message and "is the operator running?" in agent.message
    # Its NodeResourceTopology is kept by nobody meanwhile.
    assert "its agent is not running" in one(findings, "worker-1", "nrt").message


def test_a_lease_within_its_duration_and_the_clock_slack_is_alive() -> None:
    snap = healthy()
    leases = {**snap.leases, "worker-1": lease("worker-1", renewed_ago=14.5, duration=13)}
    assert problems(validate(dataclasses.replace(snap, leases=leases))) == []


def test_no_heartbeat_lease_is_info() -> None:
    snap = healthy()
    findings = validate(dataclasses.replace(snap, leases={"worker-2": snap.leases["worker-2"]}))
    agent = one(findings, "worker-1", "agent")
    assert agent.severity.value == "info" and "heartbeat_seconds" in agent.fix


def test_an_agent_pod_that_is_not_ready_is_an_error_naming_the_kubelets_reason() -> None:
    ds = deployment("rmd-agent", "agent")
    ds["status"] = {"desiredNumberScheduled": 2, "numberReady": 1}
    labels = ds["spec"]["selector"]["matchLabels"]
    waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}}
    pods = [
        {
            "metadata": {"name": "rmd-agent-a", "namespace": NS, "labels": labels},
            "spec": {"nodeName": "worker-1"},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": "agent", "state": waiting}],
            },
        },
        {
            "metadata": {"name": "rmd-agent-b", "namespace": NS, "labels": labels},
            "spec": {"nodeName": "worker-2"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
    ]
    findings = validate(healthy(daemonsets=[ds], pods=pods))
    agent = one(findings, "worker-1", "agent")
    assert agent.severity.value == "error"
    assert "rmd-agent-a not ready: agent: CrashLoopBackOff (back-off 5m0s)" in agent.message
    assert "kubectl -n rmd-system logs rmd-agent-a" in agent.fix
    assert one(findings, "worker-2", "agent").message.endswith("; pod rmd-agent-b")
    assert one(findings, None, "agents").message == "DaemonSet rmd-agent: 1/2 agent pod(s) ready"


# --- what the node supports, and its kubelet ----------------------------------------------------------------


def test_no_rdt_is_a_warning_giving_both_reasons() -> None:
    snap = with_capability(
        healthy(), "worker-2", "rdtL3Cat", False, "the CPU supports RDT but resctrl is not mounted"
    )
    snap = with_capability(snap, "worker-2", "resctrlMounted", False, "nothing mounted at /sys/fs/resctrl")
    findings = validate(snap)
    rdt = one(findings, "worker-2", "rdt")
    assert rdt.severity.value == "warning"
    assert rdt.message == (
        "no RDT L3 cache allocation: the CPU supports RDT but resctrl is not mounted "
        "(resctrl: nothing mounted at /sys/fs/resctrl)"
    )
    assert "mount -t resctrl" in rdt.fix
    assert exit_status(findings) == EXIT_WARNINGS


@pytest.mark.parametrize(("key", "check"), [("mba", "mba"), ("rapl", "rapl")])
def test_no_mba_or_rapl_is_only_info(key: str, check: str) -> None:
    findings = validate(with_capability(healthy(), "worker-1", key, False, "not on this CPU"))
    found = one(findings, "worker-1", check)
    assert found.severity.value == "info" and found.message.endswith("not on this CPU") and found.fix
    assert exit_status(findings) == EXIT_OK


def test_a_cpu_manager_that_is_not_static_is_a_warning() -> None:
    snap = with_capability(
        healthy(), "worker-1", "cpuManagerPolicy", False, "cpuManagerPolicy is 'none': ..."
    )
    finding = one(validate(snap), "worker-1", "cpu-manager")
    assert finding.severity.value == "warning" and "cpuManagerPolicy: static" in finding.fix


def test_topology_manager_none_is_info_and_different_policies_are_a_cluster_warning() -> None:
    snap = with_capability(
        healthy(), "worker-2", "topologyManagerPolicy", True, topology_manager_detail("none", "container")
    )
    snap = dataclasses.replace(snap, nrts={**snap.nrts, "worker-2": nrt("worker-2", policy="none")})
    findings = validate(snap)
    assert one(findings, "worker-2", "topology-manager").severity.value == "info"
    consistency = one(findings, None, "topology-consistency")
    assert consistency.severity.value == "warning"
    assert (
        "(policy none, scope container: worker-2; policy single-numa-node, scope container: worker-1)"
        in consistency.message
    )
    assert problems(findings) == [(None, "topology-consistency", "warning")]


def test_an_unreadable_kubelet_config_leaves_the_topology_manager_unknown() -> None:
    snap = with_capability(
        healthy(), "worker-1", "topologyManagerPolicy", False, "/var/lib/kubelet/config.yaml ..."
    )
    findings = validate(snap)
    assert one(findings, "worker-1", "topology-manager").message.startswith("unknown: /var/lib/kubelet")
    assert one(findings, None, "topology-consistency").severity.value == "ok"  # worker-2 alone


def test_no_reserved_cpu_with_the_static_cpu_manager_is_a_warning() -> None:
    snap = healthy()
    flat = nrt("worker-1")
    flat["zones"] = [zone("node-0", 32, 32), zone("node-1", 32, 32)]
    finding = one(
        validate(dataclasses.replace(snap, nrts={**snap.nrts, "worker-1": flat})), "worker-1", "reserved-cpus"
    )
    assert finding.severity.value == "warning" and "reservedSystemCPUs" in finding.fix


def test_pod_resources_unavailable_is_an_error_and_get_unavailable_only_info() -> None:
    snap = with_capability(healthy(), "worker-1", "podResources", False, "no answer within 2s")
    assert one(validate(snap), "worker-1", "pod-resources").severity.value == "error"
    detail = "pod lookups use List (Get disabled: PodResources API Get method disabled): ..."
    findings = validate(with_capability(healthy(), "worker-2", "podResourcesGet", False, detail))
    get = one(findings, "worker-2", "pod-resources-get")
    assert (get.severity.value, get.message) == ("info", detail)
    assert "KubeletPodResourcesGet" in get.fix
    assert exit_status(findings) == EXIT_OK


def test_a_capability_the_agent_does_not_report_is_info() -> None:
    def drop(state: Obj) -> None:
        del state["status"]["capabilities"]["rapl"]

    finding = one(validate(with_state(healthy(), "worker-1", drop)), "worker-1", "rapl")
    assert finding.severity.value == "info" and "not reported" in finding.message


# --- NodeResourceTopology and the device plugin -------------------------------------------------------------


def test_a_missing_nrt_is_a_warning_and_an_error_once_a_numa_aware_scheduler_runs() -> None:
    snap = healthy()
    snap = dataclasses.replace(snap, nrts={"worker-2": snap.nrts["worker-2"]})
    assert one(validate(snap), "worker-1", "nrt").severity.value == "warning"
    configmap, scheduler = scheduler_objects("Autodetect")
    with_scheduler = dataclasses.replace(
        snap, configmaps=[configmap], deployments=[*snap.deployments, scheduler]
    )
    finding = one(validate(with_scheduler), "worker-1", "nrt")
    assert finding.severity.value == "error" and "cannot place pods on this node" in finding.message


def test_an_nrt_of_an_earlier_node_is_stale() -> None:
    snap = healthy()
    old = nrt("worker-1", uid="uid-of-the-node-before")
    finding = one(validate(dataclasses.replace(snap, nrts={**snap.nrts, "worker-1": old})), "worker-1", "nrt")
    assert finding.severity.value == "warning"
    assert "stale: it belongs to an earlier Node of this name (uid uid-of-the-node-before)" in finding.message


def test_an_nrt_disagreeing_with_the_kubelet_config_the_agent_reads_is_stale() -> None:
    snap = healthy()
    old = nrt("worker-1", policy="best-effort")
    finding = one(validate(dataclasses.replace(snap, nrts={**snap.nrts, "worker-1": old})), "worker-1", "nrt")
    assert finding.message == (
        "NodeResourceTopology worker-1 is stale: it says topology manager policy best-effort, scope "
        "container, while the agent reads single-numa-node, scope container from the kubelet config"
    )


def test_a_fresh_nrt_says_its_fingerprint_method_and_last_change() -> None:
    finding = one(validate(healthy()), "worker-1", "nrt")
    assert (
        finding.message == "2 zone(s), pod fingerprint method with-exclusive-resources, last changed 5m ago"
    )


@pytest.mark.parametrize(
    ("ways", "capacity", "says"),
    [
        (None, None, "the Node has no intel.com/l3_cache_ways"),
        ("0", "10", "0 allocatable: its 10 device(s) are unhealthy"),
        ("0", "0", "0 allocatable: the plugin offers no ways"),
    ],
)
def test_a_device_plugin_that_is_not_registered_or_has_no_device_is_a_warning(
    ways: str | None, capacity: str | None, says: str
) -> None:
    snap = healthy()
    finding = one(
        validate(
            dataclasses.replace(snap, nodes={**snap.nodes, "worker-1": node("worker-1", ways, capacity)})
        ),
        "worker-1",
        "device-plugin",
    )
    assert finding.severity.value == "warning" and says in finding.message and "device-plugins" in finding.fix


def test_no_cache_ways_on_a_node_without_rdt_is_expected() -> None:
    snap = with_capability(healthy(), "worker-1", "rdtL3Cat", False, "no L3 CAT")
    snap = dataclasses.replace(snap, nodes={**snap.nodes, "worker-1": node("worker-1", None, None)})
    assert one(validate(snap), "worker-1", "device-plugin").severity.value == "info"


# --- the agents' certificates -------------------------------------------------------------------------------


def with_certificate(der: bytes | None, problem: str = "", source: str = "10.0.0.1:50051") -> Snapshot:
    snap = healthy()
    return dataclasses.replace(
        snap, certificates={**snap.certificates, "worker-1": PeerCertificate(der, source, problem)}
    )


def test_a_certificate_past_three_quarters_of_its_life_is_a_warning() -> None:
    # 1 h backdated + 10 min: a quarter of 70 min is 17.5 min, and 10 are left. Judged at the time it was
    # issued, not at NOW (the module's import): the suite may reach this test minutes later.
    issued = certificate("worker-1", timedelta(minutes=10))
    snap = dataclasses.replace(
        with_certificate(issued), now=datetime.datetime.now(UTC).replace(microsecond=0)
    )
    finding = one(validate(snap), "worker-1", "certificate")
    assert finding.severity.value == "warning" and finding.message.startswith(
        ("expires in 9m, at ", "expires in 10m, at ")
    )
    assert "two thirds" in finding.fix


def test_a_shared_certificate_expiring_says_how_to_rotate_it() -> None:
    """A year's certificate (tls.agentCertificates: shared) warns 30 days ahead, and nothing renews it."""
    pem = CA.issue_server(
        "rmd-agent", dns_names=[f"*.rmd-agent.{NS}.svc"], ip_addresses=[], validity=timedelta(days=365)
    ).cert_pem
    der = x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)
    snap = dataclasses.replace(with_certificate(der), now=NOW + timedelta(days=340))
    snap = dataclasses.replace(snap, certificates={"worker-1": snap.certificates["worker-1"]}, leases={})
    finding = one(validate(snap), "worker-1", "certificate")
    assert finding.severity.value == "warning" and finding.message.startswith("expires in 25d")
    assert "tls.reissue" in finding.fix


def test_an_expired_certificate_is_an_error() -> None:
    expired = dataclasses.replace(healthy(), now=NOW + timedelta(days=8))
    finding = one(validate(expired), "worker-1", "certificate")
    assert finding.severity.value == "error" and finding.message.startswith("expired at ")


def test_a_certificate_not_valid_yet_is_an_error() -> None:
    early = dataclasses.replace(healthy(), now=NOW - timedelta(hours=2))
    assert "not valid before" in one(validate(early), "worker-1", "certificate").message


def test_a_certificate_for_another_name_than_the_operator_expects_is_an_error() -> None:
    env = [{"name": "RMD_OPERATOR_AGENT_SERVER_NAME", "value": "{node}.agents.example"}]
    operator = deployment("rmd-operator", "operator")
    operator["spec"]["template"]["spec"]["containers"][0]["env"] = env
    findings = validate(healthy(deployments=[operator]))
    finding = one(findings, "worker-1", "certificate")
    assert finding.severity.value == "error"
    assert finding.message.startswith(
        "names worker-1.rmd-agent.rmd-system.svc, not worker-1.agents.example, which the operator expects"
    )
    operator["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "RMD_OPERATOR_AGENT_SERVER_NAME", "value": "{node}.rmd-agent.rmd-system.svc"}
    ]
    assert problems(validate(healthy(deployments=[operator]))) == []


def ca_bundle(*cas: CertificateAuthority) -> Obj:
    return {
        "metadata": {
            "name": "rmd-ca-bundle",
            "namespace": NS,
            "labels": {"app.kubernetes.io/part-of": "rmd-k8s"},
        },
        "data": {"ca.crt": b"".join(ca.cert_pem for ca in cas).decode()},
    }


def test_a_certificate_from_a_ca_the_operator_does_not_trust_is_an_error() -> None:
    other = CertificateAuthority("someone-else")
    findings = validate(healthy(configmaps=[ca_bundle(other)]))
    finding = one(findings, "worker-1", "certificate")
    assert finding.severity.value == "error"
    assert "issued by rmd-test-ca, not by a CA of ConfigMap rmd-system/rmd-ca-bundle" in finding.message
    assert problems(validate(healthy(configmaps=[ca_bundle(other, CA)]))) == []  # a CA rotation's bundle


def test_an_unreachable_agent_leaves_its_certificate_unchecked() -> None:
    finding = one(
        validate(with_certificate(None, "cannot read it from 10.0.0.1:50051: timed out")),
        "worker-1",
        "certificate",
    )
    assert (
        finding.severity.value == "info"
        and finding.message == "not checked: cannot read it from 10.0.0.1:50051: timed out"
    )


def test_bytes_that_are_no_certificate_are_an_error() -> None:
    finding = one(validate(with_certificate(b"nonsense")), "worker-1", "certificate")
    assert finding.severity.value == "error" and "not an X.509 certificate" in finding.message


# --- the cluster --------------------------------------------------------------------------------------------


def test_a_missing_crd_is_an_error_and_one_of_another_release_a_warning() -> None:
    crds = installed_crds()
    crds["rmdworkloads.intel.com"] = None
    older = crds["rmdnodestates.intel.com"]
    assert older is not None
    del older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"][
        "workloads"
    ]
    findings = validate(healthy(crds=crds))
    by_crd = {f.message.split(" ")[0].rstrip(":"): f for f in findings if f.check == "crd"}
    assert by_crd["rmdworkloads.intel.com"].severity.value == "error"
    assert by_crd["rmdnodestates.intel.com"].severity.value == "warning"
    assert "the schema of v1alpha1 is not this release's" in by_crd["rmdnodestates.intel.com"].message
    assert "kubectl apply --server-side -f charts/rmd/crds" in by_crd["rmdnodestates.intel.com"].fix
    assert by_crd["noderesourcetopologies.topology.node.k8s.io"].severity.value == "ok"


def test_wao_cores_crds_missing_or_of_another_schema_are_only_worth_knowing() -> None:
    """nodeTelemetry.installCRDs=false: no NodeConfig CRDs, or wao-core's own in their place."""
    crds = installed_crds()
    crds["nodeconfigs.wao.bitmedia.co.jp"] = None
    theirs = crds["nodeconfigtemplates.wao.bitmedia.co.jp"]
    assert theirs is not None
    theirs["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"
    ] = []
    findings = validate(healthy(crds=crds))
    by_crd = {f.message.split(" ")[0].rstrip(":"): f for f in findings if f.check == "crd"}
    assert by_crd["nodeconfigs.wao.bitmedia.co.jp"].severity.value == "info"
    assert "no node telemetry" in by_crd["nodeconfigs.wao.bitmedia.co.jp"].message
    assert by_crd["nodeconfigtemplates.wao.bitmedia.co.jp"].severity.value == "info"
    assert "wao-core's own" in by_crd["nodeconfigtemplates.wao.bitmedia.co.jp"].message


def test_a_crd_not_serving_the_version_rmd_uses_is_an_error() -> None:
    crds = installed_crds()
    nrt_crd = crds["noderesourcetopologies.topology.node.k8s.io"]
    assert nrt_crd is not None
    nrt_crd["spec"]["versions"][0]["name"] = "v1alpha1"  # an exporter's older CRD
    finding = next(f for f in validate(healthy(crds=crds)) if f.check == "crd" and f.severity.value != "ok")
    assert finding.severity.value == "error"
    assert (
        "does not serve v1alpha2, which the agents and the operator use (it serves v1alpha1)"
        in finding.message
    )


def test_a_crd_that_differs_only_in_descriptions_is_this_releases() -> None:
    """Upstream's NodeResourceTopology CRD (scheduler-plugins, NROP) is ours field for field, its descriptions
    aside; it also serves v1alpha1."""
    crds = installed_crds()
    nrt_crd = crds["noderesourcetopologies.topology.node.k8s.io"]
    assert nrt_crd is not None
    schema = nrt_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["description"] = "NodeResourceTopology describes node resources and their topology."
    schema["properties"]["zones"]["description"] = "Zones of the node."
    extra = copy.deepcopy(nrt_crd["spec"]["versions"][0])
    extra.update(name="v1alpha1", storage=False)
    nrt_crd["spec"]["versions"].append(extra)
    assert problems(validate(healthy(crds=crds))) == []


def test_the_operator_down_is_an_error_with_the_pods_reason() -> None:
    operator = deployment("rmd-operator", "operator", available=0)
    pod = {
        "metadata": {
            "name": "rmd-operator-1",
            "namespace": NS,
            "labels": operator["spec"]["selector"]["matchLabels"],
        },
        "status": {"phase": "Pending"},
    }
    finding = one(validate(healthy(deployments=[operator], pods=[pod])), None, "operator")
    assert finding.severity.value == "error"
    assert (
        finding.message
        == "the operator is down: Deployment rmd-operator: 0/1 available (pod rmd-operator-1: Pending)"
    )
    scaled = deployment("rmd-operator", "operator", available=0, replicas=0)
    assert "scaled to 0 replicas" in one(validate(healthy(deployments=[scaled])), None, "operator").message


def test_no_operator_deployment_is_an_error() -> None:
    finding = one(validate(healthy(deployments=[])), None, "operator")
    assert finding.severity.value == "error" and "-n" in finding.fix


def test_no_agent_at_all_says_to_check_the_namespace() -> None:
    finding = one(validate(healthy(node_states={}, leases={})), None, "agents")
    assert finding.severity.value == "error" and "no agent in rmd-system" in finding.message


def test_a_daemonset_selecting_no_node_is_a_warning() -> None:
    ds = deployment("rmd-agent", "agent")
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"feature.node.kubernetes.io/cpu-rdt.RDTL3CA": "true"}
    ds["status"] = {"desiredNumberScheduled": 0, "numberReady": 0}
    finding = one(validate(healthy(daemonsets=[ds])), None, "agents")
    assert finding.severity.value == "warning" and "RDTL3CA" in finding.message


def test_what_cannot_be_read_is_an_access_error() -> None:
    findings = validate(healthy(unreadable={"leases in rmd-system": "forbidden (no list)"}))
    finding = one(findings, None, "access")
    assert (
        finding.severity.value == "error"
        and finding.message == "cannot read leases in rmd-system: forbidden (no list)"
    )


# --- the NUMA-aware scheduler -------------------------------------------------------------------------------


def scheduler_objects(
    resync_method: str | None, plugins: Obj | None = None, name: str = "topology-aware", period: int = 2
) -> tuple[Obj, Obj]:
    args: Obj = {"cacheResyncPeriodSeconds": period}
    if resync_method is not None:
        args["cache"] = {"resyncMethod": resync_method}
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {
                "schedulerName": name,
                "plugins": plugins or {"filter": {"enabled": [{"name": "NodeResourceTopologyMatch"}]}},
                "pluginConfig": [{"name": "NodeResourceTopologyMatch", "args": args}],
            }
        ],
    }
    configmap = {
        "metadata": {"name": "sched-config", "namespace": NS},
        "data": {"config.yaml": yaml.safe_dump(config)},
    }
    volume = {"name": "config", "projected": {"sources": [{"configMap": {"name": "sched-config"}}]}}
    return configmap, deployment("topology-aware", "scheduler", volumes=[volume])


@pytest.mark.parametrize("method", [None, "Autodetect", "OnlyExclusiveResources"])
def test_a_scheduler_whose_cache_matches_the_agents_is_ok(method: str | None) -> None:
    configmap, sched = scheduler_objects(method)
    snap = healthy(configmaps=[configmap], deployments=[deployment("rmd-operator", "operator"), sched])
    finding = one(validate(snap), None, "scheduler")
    assert finding.severity.value == "ok"
    assert finding.message.startswith(
        "profile topology-aware (ConfigMap rmd-system/sched-config): Deployment"
    )


def test_a_scheduler_whose_cache_resync_cannot_match_the_agents_fingerprints_is_an_error() -> None:
    configmap, sched = scheduler_objects("All")
    snap = healthy(configmaps=[configmap], deployments=[deployment("rmd-operator", "operator"), sched])
    finding = one(validate(snap), None, "scheduler")
    assert finding.severity.value == "error"
    assert "the agents of worker-1, worker-2 publish with-exclusive-resources (2 node(s))" in finding.message
    assert "resyncMethod: Autodetect" in finding.fix
    # Without the reserve cache, fingerprints are not used.
    configmap, sched = scheduler_objects("All", period=0)
    snap = healthy(configmaps=[configmap], deployments=[deployment("rmd-operator", "operator"), sched])
    assert one(validate(snap), None, "scheduler").severity.value == "ok"


@pytest.mark.parametrize(
    ("delays", "period", "early"),
    [
        ({"worker-1": "3", "worker-2": "3"}, 2, None),  # the defaults: echo 3 s after the deployed 2 s resync
        ({"worker-1": "3", "worker-2": "3"}, 5, "worker-1, worker-2 write their requeue echo 3s"),
        ({"worker-1": "6", "worker-2": "0"}, 5, "worker-2 write their requeue echo 0s"),  # 0: no echo
        (
            {"worker-1": "1", "worker-2": "abc"},
            2,
            "worker-1 write their requeue echo 1s",
        ),  # unreadable: left out
        ({"worker-1": None, "worker-2": None}, 5, None),  # objects that do not say: not judged
        ({"worker-1": "0", "worker-2": "0"}, 0, None),  # no reserve cache: no stale view to retry from
    ],
)
def test_an_echo_that_does_not_follow_the_schedulers_resync_is_a_warning(
    delays: dict[str, str | None], period: int, early: str | None
) -> None:
    configmap, sched = scheduler_objects("OnlyExclusiveResources", period=period)
    nrts = {}
    for name, delay in delays.items():
        obj = nrt(name)
        obj["metadata"]["annotations"] = {} if delay is None else {NRT_REQUEUE_SECONDS_ANNOTATION: delay}
        nrts[name] = obj
    snap = healthy(
        configmaps=[configmap], deployments=[deployment("rmd-operator", "operator"), sched], nrts=nrts
    )
    finding = one(validate(snap), None, "scheduler")
    if early is None:
        assert finding.severity.value == "ok", finding
        return
    assert finding.severity.value == "warning"
    assert f"resyncs its cache every {period}s, but the agents of {early} after a change" in finding.message
    assert f"set the agents' nrt_requeue_seconds above {period}, e.g. {period + 1}" in finding.fix


def test_a_scheduler_without_its_deployment_or_down_is_an_error() -> None:
    configmap, sched = scheduler_objects("Autodetect")
    alone = one(validate(healthy(configmaps=[configmap])), None, "scheduler")
    assert (
        alone.severity.value == "error"
        and "no Deployment in rmd-system mounts this configuration" in alone.message
    )
    down = deployment(
        "topology-aware", "scheduler", available=0, volumes=sched["spec"]["template"]["spec"]["volumes"]
    )
    snap = healthy(configmaps=[configmap], deployments=[deployment("rmd-operator", "operator"), down])
    assert (
        "is down: Deployment topology-aware: 0/1 available" in one(validate(snap), None, "scheduler").message
    )


def test_a_named_scheduler_must_exist_and_enable_the_plugin() -> None:
    snap = healthy(scheduler_name="topology-aware", scheduler_namespaces=("scheduling",))
    missing = one(validate(snap), None, "scheduler")
    assert missing.severity.value == "error"
    assert missing.message == (
        "scheduler topology-aware is not deployed: no KubeSchedulerConfiguration with profile topology-aware "
        "in the ConfigMaps of rmd-system, scheduling"
    )
    configmap, sched = scheduler_objects(
        None,
        plugins={
            "multiPoint": {"enabled": [{"name": "NodeResourceTopologyMatch"}]},
            "filter": {"disabled": [{"name": "*"}]},
        },
    )
    snap = healthy(
        configmaps=[configmap],
        deployments=[deployment("rmd-operator", "operator"), sched],
        scheduler_name="topology-aware",
    )
    plain = one(validate(snap), None, "scheduler")
    assert plain.severity.value == "error" and "does not enable NodeResourceTopologyMatch" in plain.message


def test_a_multipoint_plugin_is_numa_aware() -> None:
    configmap, sched = scheduler_objects(
        None, plugins={"multiPoint": {"enabled": [{"name": "NodeResourceTopologyMatch"}]}}
    )
    snap = healthy(configmaps=[configmap], deployments=[deployment("rmd-operator", "operator"), sched])
    assert one(validate(snap), None, "scheduler").severity.value == "ok"


def test_an_unreadable_scheduler_configuration_is_a_warning() -> None:
    configmap = {
        "metadata": {"name": "broken", "namespace": NS},
        "data": {"c.yaml": "kind: KubeSchedulerConfiguration\n: ["},
    }
    findings = [f for f in validate(healthy(configmaps=[configmap])) if f.check == "scheduler"]
    assert [f.severity.value for f in findings] == ["warning", "info"]
    assert findings[0].message.startswith("ConfigMap rmd-system/broken key c.yaml: not YAML")


def test_the_shared_secrets_certificate_stands_for_every_agent() -> None:
    pem = CA.issue_server("rmd-agent", dns_names=[f"*.rmd-agent.{NS}.svc"], ip_addresses=[]).cert_pem
    der = x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)
    finding = one(
        validate(with_certificate(der, source="Secret rmd-system/rmd-agent-tls")), "worker-1", "certificate"
    )
    assert finding.severity.value == "ok" and f"*.rmd-agent.{NS}.svc" in finding.message
