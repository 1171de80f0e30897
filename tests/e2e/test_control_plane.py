"""The test control plane itself: version, controllers that envtest lacks, kubectl, RBAC, failure handling."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_sim.control_plane import ControlPlane, ControlPlaneError

EXPECTED_VERSION = "v1.36.3"
GC_TIMEOUT = 60.0


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def is_gone(read: Callable[[], object]) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def config_map(name: str, owner: client.V1ConfigMap | None = None) -> client.V1ConfigMap:
    refs = None
    if owner is not None:
        meta = owner.metadata
        assert meta is not None and meta.name and meta.uid
        refs = [client.V1OwnerReference(api_version="v1", kind="ConfigMap", name=meta.name, uid=meta.uid)]
    return client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name, owner_references=refs), data={"k": name}
    )


def test_version_is_the_pinned_release(control_plane: ControlPlane) -> None:
    with control_plane.api_client() as api:
        info = client.VersionApi(api).get_code()
    assert info.git_version == EXPECTED_VERSION
    assert (info.major, info.minor) == ("1", "36")


def test_garbage_collector_deletes_dependents_of_a_deleted_owner(
    control_plane: ControlPlane, namespace: str
) -> None:
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        owner = core.create_namespaced_config_map(namespace, config_map("owner"))
        core.create_namespaced_config_map(namespace, config_map("child", owner=owner))
        core.create_namespaced_config_map(namespace, config_map("bystander"))

        core.delete_namespaced_config_map("owner", namespace)

        wait_for(
            lambda: is_gone(lambda: core.read_namespaced_config_map("child", namespace)),
            GC_TIMEOUT,
            "the garbage collector to delete the child",
        )
        # Only the dependent goes, not everything in the namespace.
        assert core.read_namespaced_config_map("bystander", namespace).data == {"k": "bystander"}


def test_namespace_deletion_completes(control_plane: ControlPlane) -> None:
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        ns = core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(generate_name="e2e-del-")))
        assert ns.metadata is not None and ns.metadata.name
        name = ns.metadata.name
        # Content forces the namespace controller to empty the namespace before removing its finalizer.
        core.create_namespaced_config_map(name, config_map("content"))

        core.delete_namespace(name)

        wait_for(lambda: is_gone(lambda: core.read_namespace(name)), GC_TIMEOUT, f"namespace {name} to go")


def test_bundled_kubectl_lists_namespaces(control_plane: ControlPlane, namespace: str) -> None:
    env = {k: v for k, v in control_plane.env().items() if k != "KUBECONFIG"}  # the flag alone must suffice
    kubectl = [str(control_plane.bin_dir / "kubectl"), "--kubeconfig", str(control_plane.kubeconfig)]
    result = subprocess.run(
        [*kubectl, "get", "namespaces", "-o", "name"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    names = result.stdout.split()
    assert f"namespace/{namespace}" in names
    assert "namespace/kube-system" in names


def test_rbac_denies_an_unbound_user_until_a_role_is_bound(
    control_plane: ControlPlane, namespace: str
) -> None:
    user = "e2e-unprivileged"
    with control_plane.api_client(control_plane.kubeconfig_for(user)) as user_api:
        as_user = client.CoreV1Api(user_api)
        with pytest.raises(ApiException) as denied:
            as_user.list_namespaced_secret(namespace)
        # 403, not 401: the certificate authenticated the user, RBAC refused the request.
        assert denied.value.status == 403

        with control_plane.api_client() as admin_api:
            rbac = client.RbacAuthorizationV1Api(admin_api)
            rbac.create_namespaced_role(
                namespace,
                client.V1Role(
                    metadata=client.V1ObjectMeta(name="read-secrets"),
                    rules=[client.V1PolicyRule(api_groups=[""], resources=["secrets"], verbs=["list"])],
                ),
            )
            rbac.create_namespaced_role_binding(
                namespace,
                client.V1RoleBinding(
                    metadata=client.V1ObjectMeta(name="read-secrets"),
                    role_ref=client.V1RoleRef(
                        api_group="rbac.authorization.k8s.io", kind="Role", name="read-secrets"
                    ),
                    subjects=[
                        client.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")
                    ],
                ),
            )

        def allowed() -> bool:
            try:
                as_user.list_namespaced_secret(namespace)
            except ApiException as exc:
                if exc.status == 403:
                    return False  # the authorizer's informer has not seen the binding yet
                raise
            return True

        wait_for(allowed, 10, "the RoleBinding to take effect")
        with pytest.raises(ApiException) as elsewhere:
            as_user.list_namespaced_secret("kube-system")
        assert elsewhere.value.status == 403


def widget_crd(group: str) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {"size": {"type": "integer", "minimum": 1}}},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
            ],
        },
    }


def test_apply_crds_returns_once_the_resource_is_served(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    group = "e2e.rmd.test"
    crd_file = tmp_path / "widgets.yaml"
    crd_file.write_text(yaml.safe_dump(widget_crd(group)))

    assert control_plane.apply_crds([crd_file]) == [f"widgets.{group}"]
    assert control_plane.apply_crds([crd_file]) == [f"widgets.{group}"]  # applying again is a no-op

    with control_plane.api_client() as api:
        custom = client.CustomObjectsApi(api)
        widget = {
            "apiVersion": f"{group}/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"size": 3},
        }
        created = custom.create_namespaced_custom_object(group, "v1", namespace, "widgets", widget)
        assert isinstance(created, dict) and created["spec"] == {"size": 3}
        with pytest.raises(ApiException) as invalid:
            bad = {**widget, "metadata": {"name": "bad"}, "spec": {"size": 0}}
            custom.create_namespaced_custom_object(group, "v1", namespace, "widgets", bad)
        assert invalid.value.status == 422  # the CRD's schema is enforced by the API server


def test_apply_crds_reports_a_crd_the_api_server_rejects(control_plane: ControlPlane, tmp_path: Path) -> None:
    crd = widget_crd("rejected.rmd.test")
    crd["spec"]["scope"] = "Galactic"
    crd_file = tmp_path / "rejected.yaml"
    crd_file.write_text(yaml.safe_dump(crd))
    with pytest.raises(ControlPlaneError, match=r"widgets\.rejected\.rmd\.test failed: 422"):
        control_plane.apply_crds([crd_file])


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                pids.append(int(proc.name))
    return pids


def test_a_component_failing_at_start_raises_with_its_log_and_leaves_no_process(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    # Reuses the session's binaries; the bogus controller name makes kube-controller-manager exit at once.
    broken = ControlPlane(control_plane.bin_dir, tmp_path / "broken", controllers=["no-such-controller"])
    with pytest.raises(ControlPlaneError) as failure:
        broken.start()
    message = str(failure.value)
    assert "kube-controller-manager exited" in message
    assert "no-such-controller" in message  # from the component's own log
    assert _processes_mentioning(str(tmp_path / "broken")) == []
    assert not broken.running
