"""The NUMA-aware scheduler's objects (rmd_operator.scheduler_objects) and the chart's RBAC for them.

* `helm template`: charts/rmd/templates/scheduler-rbac.yaml renders only with agent.deployedBy=rmdconfig, and
  the operator may bind exactly the three ClusterRoles and manage exactly the bindings the function names;
* the rendered objects are created, then replaced, by the operator's ServiceAccount (impersonated) with only
  the chart's RBAC: the API server's escalation checks pass, so the chart grants enough;
* the rendered KubeSchedulerConfiguration is accepted by the real kube-scheduler's validation where its
  plugins allow: the in-tree kube-scheduler lacks scheduler-plugins' NodeResourceTopologyMatch, so the test
  removes that plugin and its args and keeps everything else (profile, leader election). It runs as the
  rendered ServiceAccount (a token from the TokenRequest API, so its RBAC is the one exercised), takes its
  leader Lease (a second replica waits, and takes over when the first stops), and binds a pod naming its
  schedulerName to a Node object;
* the same binary refuses configurations the function must never produce (a duplicate profile, and the
  plugin it does not have), so the check above can fail.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from helm_cli import Helm, require_binary
from rmd_operator.scheduler_objects import (
    BUILTIN_ROLES,
    cluster_binding_names,
    numa_cluster_role,
    scheduler_objects,
)
from rmd_operator.validate.scheduler import NRT_PLUGIN
from rmd_sim.control_plane import ControlPlane, ManagedProcess
from rmd_sim.control_plane_components import http_get

Obj = dict[str, Any]
T = TypeVar("T")

RELEASE = "rel"
RMDCONFIG = ("--set", "agent.deployedBy=rmdconfig")


# -- binaries ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[Obj]]:
    """`helm template` of release RELEASE: (namespace, *args) -> its objects."""
    return functools.partial(Helm.found(tmp_path_factory.mktemp("helm-home")).template, RELEASE)


@pytest.fixture(scope="module")
def kube_scheduler() -> Path:
    return require_binary("kube-scheduler")


def _cluster(namespace: str) -> str:
    return f"{RELEASE}-rmd-{namespace}"  # the chart's rmd.clusterName for release "rel"


def _find(docs: Sequence[Obj], kind: str, name: str) -> Obj:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


def _scheduler_rbac(docs: Sequence[Obj]) -> list[Obj]:
    """What charts/rmd/templates/scheduler-rbac.yaml rendered (its objects are named ...-scheduler)."""
    return [
        d
        for d in docs
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
        and d["metadata"]["name"].endswith("-scheduler")
    ]


# -- the chart --------------------------------------------------------------------------------------------


def test_scheduler_rbac_renders_only_when_the_rmdconfig_deploys(helm: Callable[..., list[Obj]]) -> None:
    assert _scheduler_rbac(helm("rmd")) == []
    assert _scheduler_rbac(helm("rmd", "--set", "agent.deployedBy=chart")) == []
    docs = _scheduler_rbac(helm("rmd", *RMDCONFIG))
    cluster = _cluster("rmd")
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ClusterRole", numa_cluster_role(cluster)),
        ("ClusterRole", f"{cluster}-operator-scheduler"),
        ("ClusterRoleBinding", f"{cluster}-operator-scheduler"),
        ("Role", "rel-rmd-operator-scheduler"),
        ("RoleBinding", "rel-rmd-operator-scheduler"),
    ]
    for rule in (r for d in docs for r in d.get("rules", ())):
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule


def test_the_operator_binds_exactly_the_schedulers_roles(helm: Callable[..., list[Obj]]) -> None:
    docs = helm("rmd", *RMDCONFIG)
    cluster = _cluster("rmd")
    # The scheduler's own addition to the built-in roles: NodeResourceTopology read, nothing else.
    assert _find(docs, "ClusterRole", numa_cluster_role(cluster))["rules"] == [
        {
            "apiGroups": ["topology.node.k8s.io"],
            "resources": ["noderesourcetopologies"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    rules = _find(docs, "ClusterRole", f"{cluster}-operator-scheduler")["rules"]
    binds = [r for r in rules if "bind" in r["verbs"]]
    assert binds == [
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "resourceNames": [*BUILTIN_ROLES, numa_cluster_role(cluster)],
            "verbs": ["bind"],
        }
    ]
    # Exactly the roles and bindings scheduler_objects makes.
    names = cluster_binding_names(cluster)
    assert set(binds[0]["resourceNames"]) == set(names)
    by_name = [r for r in rules if r.get("resourceNames") and "clusterrolebindings" in r["resources"]]
    assert [set(r["resourceNames"]) for r in by_name] == [set(names.values())]
    assert [
        r["verbs"] for r in rules if "clusterrolebindings" in r["resources"] and not r.get("resourceNames")
    ] == [["create"]]
    operator = {"kind": "ServiceAccount", "name": "rel-rmd-operator", "namespace": "rmd"}
    for kind, name in (
        ("ClusterRoleBinding", f"{cluster}-operator-scheduler"),
        ("RoleBinding", "rel-rmd-operator-scheduler"),
    ):
        binding = _find(docs, kind, name)
        assert binding["subjects"] == [operator]
        assert binding["roleRef"]["name"] == name
    role = _find(docs, "Role", "rel-rmd-operator-scheduler")
    assert role["metadata"]["namespace"] == "rmd"  # the scheduler's namespaced objects: the release's only
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    manage = {"create", "get", "update", "patch", "delete"}  # patch: server-side apply
    objects = [
        ("apps", "deployments"),
        ("", "configmaps"),
        ("", "serviceaccounts"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
    ]
    # ... and what the scheduler's Role grants, which RBAC requires the operator to hold (no escalate).
    lease = {("coordination.k8s.io", "leases", v) for v in ("create", "get", "update")}
    assert granted == {(g, r, v) for g, r in objects for v in manage} | lease


# -- the objects, created by the operator's identity and run by the real kube-scheduler --------------------


def _wait(what: str, probe: Callable[[], T | None], timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ApiException):
            found = probe()
            if found:
                return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}", pytrace=False)
        time.sleep(0.2)


def _write_yaml(path: Path, docs: Sequence[Obj]) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def _kubectl_as(cp: ControlPlane, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cp.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=cp.env(),
        check=False,
    )


def _token_kubeconfig(cp: ControlPlane, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig with a TokenRequest token of the ServiceAccount: what its pod would authenticate with."""
    token = cp.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(cp.kubeconfig.read_text())
    admin["users"] = [{"name": account, "user": {"token": token}}]
    admin["contexts"][0]["context"]["user"] = account
    path.write_text(yaml.safe_dump(admin))
    return path


