"""RmdConfig end to end: the real API server (with kube-controller-manager's garbage collector), the chart
rendered by the real helm with agent.deployedBy=rmdconfig, and the real operator process reading its
<fullname>-agent-manifests ConfigMap, under its own ServiceAccount with the chart's RBAC and nothing more.

The seed's RmdConfig manifest (rmd-operator's) applies unchanged; the operator creates the agents' DaemonSet,
Service, ServiceAccount and role bindings owned by it; a change updates the DaemonSet's template; a
ServiceMonitor asked for before prometheus-operator's CRD exists is reported (condition and Event) and
created once the test installs a minimal stand-in of that CRD; the dashboard ConfigMap carries the Grafana
sidecar's label; deleting the RmdConfig lets the garbage collector remove everything. No workload controllers
run here, so no agent pod starts (tests/realnode/test_rmdconfig.py runs one).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helm_cli import Helm
from kube_clients import KubeClients
from operator_process import Operator
from rmd_api.names import RMD_CONFIG
from rmd_operator.scheduler_objects import CACHE_RESYNC_SECONDS, cluster_binding_names
from rmd_operator.validate.scheduler import NRT_PLUGIN
from rmd_sim.control_plane import ControlPlane
from rmdconfig_seed import NFD, SEED

pytestmark = pytest.mark.e2e

RELEASE = "rmd"
GROUP, VERSION, PLURAL = RMD_CONFIG.group, RMD_CONFIG.version, RMD_CONFIG.plural
WAIT = 30.0
GC_WAIT = 120.0  # the garbage collector finds the resources of a CRD made after it started on its next pass
Obj = dict[str, Any]

# prometheus-operator's ServiceMonitor CRD reduced to what the API server needs to serve the kind.
SERVICE_MONITOR_CRD: Obj = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"plural": "servicemonitors", "singular": "servicemonitor", "kind": "ServiceMonitor"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


def _helm_template(tmp: Path, namespace: str, *values: str) -> list[Obj]:
    """The chart as helm renders it, by default with agent.deployedBy=rmdconfig."""
    return Helm.found(tmp).template(
        RELEASE,
        namespace,
        *("--set", "agent.deployedBy=rmdconfig", "--set", "nodeTelemetry.installCRDs=false"),
        *values,
    )


@dataclass
class Env(KubeClients):
    cp: ControlPlane
    api: Any
    namespace: str
    operator: Operator
    tmp: Path

    def rmdconfig(self) -> Obj | None:
        with contextlib.suppress(ApiException):
            found: Obj = self.objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, "rmdconfig")
            return found
        return None

    def condition(self, kind: str) -> tuple[str, str, str] | None:
        for c in ((self.rmdconfig() or {}).get("status") or {}).get("conditions") or ():
            if c["type"] == kind:
                return c["status"], c["reason"], c["message"]
        return None

    def get(self, *args: str) -> Obj | None:
        """kubectl get ... -o json, None if absent."""
        result = self.cp.kubectl("get", *args, "-o", "json", check=False)
        found: Obj | None = json.loads(result.stdout) if result.returncode == 0 else None
        return found

    def wait(self, predicate: Any, what: Any, timeout: float = WAIT) -> Any:
        return self.operator.wait_for(predicate, what, timeout, 0.2)

    def events(self) -> list[tuple[str, str, str]]:
        found = self.core.list_namespaced_event("default", field_selector="involvedObject.name=rmdconfig")
        return [
            (e.type, e.reason, e.message or "") for e in found.items if e.involved_object.kind == "RmdConfig"
        ]

    def apply_manifest(self, text: str, name: str) -> None:
        path = self.tmp / name
        path.write_text(text)
        self.cp.kubectl("apply", "-f", str(path))


RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


def _operator_kubeconfig(cp: ControlPlane, api: Any, namespace: str, path: Path) -> Path:
    """The control plane's kubeconfig with the operator's ServiceAccount token in place of the admin's
    certificate: the operator runs with exactly the chart's RBAC."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        f"{RELEASE}-operator", namespace, request
    )
    config = yaml.safe_load(cp.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token.status.token}
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.fixture
def env(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Env]:
    """The chart's rendering with agent.deployedBy=rmdconfig: its RBAC and the manifests ConfigMap applied,
    and the operator running under its own ServiceAccount, so every grant it needs is the chart's."""
    docs = _helm_template(tmp_path, namespace, "--set", f"operator.watchNamespaces={{{namespace}}}")
    (manifests,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-agent-manifests")
    ]
    assert not [d for d in docs if d["kind"] == "DaemonSet"], (
        "the chart must leave the DaemonSet to the operator"
    )
    applied = [d for d in docs if d["kind"] in RBAC_KINDS] + [manifests]
    rendered = tmp_path / "rbac.yaml"
    rendered.write_text(yaml.safe_dump_all(applied))
    result = control_plane.kubectl("apply", "--server-side", "-f", str(rendered), check=False)
    assert result.returncode == 0, result.stderr
    operator = None
    with control_plane.api_client() as api:
        operator = Operator(
            control_plane,
            namespace,
            tmp_path / "operator.log",
            [
                "--agent-manifests-configmap",
                manifests["metadata"]["name"],
                "--rmdconfig-resync-seconds",
                "5",
                "--cluster-name",
                f"{RELEASE}-{namespace}",
            ],
            kubeconfig=_operator_kubeconfig(control_plane, api, namespace, tmp_path / "operator.kubeconfig"),
        )
        try:
            operator.wait_alive()
            yield Env(control_plane, api, namespace, operator, tmp_path)
        finally:
            operator.stop()
            objects = client.CustomObjectsApi(api)
            with contextlib.suppress(ApiException):
                objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "rmdconfig")
            with contextlib.suppress(ApiException):
                client.ApiextensionsV1Api(api).delete_custom_resource_definition(
                    SERVICE_MONITOR_CRD["metadata"]["name"]
                )
            cluster_scoped = [
                d
                for d in applied
                if d["kind"].startswith("Cluster") or d["metadata"].get("namespace") == "default"
            ]
            rendered.write_text(yaml.safe_dump_all(cluster_scoped))
            control_plane.kubectl("delete", "--ignore-not-found", "-f", str(rendered), check=False)
            with contextlib.suppress(ApiException):
                client.RbacAuthorizationV1Api(api).delete_cluster_role_binding(f"{RELEASE}-{namespace}-agent")


