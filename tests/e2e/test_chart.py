"""The Helm chart with the real helm (tools/build-binaries.sh) and the real API server.

* `helm lint --strict`, and `helm template` with default and non-default values: what the rendered objects
  say (the agent's mounts, privileges and downward-API environment, the operator's single replica, RBAC);
* the settings the programs would load from the rendered pods (their own loaders, not a re-implementation);
* the rendered certificates, in a real mutual-TLS handshake the way the agent and the operator make it;
* the rendered objects applied with server-side apply (strict field validation) into the test control plane;
* the own-node admission policies and RBAC, exercised as the agent's ServiceAccount (impersonated with the
  node name a pod-bound token carries) and checked with SubjectAccessReviews: its writes, and the certificate
  requests it may make;
* `helm install` and `helm upgrade`: the CA and the certificates are kept, and reissued on request.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agent_tls_server import agent_tls_server
from helm_cli import CHART, Helm
from rmd_agent.heartbeat import renewed_lease
from rmd_agent.kube_api import KubeApi
from rmd_agent.kube_config import load_kubeconfig
from rmd_agent.server.serving_cert import (
    CertificateRequestFailed,
    ServingCertificate,
    new_request,
    request_body,
)
from rmd_agent.settings import AgentSettings
from rmd_agent.settings import load_settings as load_agent_settings
from rmd_api.agent_certs import NODE_ANNOTATION, NODE_NAME_EXTRA, SIGNER_NAME
from rmd_operator.settings import OperatorSettings
from rmd_operator.settings import load_settings as load_operator_settings
from rmd_operator.validate.checks import validate
from rmd_operator.validate.collect import Options, collect
from rmd_operator.validate.context import build_context
from rmd_sim.control_plane import ControlPlane, repo_root

Obj = dict[str, Any]

NFD_RDT_LABEL = "feature.node.kubernetes.io/cpu-rdt.RDTL3CA"
FIELD_MANAGER = "rmd-chart-e2e"
WAO_CRDS = ("nodeconfigs.wao.bitmedia.co.jp", "nodeconfigtemplates.wao.bitmedia.co.jp")
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}

# Values that change nearly every switch the templates have.
NON_DEFAULT_VALUES: Obj = {
    "fullnameOverride": "rmd-x",
    "image": {"registry": "registry.example.com/", "pullSecrets": ["regcred"]},
    "commonLabels": {"team": "platform"},
    "agent": {
        "image": {"digest": "sha256:" + "a" * 64},
        "settings": {"device_plugin_enabled": False, "nrt_enabled": False, "power_enabled": False},
        "policy": {"default": {"gold": {"cache": {"max": 3, "min": 3}}}},
        "ports": {"grpc": 50061, "http": 9100},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"operator": "Exists"}],
        "priorityClassName": "system-node-critical",
        "hostPaths": {"kubeletDir": "/data/kubelet", "kubeletConfig": "/etc/kubernetes/kubelet.yaml"},
        "mountResctrl": False,
        "privileged": True,
        "ownNodePolicy": {"enabled": False},
    },
    "operator": {
        "image": {"tag": "0.1.0-rc1"},
        "settings": {"delete_failed_pods": False, "log_level": "debug", "node_config_templates": False},
        "watchNamespaces": ["team-a", "team-b"],
        "podFinalizersRule": True,
        "ports": {"liveness": 18080},
    },
    "tls": {"agentDomain": "agents.rmd.example", "validityDays": 30},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
    "dashboard": {"namespace": "monitoring", "labels": {"grafana_dashboard": "rmd"}},
}


# -- helm -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm.found(tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def values_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("values") / "non-default.yaml"
    path.write_text(yaml.safe_dump(NON_DEFAULT_VALUES))
    return path


def find(docs: Sequence[Obj], kind: str, name: str | None = None) -> Obj:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} rendered"
    return found[0]


def kinds(docs: Sequence[Obj]) -> set[str]:
    return {d["kind"] for d in docs}


def policy_names(docs: Sequence[Obj]) -> set[str]:
    """The admission policies, each checked to have its binding."""
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bound = {d["spec"]["policyName"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert bound == policies
    return policies


def container(workload: Obj) -> Obj:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: Obj = containers[0]
    return result


def env_of(ctr: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in ctr["env"]}


def mounts(workload: Obj) -> dict[str, tuple[bool, Obj]]:
    """mountPath -> (read-only?, the volume)."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    return {
        m["mountPath"]: (bool(m.get("readOnly")), volumes[m["name"]])
        for m in container(workload)["volumeMounts"]
    }


def host_mounts(workload: Obj) -> dict[str, tuple[bool, str]]:
    """mountPath -> (read-only?, host path) for hostPath volumes."""
    return {
        path: (ro, vol["hostPath"]["path"])
        for path, (ro, vol) in mounts(workload).items()
        if "hostPath" in vol
    }


def rules_of(role: Obj) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


# -- lint and render ------------------------------------------------------------------------------------


def test_lint_strict(helm: Helm, values_file: Path) -> None:
    for extra in ([], ["--values", str(values_file)]):
        result = helm.run("lint", "--strict", str(CHART), *extra)
        assert "0 chart(s) failed" in result.stdout, result.stdout


def test_values_outside_the_schema_are_refused(helm: Helm) -> None:
    result = helm.run("template", "r", str(CHART), "--set", "agent.settings.node_name=x", check=False)
    assert result.returncode != 0 and "node_name" in result.stderr
    result = helm.run("template", "r", str(CHART), "--set", "operator.image.tag=latest", check=False)
    assert result.returncode != 0 and "/operator/image/tag" in result.stderr