def _without_plugin(config: Obj, plugin: str) -> Obj:
    """The configuration without `plugin` at any extension point or in pluginConfig."""
    for profile in config["profiles"]:
        for point in profile.get("plugins", {}).values():
            point["enabled"] = [p for p in point.get("enabled", []) if p["name"] != plugin]
        profile["pluginConfig"] = [c for c in profile.get("pluginConfig", []) if c["name"] != plugin]
    return config


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _running(
    binary: Path, container: Obj, config: Path, kubeconfig: Path, log: Path
) -> Iterator[tuple[ManagedProcess, int]]:
    """kube-scheduler with the Deployment container's arguments, its --config pointing at `config`."""
    port = _free_port()
    args = [a for a in container["args"] if not a.startswith("--config=")]
    assert container["command"] == ["/bin/kube-scheduler"] and len(args) == len(container["args"]) - 1
    local = [
        f"--config={config}",
        "--bind-address=127.0.0.1",  # a pod listens on its own address; here on loopback, any free port
        f"--secure-port={port}",
        # A pod authenticates its port's clients with its in-cluster credentials, as here.
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
    ]
    proc = ManagedProcess("kube-scheduler", [str(binary), *args, *local], log)
    proc.start()
    try:
        yield proc, port
    finally:
        proc.stop()


def _healthz(proc: ManagedProcess, port: int) -> bool:
    proc.raise_if_exited()
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # self-signed, as the probe sees it
    return http_get(port, "/healthz", context)[0] == 200


def _node(name: str, label: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "rmd.test/scheduler": label}},
    }


def _ready_status(api: client.CoreV1Api, name: str) -> None:
    """Ready, with room for a pod, and without the not-ready taint the API server gave it on creation."""
    api.patch_node(name, {"spec": {"taints": None}})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
        "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"},
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "e2e",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ],
    }
    api.patch_node_status(name, {"status": status})