def allowed(env: Env, verb: str, group: str, resource: str, name: str, *, namespace: str = "") -> bool:
    """RBAC's answer for the operator's ServiceAccount (a SubjectAccessReview)."""
    ns = env.namespace
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{ns}:{RELEASE}-operator",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, group=group, resource=resource, name=name or None, namespace=namespace or None
            ),
        )
    )
    result = client.AuthorizationV1Api(env.api).create_subject_access_review(review)
    return bool(result.status.allowed)


def test_the_operator_may_bind_and_write_only_the_agents_objects(env: Env) -> None:
    ns, rbac = env.namespace, "rbac.authorization.k8s.io"
    assert allowed(env, "bind", rbac, "clusterroles", f"{RELEASE}-{ns}-agent")
    assert not allowed(env, "bind", rbac, "clusterroles", "cluster-admin")
    assert allowed(env, "bind", rbac, "roles", f"{RELEASE}-agent", namespace=ns)
    assert not allowed(env, "bind", rbac, "roles", "admin", namespace=ns)
    assert not allowed(env, "escalate", rbac, "clusterroles", f"{RELEASE}-{ns}-agent")
    assert allowed(env, "patch", "apps", "daemonsets", f"{RELEASE}-agent", namespace=ns)
    assert not allowed(env, "patch", "apps", "daemonsets", "kube-proxy", namespace=ns)
    assert not allowed(env, "create", "apps", "daemonsets", "", namespace="default")
    # (ConfigMaps, ServiceAccounts, Roles and RoleBindings of the release namespace are open to the
    # scheduler's rights, templates/scheduler-rbac.yaml; Services are the agents' only.)
    assert not allowed(env, "delete", "", "services", f"{RELEASE}-operator", namespace=ns)
    assert not allowed(env, "patch", rbac, "clusterrolebindings", "cluster-admin")