def test_default_render(helm: Helm) -> None:
    docs = helm.template("rel", "rmd")
    assert kinds(docs) == {
        "ServiceAccount",
        "Secret",
        "ConfigMap",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "DaemonSet",
        "Deployment",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "CustomResourceDefinition",
    }
    # crds/ are installed by helm, not templated; only wao-core's two are (nodeTelemetry.installCRDs).
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"} == set(WAO_CRDS)
    # The agents' own-node policies: their writes and (tls.agentCertificates: csr) their certificate requests.
    assert policy_names(docs) == {"rel-rmd-rmd-agent-own-node", "rel-rmd-rmd-agent-csr"}
    assert policy_names(helm.template("rel", "rmd", "--set", "tls.agentCertificates=shared")) == {
        "rel-rmd-rmd-agent-own-node"  # no CSR rights, nothing to restrict
    }
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            assert "namespace" not in doc["metadata"]
        elif doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"] and "-rmd-" in doc["metadata"]["name"]
        else:
            assert doc["metadata"]["namespace"] == "rmd", doc["metadata"]

    agent = find(docs, "DaemonSet")
    pod = agent["spec"]["template"]["spec"]
    ctr = container(agent)
    env = env_of(ctr)
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # its Lease's holder
    assert pod["nodeSelector"] == {NFD_RDT_LABEL: "true"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert pod["automountServiceAccountToken"] is True  # the pod-bound token names the node
    assert ctr["args"] == ["serve", "--host-root", "/host"]

    # Read-write only where the agent writes: resctrl and cpufreq (under /sys), the device-plugin
    # directory, its state directory. The kubelet's state, /proc and the pod logs are read-only.
    assert host_mounts(agent) == {
        "/host/sys": (False, "/sys"),
        "/host/sys/fs/resctrl": (False, "/sys/fs/resctrl"),
        "/host/proc": (True, "/proc"),
        "/host/var/lib/kubelet": (True, "/var/lib/kubelet"),
        "/host/var/lib/kubelet/pod-resources": (True, "/var/lib/kubelet/pod-resources"),
        "/host/var/lib/kubelet/device-plugins": (False, "/var/lib/kubelet/device-plugins"),
        "/host/var/lib/rmd-agent": (False, "/var/lib/rmd-agent"),
        "/host/var/log/pods": (True, "/var/log/pods"),
        "/host/var/log/containers": (True, "/var/log/containers"),
    }
    by_path = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    assert by_path["/host/var/lib/kubelet"]["recursiveReadOnly"] == "IfPossible"  # pods' volumes below it
    assert by_path["/host/sys"]["mountPropagation"] == "HostToContainer"
    security = ctr["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["PERFMON"]}
    assert security["readOnlyRootFilesystem"] is True and security["runAsUser"] == 0
    assert {p["name"]: p["containerPort"] for p in ctr["ports"]} == {"grpc": 50051, "http": 8081}
    assert ctr["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert ctr["readinessProbe"]["httpGet"]["path"] == "/readyz"

    operator = find(docs, "Deployment")
    assert operator["spec"]["replicas"] == 1
    assert operator["spec"]["strategy"] == {"type": "Recreate"}
    op_pod = operator["spec"]["template"]["spec"]
    assert op_pod["securityContext"]["runAsNonRoot"] is True and op_pod["securityContext"]["runAsUser"] > 0
    op_ctr = container(operator)
    assert op_ctr["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert op_ctr["securityContext"]["allowPrivilegeEscalation"] is False
    assert op_ctr["args"] == ["run", "--standalone"]
    assert not any("hostPath" in v for v in op_pod["volumes"])
    # The operator (not root) can read its key: the projected files are its group's.
    tls_volume = next(v for v in op_pod["volumes"] if v["name"] == "tls")
    assert op_pod["securityContext"]["fsGroup"] == op_pod["securityContext"]["runAsUser"]
    assert tls_volume["projected"]["defaultMode"] & 0o040

    service = find(docs, "Service", "rel-rmd-agent")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels(agent).items()
    assert service["spec"]["selector"]
    assert not service["spec"]["selector"].items() <= pod_labels(operator).items()
    # The operator's /metrics (node telemetry), on its own Service.
    assert {p["name"]: p["containerPort"] for p in op_ctr["ports"]} == {"liveness": 8080, "metrics": 8081}
    assert env_of(op_ctr)["RMD_OPERATOR_METRICS_LISTEN"]["value"] == "0.0.0.0:8081"
    op_service = find(docs, "Service", "rel-rmd-operator")
    assert op_service["spec"]["selector"].items() <= pod_labels(operator).items()
    assert op_service["spec"]["ports"] == [
        {"name": "http-metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}
    ]

    assert "ServiceMonitor" not in kinds(docs)
    dashboard = find(docs, "ConfigMap", "rel-rmd-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["rmd.json"]) == json.loads(
        (CHART / "dashboards" / "rmd.json").read_text()
    )


def pod_labels(workload: Obj) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def test_default_rbac_is_least_privilege(helm: Helm) -> None:
    docs = helm.template("rel", "rmd")
    agent_role = rules_of(find(docs, "Role", "rel-rmd-agent"))
    assert agent_role == {
        ("intel.com", "rmdnodestates", "get"),
        ("intel.com", "rmdnodestates", "create"),
        ("intel.com", "rmdnodestates", "patch"),
        ("intel.com", "rmdnodestates/status", "patch"),
        # its heartbeat: read back, create once, renew (no list, watch or delete)
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    }
    assert rules_of(find(docs, "ClusterRole", "rel-rmd-rmd-agent")) == {
        ("", "nodes", "get"),
        ("topology.node.k8s.io", "noderesourcetopologies", "get"),
        ("topology.node.k8s.io", "noderesourcetopologies", "create"),
        ("topology.node.k8s.io", "noderesourcetopologies", "update"),
        # its own serving certificate (tls.agentCertificates: csr): ask and read the answer, not approve
        ("certificates.k8s.io", "certificatesigningrequests", "create"),
        ("certificates.k8s.io", "certificatesigningrequests", "get"),
    }
    operator_rules = rules_of(find(docs, "ClusterRole", "rel-rmd-rmd-operator-workloads"))
    operator_rules |= rules_of(find(docs, "ClusterRole", "rel-rmd-rmd-operator-cluster"))
    every_rule = [r for d in docs if d["kind"] in ("Role", "ClusterRole") for r in d["rules"]]
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in every_rule)
    assert not any("secrets" in r["resources"] for r in every_rule)
    writes = {"create", "update", "patch", "delete"}
    assert {(g, r) for g, r, v in operator_rules if v in writes} == {
        ("intel.com", "rmdworkloads"),  # finalizer, kopf's annotations; the pod flow's workloads
        ("intel.com", "rmdworkloads/status"),
        ("intel.com", "rmdnodestates/status"),  # Ready=False when an agent's heartbeat expired
        ("", "events"),
        ("", "pods"),  # delete_failed_pods
        ("certificates.k8s.io", "certificatesigningrequests/approval"),  # the agents' certificates
        ("certificates.k8s.io", "certificatesigningrequests/status"),
        ("wao.bitmedia.co.jp", "nodeconfigs"),  # those of NodeConfigTemplates
        ("wao.bitmedia.co.jp", "nodeconfigtemplates/status"),
        ("wao.bitmedia.co.jp", "nodeconfigs/status"),  # the collectors' values and conditions
    }
    # The predictor's CPU input: reads only.
    assert {("", "nodes", "get"), ("metrics.k8s.io", "nodes", "get")} <= operator_rules
    assert ("wao.bitmedia.co.jp", "nodeconfigs", "update") not in operator_rules  # patched, uid-conditional
    cluster_rules = find(docs, "ClusterRole", "rel-rmd-rmd-operator-cluster")["rules"]
    signer_rules = [r for r in cluster_rules if "signers" in r["resources"]]
    assert signer_rules == [
        {
            "apiGroups": ["certificates.k8s.io"],
            "resources": ["signers"],
            "resourceNames": ["intel.com/rmd-agent-serving"],  # this signer only
            "verbs": ["approve", "sign"],
        }
    ]
    binding = find(docs, "ClusterRoleBinding", "rel-rmd-rmd-operator-workloads")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-rmd-operator", "namespace": "rmd"}]


def test_non_default_render(helm: Helm, values_file: Path) -> None:
    docs = helm.template("rel", "ops", "--values", str(values_file))
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "DaemonSet"} == {"rmd-x-agent"}
    agent = find(docs, "DaemonSet")
    pod = agent["spec"]["template"]["spec"]
    ctr = container(agent)
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}  # replaced, not merged with the NFD label
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert ctr["image"] == "registry.example.com/rmd-k8s/rmd-agent@sha256:" + "a" * 64
    assert (
        container(find(docs, "Deployment"))["image"] == "registry.example.com/rmd-k8s/rmd-operator:0.1.0-rc1"
    )
    assert ctr["securityContext"]["privileged"] is True
    assert "allowPrivilegeEscalation" not in ctr["securityContext"]  # the API refuses false with privileged
    assert {p["name"]: p["containerPort"] for p in ctr["ports"]} == {"grpc": 50061, "http": 9100}
    # No device plugin, no power telemetry, no resctrl mount of its own; the kubelet elsewhere.
    assert host_mounts(agent) == {
        "/host/sys": (False, "/sys"),
        "/host/proc": (True, "/proc"),
        "/host/data/kubelet": (True, "/data/kubelet"),
        "/host/data/kubelet/pod-resources": (True, "/data/kubelet/pod-resources"),
        "/host/etc/kubernetes/kubelet.yaml": (True, "/etc/kubernetes/kubelet.yaml"),
        "/host/var/lib/rmd-agent": (False, "/var/lib/rmd-agent"),
    }
    config = find(docs, "ConfigMap", "rmd-x-agent-config")["data"]
    assert yaml.safe_load(config["policy.yaml"]) == NON_DEFAULT_VALUES["agent"]["policy"]
    assert env_of(ctr)["RMD_POLICY_FILE"]["value"] == "/etc/rmd-agent/config/policy.yaml"

    # NodeResourceTopology export off: no rights to it, no policy at all.
    assert ("topology.node.k8s.io", "noderesourcetopologies", "create") not in rules_of(
        find(docs, "ClusterRole", "rmd-x-ops-agent")
    )
    assert "ValidatingAdmissionPolicy" not in kinds(docs)

    # watchNamespaces: the operator's workload rights are bound in those namespaces (and its own) only.
    bindings = [
        d
        for d in docs
        if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == "rmd-x-ops-operator-workloads"
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["ops", "team-a", "team-b"]
    assert not [d for d in docs if d["kind"] == "ClusterRoleBinding" and "workloads" in d["metadata"]["name"]]
    workload_rules = rules_of(find(docs, "ClusterRole", "rmd-x-ops-operator-workloads"))
    assert ("", "pods", "delete") not in workload_rules
    assert ("", "pods/finalizers", "update") in workload_rules
    # node_config_templates: false (wao-core's controller keeps them): no rights to templates; the collectors
    # (node_telemetry, on) read NodeConfigs and write their status only.
    assert {r for r in workload_rules if r[0] == "wao.bitmedia.co.jp"} == {
        ("wao.bitmedia.co.jp", "nodeconfigs", "get"),
        ("wao.bitmedia.co.jp", "nodeconfigs", "list"),
        ("wao.bitmedia.co.jp", "nodeconfigs", "watch"),
        ("wao.bitmedia.co.jp", "nodeconfigs/status", "patch"),
    }
    # Secrets: get only, bound by RoleBindings in the watched namespaces (nodeTelemetry.secretNamespaces
    # unset), not in the release namespace and never cluster-wide.
    assert rules_of(find(docs, "ClusterRole", "rmd-x-ops-operator-secrets")) == {("", "secrets", "get")}
    secret_bindings = [
        d
        for d in docs
        if d["kind"].endswith("Binding") and d["roleRef"]["name"] == "rmd-x-ops-operator-secrets"
    ]
    assert {(b["kind"], b["metadata"]["namespace"]) for b in secret_bindings} == {
        ("RoleBinding", "team-a"),
        ("RoleBinding", "team-b"),
    }
    assert env_of(container(find(docs, "Deployment")))["RMD_OPERATOR_NAMESPACES"]["value"] == "team-a,team-b"

    for name, port in (("rmd-x-agent", 9100), ("rmd-x-operator", 8081)):
        monitor = find(docs, "ServiceMonitor", name)
        service = find(docs, "Service", name)
        assert monitor["metadata"]["labels"]["release"] == "prom"
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == [service["spec"]["ports"][0]["name"]]
        assert service["spec"]["ports"][0]["port"] == port
    assert not find(docs, "ServiceMonitor", "rmd-x-agent")["spec"]["selector"]["matchLabels"].items() <= (
        find(docs, "Service", "rmd-x-operator")["metadata"]["labels"].items()
    )
    dashboard = find(docs, "ConfigMap", "rmd-x-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "rmd"
    assert all(d["metadata"]["labels"]["team"] == "platform" for d in docs)  # the CRDs' too


# -- what the programs make of the rendered pods --------------------------------------------------------


def pod_environment(workload: Obj, downward: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet would give it, with these downward-API values."""
    env = {}
    for entry in container(workload)["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            env[entry["name"]] = downward[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def mounted_file(docs: Sequence[Obj], workload: Obj, path: str) -> tuple[str, Obj]:
    """Which ConfigMap/Secret key (or hostPath) a file of the container comes from: (key, source)."""
    for mount_path, (_, volume) in mounts(workload).items():
        if path.startswith(mount_path + "/"):
            key = path.removeprefix(mount_path + "/")
            if "configMap" in volume:
                return key, find(docs, "ConfigMap", volume["configMap"]["name"])
            if "projected" in volume:
                for source in volume["projected"]["sources"]:
                    kind, ref = (
                        ("Secret", source["secret"])
                        if "secret" in source
                        else ("ConfigMap", source["configMap"])
                    )
                    if any(item["path"] == key for item in ref["items"]):
                        item = next(i for i in ref["items"] if i["path"] == key)
                        return item["key"], find(docs, kind, ref["name"])
            return key, volume
    raise AssertionError(f"{path} is not mounted")


def file_text(docs: Sequence[Obj], workload: Obj, path: str) -> str:
    key, source = mounted_file(docs, workload, path)
    if source.get("kind") == "Secret":
        return base64.b64decode(source["data"][key]).decode()
    text: str = source["data"][key]
    return text


@pytest.mark.parametrize("with_values", [False, True], ids=["defaults", "non-default"])
def test_settings_the_programs_load_from_the_rendered_pods(
    helm: Helm, values_file: Path, tmp_path: Path, with_values: bool
) -> None:
    args = ["--values", str(values_file)] if with_values else []
    docs = helm.template("rel", "ops", *args)
    agent = find(docs, "DaemonSet")
    downward = {
        "spec.nodeName": "worker-node-1",
        "status.podIP": "10.1.2.3",
        "metadata.namespace": "ops",
        "metadata.name": "rel-rmd-agent-x7k2p",
    }
    env = pod_environment(agent, downward)
    config = tmp_path / "agent.yaml"
    config.write_text(file_text(docs, agent, env["RMD_CONFIG"]))
    args_ = container(agent)["args"]
    settings = load_agent_settings({"host_root": args_[args_.index("--host-root") + 1]}, env, config)
    assert settings.node_name == "worker-node-1"
    assert settings.advertise_address == "10.1.2.3"
    assert settings.node_state_namespace == "ops"
    grpc_port = next(p["containerPort"] for p in container(agent)["ports"] if p["name"] == "grpc")
    assert settings.grpc_listen.endswith(f":{grpc_port}")
    # Every file the agent opens is mounted where it looks for it; with tls.agentCertificates: csr it writes
    # its own key and certificate in its state directory (kept across restarts) and asks for its node's name.
    assert settings.tls_csr
    mounted_file(docs, agent, str(settings.tls_client_ca))
    host = host_mounts(agent)
    for path in (settings.tls_cert, settings.tls_key):
        under = [p for p in host if str(path).startswith(p + "/")]
        assert under and host[max(under, key=len)][0] is False, path  # writable
    for relative, writable in (
        (settings.kubelet_config, False),
        (settings.pod_resources_socket, False),
        (settings.state_path, True),
    ):
        under = [p for p in host if ("/host/" + relative).startswith(p + "/") or "/host/" + relative == p]
        assert under, relative
        read_only = host[max(under, key=len)][0]
        assert read_only == (not writable), relative
    assert settings.kubeconfig == ""  # in-cluster: the pod-bound token
    agent_config = yaml.safe_load(config.read_text()) or {}
    for name, value in agent_config.items():
        assert getattr(settings, name) == (tuple(value) if isinstance(value, list) else value)

    operator = find(docs, "Deployment")
    op_env = pod_environment(operator, {"metadata.namespace": "ops", "metadata.name": "rel-rmd-operator-abc"})
    op_config = tmp_path / "operator.yaml"
    op_config.write_text(file_text(docs, operator, op_env["RMD_OPERATOR_CONFIG"]))
    op = load_operator_settings({}, op_env, op_config)
    assert op.node_state_namespace == settings.node_state_namespace  # where the agents write
    assert op.instance == "rel-rmd-operator-abc"
    for path in (op.agent_ca, op.client_cert, op.client_key):
        mounted_file(docs, operator, str(path))
    liveness = next(p["containerPort"] for p in container(operator)["ports"] if p["name"] == "liveness")
    assert op.liveness_listen.endswith(f":{liveness}")
    metrics = next(p["containerPort"] for p in container(operator)["ports"] if p["name"] == "metrics")
    assert op.metrics_listen == f"0.0.0.0:{metrics}"
    # The name the operator expects from node N's agent is the one that agent asks for; the operator signs
    # for the agents' ServiceAccount only, with the CA mounted from its Secret.
    assert settings.tls_server_name == op.agent_server_name
    agent_sa = agent["spec"]["template"]["spec"]["serviceAccountName"]
    assert op.agent_user() == f"system:serviceaccount:ops:{agent_sa}"
    for path in (op.agent_signer_ca_cert, op.agent_signer_ca_key):
        key, volume = mounted_file(docs, operator, path)
        ca_secret = find(docs, "Secret", volume["secret"]["secretName"])  # the chart's RMD CA
        assert ca_secret["metadata"]["name"].endswith("-ca") and key in ca_secret["data"]
    operator_cert = x509.load_pem_x509_certificate(file_text(docs, operator, str(op.client_cert)).encode())
    operator_sans = operator_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(operator_sans.get_values_for_type(x509.DNSName)) <= set(settings.allowed_clients)
    usages = operator_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages


@pytest.mark.parametrize(
    ("power", "nrt", "logs"),
    [(True, False, {"pods", "containers"}), (False, True, {"pods"}), (False, False, set())],
)
def test_pod_log_directories_are_mounted_for_power_and_the_nrt(
    helm: Helm, power: bool, nrt: bool, logs: set[str]
) -> None:
    """Power metrics name pods and containers from both log directories; the NRT pod fingerprint takes pods'
    namespace/name (for their QoS classes) from the pod log directory only."""
    settings = [
        f"agent.settings.power_enabled={str(power).lower()}",
        f"agent.settings.nrt_enabled={str(nrt).lower()}",
    ]
    docs = helm.template("rel", "ops", *(arg for s in settings for arg in ("--set", s)))
    host = host_mounts(find(docs, "DaemonSet"))
    mounted = {kind for kind in ("pods", "containers") if f"/host/var/log/{kind}" in host}
    assert mounted == logs
    assert all(host[f"/host/var/log/{kind}"] == (True, f"/var/log/{kind}") for kind in mounted)


def _field_names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def test_every_setting_the_chart_sets_is_a_real_setting(helm: Helm) -> None:
    """A renamed setting must not leave the chart setting a variable nobody reads."""
    docs = helm.template("rel", "ops")
    for workload, prefix, cls in (
        (find(docs, "DaemonSet"), "RMD_", AgentSettings),
        (find(docs, "Deployment"), "RMD_OPERATOR_", OperatorSettings),
    ):
        names = {e["name"] for e in container(workload)["env"]}
        for name in names:
            if name.startswith(prefix) and name not in ("RMD_CONFIG", "RMD_OPERATOR_CONFIG"):
                assert name.removeprefix(prefix).lower() in _field_names(cls), name


# -- the rendered certificates, in a real handshake -----------------------------------------------------


def _write_pki(docs: Sequence[Obj], directory: Path) -> dict[str, Path]:
    agent, operator = find(docs, "DaemonSet"), find(docs, "Deployment")
    files = {
        "agent.crt": file_text(docs, agent, "/etc/rmd-agent/tls/tls.crt"),
        "agent.key": file_text(docs, agent, "/etc/rmd-agent/tls/tls.key"),
        "agent-ca.crt": file_text(docs, agent, "/etc/rmd-agent/tls/ca.crt"),
        "operator.crt": file_text(docs, operator, "/etc/rmd-operator/tls/tls.crt"),
        "operator.key": file_text(docs, operator, "/etc/rmd-operator/tls/tls.key"),
        "operator-ca.crt": file_text(docs, operator, "/etc/rmd-operator/tls/ca.crt"),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return {name: directory / name for name in files}


def _health_check(port: int, pki: dict[str, Path], server_name: str) -> grpc.StatusCode:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki["operator-ca.crt"].read_bytes(),
        private_key=pki["operator.key"].read_bytes(),
        certificate_chain=pki["operator.crt"].read_bytes(),
    )
    options = [("grpc.ssl_target_name_override", server_name)]
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()
            return code
    return grpc.StatusCode.OK


def test_rendered_certificates_authenticate_operator_and_agent(helm: Helm, tmp_path: Path) -> None:
    """The agent serves with its rendered certificate and requires a client certificate from the bundle
    (rmd_agent.server.tls); the operator dials with its rendered certificate and the name its settings
    expect for the node. The wildcard covers node names without dots only: the interim's documented limit."""
    shared = ("--set", "tls.agentCertificates=shared")
    docs = helm.template("rel", "ops", *shared)
    pki = _write_pki(docs, tmp_path / "pki")
    other = _write_pki(
        helm.template("rel", "ops", *shared), tmp_path / "other"
    )  # another install: another CA
    env = pod_environment(find(docs, "Deployment"), {"metadata.namespace": "ops", "metadata.name": "op"})
    op = load_operator_settings({}, {k: v for k, v in env.items() if k != "RMD_OPERATOR_CONFIG"})
    with agent_tls_server(pki["agent.crt"], pki["agent.key"], pki["agent-ca.crt"]) as port:
        assert _health_check(port, pki, op.server_name("worker-node-1")) == grpc.StatusCode.OK
        assert (
            _health_check(port, pki, op.server_name("ip-10-0-0-1.ec2.internal"))
            == grpc.StatusCode.UNAVAILABLE
        )
        assert (
            _health_check(port, pki, "worker-node-1.rmd-agent.elsewhere.svc") == grpc.StatusCode.UNAVAILABLE
        )
        # A client from another install's CA is refused by the agent; an agent from it, by the operator.
        stranger = {**pki, "operator.crt": other["operator.crt"], "operator.key": other["operator.key"]}
        assert _health_check(port, stranger, op.server_name("worker-node-1")) == grpc.StatusCode.UNAVAILABLE
        distrustful = {**pki, "operator-ca.crt": other["operator-ca.crt"]}
        assert (
            _health_check(port, distrustful, op.server_name("worker-node-1")) == grpc.StatusCode.UNAVAILABLE
        )


# -- installed into the test control plane --------------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    namespace: str
    release: str
    docs: list[Obj]

    def name(self, kind: str, suffix: str = "") -> str:
        candidates = [d["metadata"]["name"] for d in self.docs if d["kind"] == kind]
        matching: list[str] = [n for n in candidates if n.endswith(suffix)]
        assert len(matching) == 1, (kind, suffix, candidates)
        return matching[0]


def _kubectl_apply(cp: ControlPlane, path: Path, namespace: str) -> subprocess.CompletedProcess[str]:
    return cp.kubectl(
        "apply",
        "--server-side",
        f"--field-manager={FIELD_MANAGER}",
        "--validate=strict",
        "--namespace",
        namespace,
        "-f",
        str(path),
        check=False,
    )


@pytest.fixture(scope="module")
def installed(
    control_plane: ControlPlane, helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    """The default rendering applied with server-side apply into a fresh namespace; removed afterwards."""
    namespace = f"chart-{uuid.uuid4().hex[:8]}"
    with control_plane.api_client() as api:
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
        )
    # wao-core's CRDs are there already (the control plane applies crds/), as where wao-core is installed; and
    # the clean-up below deletes what it applied cluster-wide.
    docs = helm.template("rmd", namespace, "--set", "nodeTelemetry.installCRDs=false")
    path = tmp_path_factory.mktemp("rendered") / "rmd.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    try:
        result = _kubectl_apply(control_plane, path, namespace)
        assert result.returncode == 0, result.stderr
        installed = Installed(namespace, "rmd", docs)
        _wait_until_in_force(control_plane, installed)
        yield installed
    finally:
        cluster_scoped = [d for d in docs if d["kind"] in CLUSTER_SCOPED]
        leftovers = path.with_name("cluster-scoped.yaml")
        leftovers.write_text(yaml.safe_dump_all(cluster_scoped))
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(leftovers), check=False)
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_every_rendered_object_is_stored_as_rendered(
    control_plane: ControlPlane, installed: Installed
) -> None:
    for doc in installed.docs:
        args = ["get", doc["kind"], doc["metadata"]["name"], "-o", "json", "--show-managed-fields"]
        if doc["kind"] not in CLUSTER_SCOPED:
            args += ["--namespace", installed.namespace]
        stored = json.loads(control_plane.kubectl(*args).stdout)
        managers = {m["manager"] for m in stored["metadata"].get("managedFields", [])}
        assert FIELD_MANAGER in managers, doc["metadata"]["name"]
        assert stored["metadata"]["labels"] == doc["metadata"]["labels"]
    stored_ds = json.loads(
        control_plane.kubectl("get", "daemonset", "rmd-agent", "-n", installed.namespace, "-o", "json").stdout
    )
    rendered_ds = find(installed.docs, "DaemonSet")
    assert host_mounts(stored_ds) == host_mounts(rendered_ds)  # nothing dropped (e.g. recursiveReadOnly)
    assert container(stored_ds)["volumeMounts"] == container(rendered_ds)["volumeMounts"]
    assert stored_ds["spec"]["template"]["spec"]["nodeSelector"] == {NFD_RDT_LABEL: "true"}
    stored_deploy = json.loads(
        control_plane.kubectl(
            "get", "deployment", "rmd-operator", "-n", installed.namespace, "-o", "json"
        ).stdout
    )
    assert stored_deploy["spec"]["replicas"] == 1 and stored_deploy["spec"]["strategy"]["type"] == "Recreate"


def test_rmdctl_recognises_what_the_chart_deploys(control_plane: ControlPlane, installed: Installed) -> None:
    """`rmdctl validate` finds the chart's objects by their labels and contents: the operator's Deployment and
    the agents' DaemonSet, the CA bundle the operator trusts and the name it expects of each agent (this
    control plane runs no workload controllers: the Deployment never becomes available)."""
    with control_plane.api_client() as api:
        snapshot = collect(api, Options(installed.namespace, certificates=False))
    context = build_context(snapshot)
    assert context.operator is not None and context.agent_daemonset is not None
    assert context.operator["metadata"]["name"] == installed.name("Deployment", "-operator")
    assert context.agent_daemonset["metadata"]["name"] == installed.name("DaemonSet", "-agent")
    assert context.server_name_pattern == f"{{node}}.rmd-agent.{installed.namespace}.svc"
    ca = base64.b64decode(find(installed.docs, "Secret", installed.name("Secret", "-ca"))["data"]["tls.crt"])
    assert context.ca_bundle is not None and ca.strip() in context.ca_bundle
    findings = {f.check: f for f in validate(snapshot)}
    assert findings["operator"].message.startswith("the operator is down: Deployment rmd-operator: 0/1")
    assert "DaemonSet rmd-agent" in findings["agents"].message
    assert not [f for f in findings.values() if f.check == "access"]  # an administrator reads everything


def documented_validator_rbac(namespace: str) -> list[Obj]:
    """The manifests of docs/validate.md ("What it may read"), for the release in `namespace`."""
    text = (repo_root() / "docs" / "validate.md").read_text()
    block = text.split("\n## What it may read (RBAC)\n", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    docs = [doc for doc in yaml.safe_load_all(block) if doc]
    assert sorted(d["kind"] for d in docs) == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    for doc in docs:
        if doc["kind"] in ("Role", "RoleBinding"):
            doc["metadata"]["namespace"] = namespace
    return docs


def test_rmdctl_reads_everything_it_checks_with_the_documented_rights(
    control_plane: ControlPlane, installed: Installed, tmp_path: Path
) -> None:
    """docs/validate.md's read-only rules are enough: as a member of its group, nothing is refused."""
    docs = documented_validator_rbac(installed.namespace)
    manifest = tmp_path / "validator.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    control_plane.kubectl("apply", "--server-side", "-f", str(manifest))
    try:
        group = next(d for d in docs if d["kind"] == "ClusterRoleBinding")["subjects"][0]["name"]
        deadline = time.monotonic() + 30
        while True:  # RBAC reaches the authorizer's cache asynchronously
            api = control_plane.api_client()
            api.set_default_header("Impersonate-User", "alice")
            api.set_default_header("Impersonate-Group", group)
            with api:
                snapshot = collect(api, Options(installed.namespace))
            if not snapshot.unreadable or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert snapshot.unreadable == {}
        assert snapshot.crds and all(crd is not None for crd in snapshot.crds.values())
        assert [d["metadata"]["name"] for d in snapshot.deployments] == ["rmd-operator"]
        api = control_plane.api_client()
        api.set_default_header("Impersonate-User", "bob")  # not in the group: every read refused
        with api:
            refused = collect(api, Options(installed.namespace))
        assert "nodes" in refused.unreadable and f"leases in {installed.namespace}" in refused.unreadable
    finally:
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(manifest), check=False)


# -- the agent's identity: RBAC and the own-node policy -------------------------------------------------


def _agent_user(installed: Installed) -> str:
    return f"system:serviceaccount:{installed.namespace}:{installed.name('ServiceAccount', '-agent')}"


def _operator_user(installed: Installed) -> str:
    return f"system:serviceaccount:{installed.namespace}:{installed.name('ServiceAccount', '-operator')}"


def _as(cp: ControlPlane, user: str, node: str | None) -> Any:
    """An API client impersonating `user` (its ServiceAccount groups are added by the API server), with the
    node name a pod-bound token would carry."""
    api = cp.api_client()
    api.set_default_header("Impersonate-User", user)
    if node is not None:
        api.set_default_header("Impersonate-Extra-" + NODE_NAME_EXTRA.replace("/", "%2F"), node)
    return api


def node_state(namespace: str, node: str) -> Obj:
    return {
        "apiVersion": "intel.com/v1alpha1",
        "kind": "RmdNodeState",
        "metadata": {"name": f"rmd-node-state-{node}", "namespace": namespace},
        "spec": {"node": node},
    }


def nrt(node: str) -> Obj:
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": node},
        "zones": [],
    }


def _forbidden(call: Any) -> str:
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 403, info.value.body
    message: str = json.loads(str(info.value.body))["message"]
    return message


def _nodes(installed: Installed) -> tuple[str, str]:
    """Two node names of this test's own (NodeResourceTopologies are cluster-scoped and other tests write
    some too)."""
    tag = installed.namespace.removeprefix("chart-")
    return f"worker-node-1-{tag}", f"worker-node-2-{tag}"


def _wait_until_in_force(cp: ControlPlane, installed: Installed) -> None:
    """RBAC and admission policies reach the API server's caches asynchronously. Settled means: the agent's
    dry-run write of its own node's object passes and one of another node's is refused by the policy; where
    the CSR policy is rendered, likewise its own certificate request and one to a kubelet signer."""
    node1, node2 = _nodes(installed)
    deadline = time.monotonic() + 30
    with _as(cp, _agent_user(installed), node1) as api:
        objects = client.CustomObjectsApi(api)

        def dry_run_create(node: str) -> str:
            try:
                objects.create_namespaced_custom_object(
                    "intel.com",
                    "v1alpha1",
                    installed.namespace,
                    "rmdnodestates",
                    node_state(installed.namespace, node),
                    dry_run="All",
                )
            except ApiException as exc:
                if exc.status != 403:
                    raise
                return "policy" if "ValidatingAdmissionPolicy" in str(exc.body) else "rbac"
            return "admitted"

        while (dry_run_create(node1), dry_run_create(node2)) != ("admitted", "policy"):
            assert time.monotonic() < deadline, "RBAC and the own-node policy never took effect"
            time.sleep(0.2)
        csr_policy = [d for d in installed.docs if d["metadata"]["name"].endswith("-agent-csr")]
        if not csr_policy:
            return
        certificates = client.CertificatesV1Api(api)

        def dry_run_ask(body: Obj) -> str:
            try:
                certificates.create_certificate_signing_request(body, dry_run="All")
            except ApiException as exc:
                if exc.status != 403:
                    raise
                return "policy" if "ValidatingAdmissionPolicy" in str(exc.body) else "rbac"
            return "admitted"

        kubelets = _agent_request(node1)
        _for_the_kubelet_serving_signer(kubelets, node2)
        while (dry_run_ask(_agent_request(node1)), dry_run_ask(kubelets)) != ("admitted", "policy"):
            assert time.monotonic() < deadline, "the agents' CSR policy never took effect"
            time.sleep(0.2)


def test_the_agent_writes_its_own_node_objects_only(
    control_plane: ControlPlane, installed: Installed
) -> None:
    ns = installed.namespace
    node1, node2 = _nodes(installed)
    group, version, states = "intel.com", "v1alpha1", "rmdnodestates"
    nrt_api = ("topology.node.k8s.io", "v1alpha2", "noderesourcetopologies")
    # Another identity (here the admin) is not restricted by the policy: it creates node 2's object.
    with control_plane.api_client() as admin_api:
        client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
            group, version, ns, states, node_state(ns, node2)
        )
    try:
        with _as(control_plane, _agent_user(installed), node1) as api:
            agent = client.CustomObjectsApi(api)
            # Its own node: create, patch, status; NodeResourceTopology create and update.
            agent.create_namespaced_custom_object(group, version, ns, states, node_state(ns, node1))
            agent.patch_namespaced_custom_object(
                group, version, ns, states, f"rmd-node-state-{node1}", {"spec": {"nodeUid": "u-1"}}
            )
            agent.patch_namespaced_custom_object_status(
                group,
                version,
                ns,
                states,
                f"rmd-node-state-{node1}",
                {"status": {"endpoint": "10.1.2.3:50051"}},
            )
            created: Obj = agent.create_cluster_custom_object(*nrt_api, nrt(node1))  # type: ignore[assignment]
            agent.replace_cluster_custom_object(*nrt_api, node1, {**created, "attributes": []})

            # Another node's: refused by the policy, with its message.
            own_only = f"the rmd agent of node {node1} may write only RmdNodeState rmd-node-state-{node1}"
            message = _forbidden(
                lambda: agent.create_namespaced_custom_object(
                    group, version, ns, states, node_state(ns, "other")
                )
            )
            assert own_only in message and "not rmd-node-state-other" in message
            message = _forbidden(
                lambda: agent.patch_namespaced_custom_object_status(
                    group,
                    version,
                    ns,
                    states,
                    f"rmd-node-state-{node2}",
                    {"status": {"endpoint": "10.6.6.6:1"}},
                )
            )
            assert own_only in message
            message = _forbidden(
                lambda: agent.patch_namespaced_custom_object(
                    group, version, ns, states, f"rmd-node-state-{node2}", {"spec": {"nodeUid": "x"}}
                )
            )
            assert own_only in message
            message = _forbidden(lambda: agent.create_cluster_custom_object(*nrt_api, nrt(node2)))
            assert f"may write only NodeResourceTopology {node1}, not {node2}" in message

            # Its heartbeat Lease, as its own code writes it: its own only.
            lease_api = ("coordination.k8s.io", "v1", ns, "leases")
            lease = {
                "node": node1,
                "namespace": ns,
                "identity": "pod_1",
                "duration": 13,
                "now": "2026-11-25T21:00:00.000000Z",
            }
            mine = agent.create_namespaced_custom_object(*lease_api, renewed_lease(None, **lease))
            agent.replace_namespaced_custom_object(
                *lease_api, f"rmd-agent-{node1}", renewed_lease(mine, **lease)
            )
            message = _forbidden(
                lambda: agent.create_namespaced_custom_object(
                    *lease_api, renewed_lease(None, **{**lease, "node": node2})
                )
            )
            assert f"may write only the Lease rmd-agent-{node1}, not rmd-agent-{node2}" in message

        # Without a pod-bound token (no node in the request), the agent's identity writes nothing.
        with _as(control_plane, _agent_user(installed), None) as api:
            message = _forbidden(
                lambda: client.CustomObjectsApi(api).create_namespaced_custom_object(
                    group, version, ns, states, node_state(ns, node2 + "-x")
                )
            )
            assert "must use its pod's ServiceAccount token" in message

        # What the agent wrote is stored; node 2's object is untouched.
        with control_plane.api_client() as admin_api:
            admin = client.CustomObjectsApi(admin_api)
            mine: Obj = admin.get_namespaced_custom_object(  # type: ignore[assignment]
                group, version, ns, states, f"rmd-node-state-{node1}"
            )
            assert mine["spec"] == {"node": node1, "nodeUid": "u-1"}
            assert mine["status"]["endpoint"] == "10.1.2.3:50051"
            theirs: Obj = admin.get_namespaced_custom_object(  # type: ignore[assignment]
                group, version, ns, states, f"rmd-node-state-{node2}"
            )
            assert "status" not in theirs and "nodeUid" not in theirs["spec"]
            stored_nrt: Obj = admin.get_cluster_custom_object(*nrt_api, node1)  # type: ignore[assignment]
            assert stored_nrt["attributes"] == []
    finally:
        with control_plane.api_client() as admin_api:
            try:
                client.CustomObjectsApi(admin_api).delete_cluster_custom_object(*nrt_api, node1)
            except ApiException as exc:
                if exc.status != 404:
                    raise


# -- the agent's certificate requests (tls.agentCertificates: csr) ---------------------------------------


def _agent_request(node: str) -> Obj:
    """The CertificateSigningRequest the agent of `node` makes (its own code builds it)."""
    _, pem = new_request(f"rmd-agent.{node}")
    return request_body(node, pem, 3600)


def _kubelet_pem(node: str) -> str:
    """A request in the name of `node`'s kubelet (the subject of kubelet certificates), base64 as in a CSR."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
        ]
    )
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(node)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return base64.b64encode(request.public_bytes(serialization.Encoding.PEM)).decode()


def _for_the_kubelet_serving_signer(body: Obj, other: str) -> None:
    body["spec"] |= {
        "signerName": "kubernetes.io/kubelet-serving",
        "request": _kubelet_pem(other),
        "usages": ["digital signature", "server auth"],
    }


def _for_the_kubelet_client_signer(body: Obj, other: str) -> None:
    body["spec"] |= {
        "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
        "request": _kubelet_pem(other),
        "usages": ["digital signature", "client auth"],
    }


def _with_client_auth(body: Obj, other: str) -> None:
    body["spec"]["usages"] = ["digital signature", "server auth", "client auth"]


def _for_another_node(body: Obj, other: str) -> None:
    body["metadata"]["annotations"] = {NODE_ANNOTATION: other}


def _naming_no_node(body: Obj, other: str) -> None:
    del body["metadata"]["annotations"]


def _for_too_long(body: Obj, other: str) -> None:
    body["spec"]["expirationSeconds"] = 366 * 24 * 3600


_OWN_NODE_ONLY = "for its own node only: annotation " + NODE_ANNOTATION + " must be {node1}, not "


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        pytest.param(
            _for_the_kubelet_serving_signer,
            f"only from signer {SIGNER_NAME}, not kubernetes.io/kubelet-serving",
            id="kubelet-serving-for-another-node",
        ),
        pytest.param(
            _for_the_kubelet_client_signer,
            f"only from signer {SIGNER_NAME}, not kubernetes.io/kube-apiserver-client-kubelet",
            id="kubelet-client-for-another-node",
        ),
        pytest.param(
            _with_client_auth,
            "only for serving: usages must be exactly ['digital signature', 'server auth'], "
            "not ['digital signature', 'server auth', 'client auth']",
            id="client-auth",
        ),
        pytest.param(_for_another_node, _OWN_NODE_ONLY + "'{node2}'", id="another-node"),
        pytest.param(_naming_no_node, _OWN_NODE_ONLY + "''", id="no-node-named"),
        pytest.param(
            _for_too_long,
            "of at most 30 days: expirationSeconds must be set and at most 2592000",
            id="too-long",
        ),
    ],
)
def test_the_agent_may_ask_only_for_its_own_nodes_serving_certificate(
    control_plane: ControlPlane,
    installed: Installed,
    change: Callable[[Obj, str], None],
    refusal: str,
) -> None:
    """The agent's own request with one thing changed is refused when it is made. The operator denies
    client usage too, but only after the fact; the kubelet signers are not ours, and whether something
    approves such a request for them must not matter."""
    node1, node2 = _nodes(installed)
    body = _agent_request(node1)
    change(body, node2)
    with _as(control_plane, _agent_user(installed), node1) as api:
        message = _forbidden(lambda: client.CertificatesV1Api(api).create_certificate_signing_request(body))
    assert f"the rmd agent of node {node1} may ask for a certificate " in message, message
    assert refusal.format(node1=node1, node2=node2) in message, message


def test_the_agents_own_request_is_admitted_and_is_then_out_of_its_hands(
    control_plane: ControlPlane, installed: Installed, tmp_path: Path
) -> None:
    node1, node2 = _nodes(installed)
    agent = _agent_user(installed)
    with _as(control_plane, agent, node1) as api:
        certificates = client.CertificatesV1Api(api)
        created = certificates.create_certificate_signing_request(_agent_request(node1))
        name = created.metadata.name
        try:
            assert created.spec.signer_name == SIGNER_NAME and created.spec.username == agent
            assert created.spec.extra[NODE_NAME_EXTRA] == [node1]
            # Once made, the agent can only read it: no edit, no approval, no status, no delete (RBAC).
            approved = {"status": {"conditions": [{"type": "Approved", "status": "True", "reason": "Me"}]}}
            refused = [
                _forbidden(
                    lambda: certificates.patch_certificate_signing_request(
                        name, {"metadata": {"annotations": {NODE_ANNOTATION: node2}}}
                    )
                ),
                _forbidden(lambda: certificates.patch_certificate_signing_request_approval(name, approved)),
                _forbidden(
                    lambda: certificates.patch_certificate_signing_request_status(
                        name, {"status": {"certificate": base64.b64encode(b"x").decode()}}
                    )
                ),
                _forbidden(lambda: certificates.delete_certificate_signing_request(name)),
            ]
            assert all("cannot" in m and "certificatesigningrequests" in m for m in refused), refused
            assert certificates.read_certificate_signing_request(name).metadata.annotations == {
                NODE_ANNOTATION: node1
            }
        finally:
            with control_plane.api_client() as admin:
                client.CertificatesV1Api(admin).delete_certificate_signing_request(name)
    # Made with a token that names no node (not bound to a pod), the request is refused, and the agent
    # reports the policy's reason.
    with KubeApi(load_kubeconfig(control_plane.impersonating_kubeconfig(agent))) as api:
        serving = ServingCertificate(
            api,
            node=node1,
            name=f"rmd-agent.{node1}",
            cert_path=tmp_path / "tls.crt",
            key_path=tmp_path / "tls.key",
            expiration_seconds=3600,
        )
        with pytest.raises(CertificateRequestFailed) as refused_at_once:
            asyncio.run(serving.ensure())
    assert "403 Forbidden: " in str(refused_at_once.value)
    assert "must use its pod's ServiceAccount token" in str(refused_at_once.value)


def _allowed(cp: ControlPlane, user: str, verb: str, resource: str, *, namespace: str, group: str) -> bool:
    """RBAC's answer for a ServiceAccount (SubjectAccessReview, as the API server's authorizer sees it)."""
    resource, _, subresource = resource.partition("/")
    sa_namespace = user.split(":")[2]
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user,
            groups=[
                "system:serviceaccounts",
                f"system:serviceaccounts:{sa_namespace}",
                "system:authenticated",
            ],
            resource_attributes=client.V1ResourceAttributes(
                verb=verb,
                resource=resource,
                subresource=subresource or None,
                namespace=namespace or None,
                group=group,
            ),
        )
    )
    with cp.api_client() as api:
        result = client.AuthorizationV1Api(api).create_subject_access_review(review)
    assert result.status is not None
    return bool(result.status.allowed)


def test_rbac_gives_each_identity_what_it_needs_and_nothing_else(
    control_plane: ControlPlane, installed: Installed
) -> None:
    ns, agent, operator = installed.namespace, _agent_user(installed), _operator_user(installed)
    intel, nrt_group = "intel.com", "topology.node.k8s.io"
    expectations = [
        # the agent: its node's RmdNodeState in the release namespace, NodeResourceTopology, read Nodes
        (agent, "create", "rmdnodestates", ns, intel, True),
        (agent, "patch", "rmdnodestates/status", ns, intel, True),
        (agent, "get", "nodes", "", "", True),
        (agent, "update", "noderesourcetopologies", "", nrt_group, True),
        (agent, "list", "rmdnodestates", ns, intel, False),
        (agent, "update", "leases", ns, "coordination.k8s.io", True),  # its heartbeat
        (agent, "create", "leases", "default", "coordination.k8s.io", False),
        (agent, "delete", "leases", ns, "coordination.k8s.io", False),
        (agent, "list", "leases", ns, "coordination.k8s.io", False),
        (agent, "delete", "rmdnodestates", ns, intel, False),
        (agent, "create", "rmdnodestates", "default", intel, False),
        (agent, "delete", "rmdworkloads", ns, intel, False),
        (agent, "get", "rmdworkloads", ns, intel, False),
        (agent, "get", "secrets", ns, "", False),
        (agent, "list", "pods", "", "", False),
        (agent, "patch", "nodes", "", "", False),
        (agent, "delete", "noderesourcetopologies", "", nrt_group, False),
        (
            agent,
            "create",
            "certificatesigningrequests",
            "",
            "certificates.k8s.io",
            True,
        ),  # its own certificate
        (agent, "patch", "certificatesigningrequests/approval", "", "certificates.k8s.io", False),
        (agent, "patch", "certificatesigningrequests/status", "", "certificates.k8s.io", False),
        (agent, "update", "certificatesigningrequests", "", "certificates.k8s.io", False),
        (agent, "patch", "certificatesigningrequests", "", "certificates.k8s.io", False),
        (agent, "delete", "certificatesigningrequests", "", "certificates.k8s.io", False),
        (agent, "list", "certificatesigningrequests", "", "certificates.k8s.io", False),
        (agent, "approve", "signers", "", "certificates.k8s.io", False),
        (operator, "watch", "certificatesigningrequests", "", "certificates.k8s.io", True),
        (operator, "patch", "certificatesigningrequests/approval", "", "certificates.k8s.io", True),
        (operator, "create", "certificatesigningrequests", "", "certificates.k8s.io", False),
        # the operator: RmdWorkloads everywhere (no watchNamespaces), agents' states read-only
        (operator, "watch", "rmdworkloads", "", intel, True),
        (operator, "patch", "rmdworkloads/status", "team-a", intel, True),
        (operator, "create", "rmdworkloads", "team-a", intel, True),
        (operator, "list", "rmdnodestates", ns, intel, True),
        (operator, "watch", "pods", "", "", True),
        (operator, "delete", "pods", "team-a", "", True),
        (operator, "create", "events", "team-a", "", True),
        (operator, "list", "nodes", "", "", True),
        (operator, "patch", "rmdnodestates", ns, intel, False),
        (operator, "patch", "rmdnodestates/status", ns, intel, True),  # Ready=False on an expired heartbeat
        (operator, "watch", "leases", ns, "coordination.k8s.io", True),
        (operator, "update", "leases", ns, "coordination.k8s.io", False),
        (operator, "patch", "nodes", "", "", False),
        (operator, "get", "secrets", ns, "", False),
        (operator, "create", "pods", "team-a", "", False),
        (operator, "create", "noderesourcetopologies", "", nrt_group, False),
        # NodeConfigTemplates: their NodeConfigs and their status, nothing else of wao-core's API
        (operator, "watch", "nodeconfigtemplates", "", "wao.bitmedia.co.jp", True),
        (operator, "patch", "nodeconfigtemplates/status", "wao-system", "wao.bitmedia.co.jp", True),
        (operator, "patch", "nodeconfigtemplates", "wao-system", "wao.bitmedia.co.jp", False),
        (operator, "create", "nodeconfigs", "wao-system", "wao.bitmedia.co.jp", True),
        (operator, "delete", "nodeconfigs", "wao-system", "wao.bitmedia.co.jp", True),
        (operator, "update", "nodeconfigs", "wao-system", "wao.bitmedia.co.jp", False),
        (agent, "list", "nodeconfigs", "", "wao.bitmedia.co.jp", False),
    ]
    wrong = [
        (user.rsplit(":", 1)[1], verb, resource, namespace or "(cluster)", expected)
        for user, verb, resource, namespace, group, expected in expectations
        if _allowed(control_plane, user, verb, resource, namespace=namespace, group=group) is not expected
    ]
    assert wrong == []


def test_rbac_refuses_the_agent_for_real(control_plane: ControlPlane, installed: Installed) -> None:
    """The same as a real request (the reviews above could disagree with the authorizer in use)."""
    with _as(control_plane, _agent_user(installed), _nodes(installed)[0]) as api:
        message = _forbidden(
            lambda: client.CustomObjectsApi(api).delete_collection_namespaced_custom_object(
                "intel.com", "v1alpha1", installed.namespace, "rmdworkloads"
            )
        )
        assert "cannot deletecollection resource" in message
        message = _forbidden(lambda: client.CoreV1Api(api).list_namespaced_secret(installed.namespace))
        assert 'cannot list resource "secrets"' in message


# -- helm install / upgrade: the CA and the certificates are kept ---------------------------------------


def _secret_data(cp: ControlPlane, namespace: str, name: str) -> dict[str, str]:
    with cp.api_client() as api:
        data = client.CoreV1Api(api).read_namespaced_secret(name, namespace).data or {}
    return {key: str(value) for key, value in data.items()}


def _agent_pod_annotations(cp: ControlPlane, namespace: str, name: str) -> dict[str, str]:
    stored = json.loads(cp.kubectl("get", "daemonset", name, "-n", namespace, "-o", "json").stdout)
    annotations: dict[str, str] = stored["spec"]["template"]["metadata"]["annotations"]
    return annotations


def _pem(data: dict[str, str], key: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(data[key]))


def test_install_and_upgrade_keep_the_ca_and_reissue_on_request(
    control_plane: ControlPlane, helm: Helm, namespace: str
) -> None:
    kubeconfig = control_plane.kubeconfig
    release = "inst"
    # The shared agent certificate (tls.agentCertificates: shared) is the one the chart issues and keeps.
    # wao-core's CRDs exist already (the control plane applied crds/): left out, as next to wao-core.
    shared = ("--set", "tls.agentCertificates=shared", "--set", "nodeTelemetry.installCRDs=false")
    helm.run("install", release, str(CHART), "--namespace", namespace, *shared, kubeconfig=kubeconfig)
    try:
        ca = _secret_data(control_plane, namespace, "inst-rmd-ca")
        agent_tls = _secret_data(control_plane, namespace, "inst-rmd-agent-tls")
        operator_tls = _secret_data(control_plane, namespace, "inst-rmd-operator-tls")
        ca_cert = _pem(ca, "tls.crt")
        for leaf in (agent_tls, operator_tls):
            _pem(leaf, "tls.crt").verify_directly_issued_by(ca_cert)
            assert leaf["ca.crt"] == ca["tls.crt"]

        # An upgrade that changes something else keeps every key and certificate.
        helm.run(
            "upgrade",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--reuse-values",
            "--set",
            "agent.settings.log_level=debug",
            kubeconfig=kubeconfig,
        )
        assert _secret_data(control_plane, namespace, "inst-rmd-ca") == ca
        assert _secret_data(control_plane, namespace, "inst-rmd-agent-tls") == agent_tls
        assert _secret_data(control_plane, namespace, "inst-rmd-operator-tls") == operator_tls
        stored_values = json.loads(
            helm.run(
                "get", "values", release, "--namespace", namespace, "-o", "json", kubeconfig=kubeconfig
            ).stdout
        )
        # nothing of the TLS cache
        assert stored_values == {
            "agent": {"settings": {"log_level": "debug"}},
            "tls": {"agentCertificates": "shared"},
            "nodeTelemetry": {"installCRDs": False},
        }

        # tls.reissue: new leaf certificates from the same CA; the agents roll (their checksum changes).
        before = _agent_pod_annotations(control_plane, namespace, "inst-rmd-agent")
        helm.run(
            "upgrade",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--reuse-values",
            "--set",
            "tls.reissue=2",
            kubeconfig=kubeconfig,
        )
        after = _agent_pod_annotations(control_plane, namespace, "inst-rmd-agent")
        assert _secret_data(control_plane, namespace, "inst-rmd-ca") == ca
        new_agent = _secret_data(control_plane, namespace, "inst-rmd-agent-tls")
        new_operator = _secret_data(control_plane, namespace, "inst-rmd-operator-tls")
        assert (
            new_agent["tls.key"] != agent_tls["tls.key"]
            and new_operator["tls.key"] != operator_tls["tls.key"]
        )
        _pem(new_agent, "tls.crt").verify_directly_issued_by(ca_cert)
        _pem(new_operator, "tls.crt").verify_directly_issued_by(ca_cert)
        assert before["checksum/tls"] != after["checksum/tls"]
        assert before["checksum/config"] == after["checksum/config"]
    finally:
        helm.run("uninstall", release, "--namespace", namespace, kubeconfig=kubeconfig, check=False)


# -- wao-core's CRDs (nodeTelemetry.installCRDs) ----------------------------------------------------------


def test_wao_crds_are_rendered_from_crds_unchanged(helm: Helm) -> None:
    """Byte-identical copies of crds/ (tools/sync_chart_crds.py) read as data: their "{{.Hostname}}" texts
    reach the API server as written. Kept on uninstall: deleting a CRD deletes every NodeConfig."""
    docs = helm.template("rel", "rmd")
    for name in WAO_CRDS:
        rendered = find(docs, "CustomResourceDefinition", name)
        source = yaml.safe_load((repo_root() / "crds" / f"{name}.yaml").read_text())
        assert rendered["spec"] == source["spec"]
        assert rendered["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert source["metadata"]["labels"].items() <= rendered["metadata"]["labels"].items()
    assert "{{.Hostname}}" in json.dumps(find(docs, "CustomResourceDefinition", WAO_CRDS[1]))
    off = helm.template("rel", "rmd", "--set", "nodeTelemetry.installCRDs=false")
    assert "CustomResourceDefinition" not in kinds(off)


_HELM_CRD_ANNOTATIONS = (
    "meta.helm.sh/release-name",
    "meta.helm.sh/release-namespace",
    "helm.sh/resource-policy",
)
_HELM_CRD_LABELS = (
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/name",
    "app.kubernetes.io/version",
    "helm.sh/chart",
)


def _crd_metadata(cp: ControlPlane, name: str) -> Obj:
    metadata: Obj = json.loads(cp.kubectl("get", "crd", name, "-o", "json").stdout)["metadata"]
    return metadata


def test_install_where_wao_cores_crds_exist(control_plane: ControlPlane, helm: Helm, namespace: str) -> None:
    """The control plane applied crds/, as a cluster running wao-core has its CRDs. The default install then
    stops with helm's ownership message (docs/troubleshooting.md); `nodeTelemetry.installCRDs=false` installs
    next to them; `--take-ownership` adopts them instead (Helm upgrades them from then on), and an uninstall
    keeps them and their objects."""
    kubeconfig = control_plane.kubeconfig
    base = (str(CHART), "--namespace", namespace, "--set", "tls.agentCertificates=shared")
    refused = helm.run("install", "wao", *base, kubeconfig=kubeconfig, check=False)
    assert refused.returncode != 0
    assert "exists and cannot be imported into the current release" in refused.stderr, refused.stderr
    assert "nodeconfig" in refused.stderr, refused.stderr

    helm.run("install", "wao", *base, "--set", "nodeTelemetry.installCRDs=false", kubeconfig=kubeconfig)
    helm.run("uninstall", "wao", "--namespace", namespace, kubeconfig=kubeconfig)

    try:
        helm.run("install", "wao", *base, "--take-ownership", kubeconfig=kubeconfig)
        for name in WAO_CRDS:
            metadata = _crd_metadata(control_plane, name)
            assert metadata["annotations"]["meta.helm.sh/release-name"] == "wao"
            assert metadata["annotations"]["helm.sh/resource-policy"] == "keep"
        helm.run("uninstall", "wao", "--namespace", namespace, kubeconfig=kubeconfig)
        for name in WAO_CRDS:
            assert _crd_metadata(control_plane, name)["name"] == name  # still there
    finally:
        helm.run("uninstall", "wao", "--namespace", namespace, kubeconfig=kubeconfig, check=False)
        for name in WAO_CRDS:  # back to the control plane's own, for the tests that follow
            control_plane.kubectl(
                "annotate", "crd", name, *(f"{a}-" for a in _HELM_CRD_ANNOTATIONS), check=False
            )
            control_plane.kubectl(
                "label", "crd", name, *(f"{label}-" for label in _HELM_CRD_LABELS), check=False
            )