def _pod(scheduler_name: str, node_label: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "numa-pod"},
        "spec": {
            "schedulerName": scheduler_name,
            "nodeSelector": {"rmd.test/scheduler": node_label},
            "containers": [
                {"name": "c", "image": "example.invalid/pause", "resources": {"requests": {"cpu": "1"}}}
            ],
        },
    }


def _exists(read: Callable[..., object], *args: str) -> bool:
    try:
        read(*args)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _delete(delete: Callable[..., object], *args: str) -> None:
    try:
        delete(*args)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _create_as_operator(cp: ControlPlane, ns: str, objects: Sequence[Obj], tmp_path: Path) -> None:
    """The operator's identity with the chart's RBAC only: creating the RoleBinding and ClusterRoleBindings
    passes RBAC's escalation checks (`bind`, or holding what the Role grants); replacing works by name."""
    operator = cp.impersonating_kubeconfig(f"system:serviceaccount:{ns}:rel-rmd-operator")
    rendered = _write_yaml(tmp_path / "objects.yaml", objects)
    for verb in ("create", "replace"):
        result = _kubectl_as(cp, operator, verb, "--validate=strict", "-f", str(rendered))
        assert result.returncode == 0, result.stderr
    # ... and nothing beyond: binding another role is refused.
    denied = _kubectl_as(
        cp, operator, "create", "clusterrolebinding", f"{ns}-admin", "--clusterrole=cluster-admin", "--user=x"
    )
    assert denied.returncode != 0 and "forbidden" in denied.stderr, denied.stderr


def test_the_real_kube_scheduler_runs_the_rendered_scheduler(
    control_plane: ControlPlane,
    namespace: str,
    helm: Callable[..., list[Obj]],
    kube_scheduler: Path,
    tmp_path: Path,
) -> None:
    """The rendered configuration is accepted by the real kube-scheduler's validation where its plugins allow
    (NodeResourceTopologyMatch removed: the in-tree kube-scheduler does not have it), and the scheduler runs
    as the rendered ServiceAccount: it starts, takes its Lease and binds a pod naming its schedulerName."""
    cp, ns, cluster = control_plane, namespace, _cluster(namespace)
    chart = helm(ns, *RMDCONFIG)
    rbac = _scheduler_rbac(chart)
    owner_name, name, node = f"e2e-owner-{ns}", f"numa-{ns}", f"e2e-{ns}"
    with cp.api_client() as api:
        core, rbac_api = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        try:
            # The chart's part, as helm installs it, and a stand-in owner, cluster-scoped as the RmdConfig.
            chart_part = [_find(chart, "ServiceAccount", "rel-rmd-operator"), *rbac]
            cp.kubectl("create", "-f", str(_write_yaml(tmp_path / "chart.yaml", chart_part)))
            owner = rbac_api.create_cluster_role({"metadata": {"name": owner_name}, "rules": []})
            owner_ref = {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "name": owner_name,
                "uid": owner.metadata.uid,
            }
            image = "registry.k8s.io/scheduler-plugins/kube-scheduler:v0.34.7"
            spec = {"enabled": True, "image": image, "schedulerName": name, "replicas": 2}
            objects = scheduler_objects(spec, ns, "with-exclusive-resources", owner_ref, cluster=cluster)
            _create_as_operator(cp, ns, objects, tmp_path)

            configmap = next(o for o in objects if o["kind"] == "ConfigMap")
            deployment = next(o for o in objects if o["kind"] == "Deployment")
            kubeconfig = _token_kubeconfig(cp, ns, name, tmp_path / "scheduler.kubeconfig")
            config = _without_plugin(yaml.safe_load(configmap["data"]["config.yaml"]), NRT_PLUGIN)
            config["clientConnection"] = {"kubeconfig": str(kubeconfig)}  # in a pod: its in-cluster token
            config_path = tmp_path / "config.yaml"
            config_path.write_text(yaml.safe_dump(config))
            container = deployment["spec"]["template"]["spec"]["containers"][0]
            logs = [tmp_path / "kube-scheduler-1.log", tmp_path / "kube-scheduler-2.log"]
            coordination = client.CoordinationV1Api(api)

            def holder() -> str:
                return str(coordination.read_namespaced_lease(name, ns).spec.holder_identity or "")

            # Two replicas: the first takes the Lease, the second waits and takes over when the first stops.
            with contextlib.ExitStack() as stack:
                first, first_port = stack.enter_context(
                    _running(kube_scheduler, container, config_path, kubeconfig, logs[0])
                )
                _wait("the first replica's /healthz", lambda: _healthz(first, first_port))
                leader = _wait("its leader Lease", holder)
                second, second_port = stack.enter_context(
                    _running(kube_scheduler, container, config_path, kubeconfig, logs[1])
                )
                _wait("the second replica's /healthz", lambda: _healthz(second, second_port))
                assert holder() == leader
                first.stop()
                _wait("the standby taking the Lease", lambda: holder() not in ("", leader))
                core.create_node(_node(node, ns))
                _ready_status(core, node)
                core.create_namespaced_pod(ns, _pod(name, ns))
                bound = _wait(
                    "the pod bound", lambda: core.read_namespaced_pod("numa-pod", ns).spec.node_name
                )
                assert bound == node
                second.raise_if_exited()
            # Everything they did, their RBAC allowed.
            for log in logs:
                assert "forbidden" not in log.read_text().lower(), log.read_text()[-3000:]

            # Owned by the owner: deleting it removes them (kube-controller-manager's garbage collector).
            rbac_api.delete_cluster_role(owner_name)
            bindings = cluster_binding_names(cluster).values()
            _wait(
                "garbage collection of the scheduler's objects",
                lambda: (
                    not any(_exists(rbac_api.read_cluster_role_binding, b) for b in bindings)
                    and not _exists(core.read_namespaced_config_map, f"{name}-config", ns)
                ),
            )
        finally:
            for doc in rbac:
                if doc["kind"] == "ClusterRole":
                    _delete(rbac_api.delete_cluster_role, doc["metadata"]["name"])
                elif doc["kind"] == "ClusterRoleBinding":
                    _delete(rbac_api.delete_cluster_role_binding, doc["metadata"]["name"])
            for binding in cluster_binding_names(cluster).values():
                _delete(rbac_api.delete_cluster_role_binding, binding)
            _delete(rbac_api.delete_cluster_role, owner_name)
            _delete(core.delete_node, node)