# A DaemonSet's status with no node to run on (the fields its API requires).
NO_AGENTS = dict.fromkeys(
    ("desiredNumberScheduled", "currentNumberScheduled", "numberMisscheduled", "numberReady"), 0
)


def owned_by(obj: Obj | None, uid: str) -> bool:
    refs = (obj or {}).get("metadata", {}).get("ownerReferences") or []
    return any(r["uid"] == uid and r["kind"] == "RmdConfig" and r.get("controller") for r in refs)


def test_the_seed_rmdconfig_deploys_the_agents_and_its_deletion_removes_them(env: Env) -> None:
    ns = env.namespace
    env.apply_manifest(SEED, "rmdconfig.yaml")  # the seed's manifest, unchanged
    config = env.rmdconfig()
    assert config is not None
    uid = config["metadata"]["uid"]
    made = {
        "daemonset": ("daemonset", "rmd-agent", "-n", ns),
        "service": ("service", "rmd-agent", "-n", ns),
        "serviceaccount": ("serviceaccount", "rmd-agent", "-n", ns),
        "rolebinding": ("rolebinding", "rmd-agent", "-n", ns),
        "clusterrolebinding": ("clusterrolebinding", f"rmd-{ns}-agent"),
        "dashboard": ("configmap", "rmd-dashboard", "-n", ns),
    }
    for what, args in made.items():
        env.wait(lambda args=args: owned_by(env.get(*args), uid), f"{what} owned by the RmdConfig")
    ds = env.get(*made["daemonset"])
    assert ds is not None
    pod = ds["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "rmd:latest"  # rmdImage is used (rmd-operator ignored it)
    assert pod["nodeSelector"] == {NFD: "true"}
    assert pod["serviceAccountName"] == "rmd-agent"
    dashboard = env.get(*made["dashboard"])
    assert dashboard is not None and dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "rmd.json" in dashboard["data"]
    binding = env.get(*made["clusterrolebinding"])
    assert binding is not None and binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rmd-agent", "namespace": ns}
    ]
    # Before the DaemonSet controller has counted the nodes, 0 desired says nothing.
    env.wait(lambda: (env.condition("Ready") or ("",))[:2] == ("False", "AgentsNotReady"), "not counted yet")
    # No workload controllers run here: write what the DaemonSet controller would, no node carrying the NFD
    # label. The status says so.
    client.AppsV1Api(env.api).patch_namespaced_daemon_set_status(
        "rmd-agent", ns, {"status": {"observedGeneration": ds["metadata"]["generation"], **NO_AGENTS}}
    )
    env.wait(lambda: (env.condition("Ready") or ("",))[:2] == ("False", "NoMatchingNodes"), "Ready=False")
    status = (env.rmdconfig() or {})["status"]
    assert status["observedGeneration"] == config["metadata"]["generation"]
    assert env.condition("Degraded")[:2] == ("False", "AsExpected")  # type: ignore[index]

    # A change updates the DaemonSet's template (its updateStrategy rolls the pods); bad settings reported.
    env.objects.patch_cluster_custom_object(
        GROUP,
        VERSION,
        PLURAL,
        "rmdconfig",
        {"spec": {"rmdImage": "rmd:v2", "agentSettings": {"log_level": "debug", "log_levle": "debug"}}},
    )

    def template_updated() -> bool:
        ds = env.get(*made["daemonset"])
        container = (ds or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0]
        env_vars = {e["name"]: e.get("value") for e in container.get("env", [])}
        return container.get("image") == "rmd:v2" and env_vars.get("RMD_LOG_LEVEL") == "debug"

    env.wait(template_updated, "the DaemonSet's template updated")
    env.wait(lambda: (env.condition("Degraded") or ("",))[:2] == ("True", "AgentSettingsIgnored"), "Degraded")
    assert "log_levle (unknown setting)" in env.condition("Degraded")[2]  # type: ignore[index]
    env.wait(lambda: any(e[:2] == ("Warning", "AgentSettingsIgnored") for e in env.events()), "the Event")

    # A ServiceMonitor before prometheus-operator's CRD exists: condition and Event; then made once it does.
    env.objects.patch_cluster_custom_object(
        GROUP,
        VERSION,
        PLURAL,
        "rmdconfig",
        {"spec": {"serviceMonitor": {"enabled": True, "interval": "15s"}}},
    )
    env.wait(
        lambda: (env.condition("ServiceMonitorReady") or ("",))[:2] == ("False", "CRDMissing"), "CRDMissing"
    )
    env.wait(lambda: any(e[:2] == ("Warning", "CRDMissing") for e in env.events()), "the CRDMissing Event")
    client.ApiextensionsV1Api(env.api).create_custom_resource_definition(SERVICE_MONITOR_CRD)
    monitor_args = ("servicemonitors.monitoring.coreos.com", "rmd-agent", "-n", ns)
    env.wait(lambda: owned_by(env.get(*monitor_args), uid), "the ServiceMonitor", timeout=60)
    monitor = env.get(*monitor_args)
    assert monitor is not None and monitor["spec"]["endpoints"][0]["interval"] == "15s"
    env.wait(lambda: (env.condition("ServiceMonitorReady") or ("",))[:2] == ("True", "Created"), "Created")

    # Deleting the RmdConfig: the garbage collector removes all it made.
    env.objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "rmdconfig")
    for what, args in {**made, "servicemonitor": monitor_args}.items():
        env.wait(lambda args=args: env.get(*args) is None, f"{what} removed", timeout=GC_WAIT)