# -- what the real kube-scheduler refuses ------------------------------------------------------------------


def _refusal(binary: Path, config: Obj, tmp_path: Path) -> str:
    """Run kube-scheduler with `config`; it must exit non-zero: its output."""
    kubeconfig = tmp_path / "unreachable.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    path = _write_yaml(tmp_path / f"config-{uuid.uuid4().hex[:8]}.yaml", [config])
    result = subprocess.run(
        [
            str(binary),
            f"--config={path}",
            "--bind-address=127.0.0.1",
            f"--secure-port={_free_port()}",
            "--authentication-skip-lookup=true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0, result.stderr[-2000:]
    return result.stderr


def _rendered_config(fingerprint_method: str = "all") -> Obj:
    owner = {"apiVersion": "intel.com/v1alpha1", "kind": "RmdConfig", "name": "rmdconfig", "uid": "u"}
    objects = scheduler_objects(
        {"enabled": True, "image": "img:1"}, "rmd", fingerprint_method, owner, cluster="rel-rmd-rmd"
    )
    config: Obj = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["config.yaml"])
    return config


def test_the_real_kube_scheduler_refuses_a_duplicate_profile(kube_scheduler: Path, tmp_path: Path) -> None:
    config = _without_plugin(_rendered_config(), NRT_PLUGIN)
    config["profiles"] = config["profiles"] * 2
    assert "profiles[1].schedulerName: Duplicate value" in _refusal(kube_scheduler, config, tmp_path)


def test_the_in_tree_kube_scheduler_lacks_the_plugin(kube_scheduler: Path, tmp_path: Path) -> None:
    """Why the test above removes it: the scheduler-plugins image is the one that registers it."""
    refusal = _refusal(kube_scheduler, _rendered_config(), tmp_path)
    assert f'FilterPlugin "{NRT_PLUGIN}" does not exist' in refusal.replace('\\"', '"')