def test_the_numa_aware_scheduler_is_deployed_matched_to_the_agents_and_removed_when_disabled(
    env: Env,
) -> None:
    """spec.scheduler (docs/scheduler.md) through the real operator under the chart's RBAC: the Deployment,
    its configuration with the cache resync method the agents' fingerprint method needs, its ServiceAccount
    and bindings, all owned by the RmdConfig; `enabled: false` removes them."""
    ns, image = env.namespace, "registry.k8s.io/scheduler-plugins/kube-scheduler:v0.33.5"
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RmdConfig",
        "metadata": {"name": "rmdconfig"},
        "spec": {"scheduler": {"enabled": True, "image": image}},
    }
    uid = env.objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)["metadata"]["uid"]
    made = {
        "deployment": ("deployment", "rmd-numa-scheduler", "-n", ns),
        "configuration": ("configmap", "rmd-numa-scheduler-config", "-n", ns),
        "serviceaccount": ("serviceaccount", "rmd-numa-scheduler", "-n", ns),
        **{
            f"binding to {role}": ("clusterrolebinding", name)
            for role, name in cluster_binding_names(f"{RELEASE}-{ns}").items()
        },
    }
    for what, args in made.items():
        env.wait(
            lambda args=args: owned_by(env.get(*args), uid), f"the scheduler's {what} owned by the RmdConfig"
        )
    deployment = env.get(*made["deployment"])
    assert (
        deployment is not None and deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image
    )

    def resync() -> tuple[str, int]:
        config = yaml.safe_load(next(iter((env.get(*made["configuration"]) or {})["data"].values())))
        (args,) = [c["args"] for c in config["profiles"][0]["pluginConfig"] if c["name"] == NRT_PLUGIN]
        return args["cache"]["resyncMethod"], args["cacheResyncPeriodSeconds"]

    # The chart's agents fingerprint with-exclusive-resources.
    assert resync() == ("OnlyExclusiveResources", CACHE_RESYNC_SECONDS)
    assert env.condition("Degraded")[:2] == ("False", "AsExpected")  # type: ignore[index]

    # Agents told to fingerprint every pod: the scheduler's cache follows.
    patch = {"spec": {"agentSettings": {"nrt_pods_fingerprint_method": "all"}}}
    env.objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, "rmdconfig", patch)
    env.wait(lambda: resync()[0] == "All", "the scheduler's resync method All")

    env.objects.patch_cluster_custom_object(
        GROUP, VERSION, PLURAL, "rmdconfig", {"spec": {"scheduler": {"enabled": False}}}
    )
    for what, args in made.items():
        env.wait(lambda args=args: env.get(*args) is None, f"the scheduler's {what} removed")
    assert env.get("daemonset", "rmd-agent", "-n", ns) is not None  # the agents stay


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"metadata": {"name": "other"}, "spec": {}}, "metadata.name must be rmdconfig"),
        (
            {"metadata": {"name": "rmdconfig"}, "spec": {"scheduler": {"replicas": 6}}},
            "less than or equal to 5",
        ),
        (
            {"metadata": {"name": "rmdconfig"}, "spec": {"scheduler": {"replicas": 0}}},
            "greater than or equal to 1",
        ),
        ({"metadata": {"name": "rmdconfig"}, "spec": {"imagePullPolicy": "Sometimes"}}, "supported values"),
    ],
)
def test_bad_rmdconfigs_are_refused_by_the_api_server(
    control_plane: ControlPlane, body: Obj, message: str
) -> None:
    with control_plane.api_client() as api:
        objects = client.CustomObjectsApi(api)
        with pytest.raises(ApiException) as refused:
            objects.create_cluster_custom_object(
                GROUP, VERSION, PLURAL, {"apiVersion": RMD_CONFIG.api_version, "kind": "RmdConfig", **body}
            )
    assert refused.value.status == 422
    assert message in json.loads(refused.value.body)["message"]


def test_the_defaults_the_api_server_fills_in(control_plane: ControlPlane) -> None:
    with control_plane.api_client() as api:
        objects = client.CustomObjectsApi(api)
        body = {"apiVersion": RMD_CONFIG.api_version, "kind": "RmdConfig", "metadata": {"name": "rmdconfig"}}
        created = objects.create_cluster_custom_object(
            GROUP, VERSION, PLURAL, {**body, "spec": {"scheduler": {}, "serviceMonitor": {}, "dashboard": {}}}
        )
        try:
            spec = created["spec"]
            assert spec["scheduler"] == {
                "enabled": False,
                "schedulerName": "rmd-numa-scheduler",
                "replicas": 1,
            }
            assert spec["serviceMonitor"] == {"enabled": False} and spec["dashboard"] == {"enabled": True}
        finally:
            objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "rmdconfig")


def _without_tls_checksum(obj: Obj) -> Obj:
    # Each helm run issues new certificates (nothing to look up): only their checksum differs.
    obj = json.loads(json.dumps(obj))
    annotations = obj.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations", {})
    annotations.pop("checksum/tls", None)
    return obj


def test_the_operators_base_is_the_charts_own_rendering(tmp_path: Path) -> None:
    """One source of truth: what the chart deploys itself (agent.deployedBy chart) is, object for object, what
    it hands the operator in the manifests ConfigMap (agent.deployedBy rmdconfig)."""
    by_chart = {
        (d["kind"], d["metadata"]["name"]): d
        for d in _helm_template(
            tmp_path, "rmd", "--set", "agent.deployedBy=chart", "--set", "serviceMonitor.enabled=true"
        )
    }
    docs = _helm_template(tmp_path, "rmd")
    (manifests,) = [d for d in docs if d["metadata"]["name"] == "rmd-agent-manifests"]
    handed = [yaml.safe_load(text) for text in manifests["data"].values()]
    assert sorted(o["kind"] for o in handed) == [
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]
    for obj in handed:
        key = (obj["kind"], obj["metadata"]["name"])
        assert key not in {(d["kind"], d["metadata"]["name"]) for d in docs}, (
            f"{key} also created by the chart"
        )
        assert _without_tls_checksum(obj) == _without_tls_checksum(by_chart[key]), key
    # The operator may bind only the agents' two roles, by name (and the scheduler's, scheduler-rbac.yaml).
    binds = [
        (d["kind"], rule.get("resourceNames"))
        for d in docs
        if d["kind"] in ("Role", "ClusterRole") and not d["metadata"]["name"].endswith("-operator-scheduler")
        for rule in d.get("rules", [])
        if "bind" in rule["verbs"]
    ]
    assert sorted(binds) == [("ClusterRole", ["rmd-rmd-agent"]), ("Role", ["rmd-agent"])]
