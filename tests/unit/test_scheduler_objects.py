"""rmd_operator.scheduler_objects: the NUMA-aware scheduler's objects for an RmdConfig's spec.scheduler.

The configuration per fingerprint method, owner references and labels on every object, the names, RBAC that
grants no wildcard and limits the Lease by name, the Deployment's hardening, and errors a user can act on.
Running the result against the real kube-scheduler is tests/e2e/test_scheduler_config.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from rmd_agent.settings import AgentSettings
from rmd_operator.errors import SpecError
from rmd_operator.scheduler_objects import (
    CACHE_RESYNC_SECONDS,
    cluster_binding_names,
    numa_cluster_role,
    scheduler_objects,
)
from rmd_operator.validate import scheduler as validate_scheduler

Obj = dict[str, Any]

NS = "rmd-system"
CLUSTER = "rel-rmd-rmd-system"
OWNER = {
    "apiVersion": "intel.com/v1alpha1",
    "kind": "RmdConfig",
    "name": "rmdconfig",
    "uid": "6b1f3c1e-0000-4000-8000-000000000001",
    "controller": True,
    "blockOwnerDeletion": True,
}
IMAGE = "registry.k8s.io/scheduler-plugins/kube-scheduler:v0.34.7"
SPEC: Obj = {"enabled": True, "image": IMAGE}


def render(spec: Obj | None = None, method: str = "with-exclusive-resources") -> list[Obj]:
    return scheduler_objects(SPEC if spec is None else spec, NS, method, OWNER, cluster=CLUSTER)


def one(objects: list[Obj], kind: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def config_of(objects: list[Obj]) -> Obj:
    data = one(objects, "ConfigMap")["data"]
    assert list(data) == ["config.yaml"]
    config: Obj = yaml.safe_load(data["config.yaml"])
    return config


@pytest.mark.parametrize(
    ("method", "resync"), [("with-exclusive-resources", "OnlyExclusiveResources"), ("all", "All")]
)
def test_the_cache_resyncs_with_the_method_matching_the_agents_fingerprints(method: str, resync: str) -> None:
    config = config_of(render(method=method))
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "rmd-numa-scheduler"
    plugin = [{"name": "NodeResourceTopologyMatch"}]
    assert profile["plugins"] == {
        "filter": {"enabled": plugin},
        "score": {"enabled": plugin},
        "reserve": {"enabled": plugin},  # the over-reserve cache is fed by the reserve point
    }
    assert profile["pluginConfig"] == [
        {
            "name": "NodeResourceTopologyMatch",
            "args": {
                "cacheResyncPeriodSeconds": 2,
                "cache": {"foreignPodsDetect": "OnlyExclusiveResources", "resyncMethod": resync},
            },
        }
    ]


def test_the_agents_default_requeue_echo_follows_the_deployed_schedulers_resync() -> None:
    """The echo must reach the scheduler after the resync that accepts the change, with room for the resync
    itself (docs/topology.md); measured with the real scheduler in bench/nrt_requeue.py."""
    echo = AgentSettings().nrt_requeue_seconds
    assert CACHE_RESYNC_SECONDS + 0.5 <= echo <= CACHE_RESYNC_SECONDS + 1.5


# NodeResourceTopologyMatchArgs as scheduler-plugins defines it (apis/config/v1/types.go, 903da7df): the
# in-tree kube-scheduler of the e2e test cannot check these, so a misspelt field or value is caught here.
ARGS_FIELDS = {
    "scoringStrategy",
    "cacheResyncPeriodSeconds",
    "discardReservedNodes",
    "cache",
    "preemptionMode",
}
CACHE_VALUES = {
    "foreignPodsDetect": {"None", "All", "OnlyExclusiveResources"},
    "resyncMethod": {"Autodetect", "All", "OnlyExclusiveResources"},
    "informerMode": {"Shared", "Dedicated"},
    "resyncScope": {"All", "OnlyResources"},
}


@pytest.mark.parametrize("method", ["with-exclusive-resources", "all"])
def test_the_plugin_args_are_scheduler_plugins_own_spelling(method: str) -> None:
    (profile,) = config_of(render(method=method))["profiles"]
    (entry,) = profile["pluginConfig"]
    args = entry["args"]
    assert set(args) <= ARGS_FIELDS
    assert isinstance(args["cacheResyncPeriodSeconds"], int) and args["cacheResyncPeriodSeconds"] > 0
    for key, value in args["cache"].items():
        assert value in CACHE_VALUES[key], (key, value)


@pytest.mark.parametrize("method", ["with-exclusive-resources", "all"])
def test_rmdctl_validate_finds_the_scheduler_consistent_with_the_agents(method: str) -> None:
    objects = render(method=method)
    (profile,), problems = validate_scheduler.profiles_in(one(objects, "ConfigMap"))
    assert problems == []
    assert profile.numa_aware and profile.scheduler_name == "rmd-numa-scheduler"
    assert profile.resync_seconds == CACHE_RESYNC_SECONDS
    assert validate_scheduler.RESYNC_NEEDS[profile.resync_method] == method
    assert validate_scheduler.deployment_of(profile, [one(objects, "Deployment")]) is not None


def test_leader_election_on_a_lease_named_after_the_scheduler() -> None:
    config = config_of(render({**SPEC, "schedulerName": "numa"}))
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceName": "numa",
        "resourceNamespace": NS,
    }


def test_names_follow_the_scheduler_name_and_the_cluster() -> None:
    objects = render({**SPEC, "schedulerName": "numa"})
    assert [(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects] == [
        ("ConfigMap", "numa-config", NS),
        ("ServiceAccount", "numa", NS),
        ("Role", "numa", NS),
        ("RoleBinding", "numa", NS),
        ("Deployment", "numa", NS),
        ("ClusterRoleBinding", f"{CLUSTER}-numa-scheduler", None),
        ("ClusterRoleBinding", f"{CLUSTER}-numa-scheduler-kube-scheduler", None),
        ("ClusterRoleBinding", f"{CLUSTER}-numa-scheduler-volume-scheduler", None),
    ]
    assert numa_cluster_role(CLUSTER) == f"{CLUSTER}-numa-scheduler"


def test_every_object_is_owned_by_the_rmdconfig_and_labelled() -> None:
    for obj in render():
        assert obj["metadata"]["ownerReferences"] == [OWNER], obj["kind"]
        assert obj["metadata"]["labels"] == {
            "app.kubernetes.io/part-of": "rmd-k8s",
            "app.kubernetes.io/component": "numa-scheduler",
            "app.kubernetes.io/instance": "rmd-numa-scheduler",
        }


def test_owner_reference_defaults_to_the_controller() -> None:
    owner = {k: OWNER[k] for k in ("apiVersion", "kind", "name", "uid")}
    (ref,) = scheduler_objects(SPEC, NS, "all", owner, cluster=CLUSTER)[0]["metadata"]["ownerReferences"]
    assert ref["controller"] is True and ref["blockOwnerDeletion"] is True


def test_disabled_makes_nothing() -> None:
    assert render({"enabled": False, "image": IMAGE}) == []
    assert render({}) == []


def test_rbac_is_the_built_in_roles_plus_the_charts_and_the_lease_by_name() -> None:
    objects = render({**SPEC, "schedulerName": "numa"})
    subject = [{"kind": "ServiceAccount", "name": "numa", "namespace": NS}]
    bindings = {
        o["roleRef"]["name"]: o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRoleBinding"
    }
    assert bindings == cluster_binding_names(CLUSTER)
    assert set(bindings) == {"system:kube-scheduler", "system:volume-scheduler", f"{CLUSTER}-numa-scheduler"}
    for obj in objects:
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert obj["subjects"] == subject
    assert one(objects, "RoleBinding")["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "numa",
    }
    rules = one(objects, "Role")["rules"]
    assert rules == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["numa"],
            "verbs": ["get", "update"],
        },
    ]
    assert not any("*" in r[field] for r in rules for field in ("apiGroups", "resources", "verbs"))
    assert not any(o["kind"] == "ClusterRole" for o in objects)  # no cluster-wide grant of its own


def test_the_deployment_runs_the_configuration_unprivileged() -> None:
    objects = render({**SPEC, "replicas": 3, "resources": {"limits": {"memory": "512Mi"}}})
    deployment = one(objects, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 3
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == "rmd-numa-scheduler"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["volumes"] == [{"name": "config", "configMap": {"name": "rmd-numa-scheduler-config"}}]
    assert not any(key.startswith("host") for key in pod)  # no host network, PID or IPC
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    assert "--config=/etc/rmd-numa-scheduler/config.yaml" in container["args"]
    assert container["volumeMounts"] == [
        {"name": "config", "mountPath": "/etc/rmd-numa-scheduler", "readOnly": True}
    ]
    assert container["resources"] == {"limits": {"memory": "512Mi"}}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": 10259, "scheme": "HTTPS"}


def test_a_new_configuration_rolls_the_pods() -> None:
    def config_hash(method: str) -> str:
        template = one(render(method=method), "Deployment")["spec"]["template"]
        return str(template["metadata"]["annotations"]["rmd.intel.com/scheduler-config-hash"])

    assert config_hash("all") != config_hash("with-exclusive-resources")
    assert config_hash("all") == config_hash("all")


def test_default_resources_when_none_given() -> None:
    container = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}}


def test_objects_share_no_mutable_parts() -> None:
    """The controller may edit one object (e.g. add its own labels) without changing another."""
    objects = render()
    first, deployment = objects[0], one(objects, "Deployment")
    first["metadata"]["labels"]["x"] = "y"
    first["metadata"]["ownerReferences"][0]["name"] = "x"
    assert all("x" not in o["metadata"]["labels"] for o in objects[1:])
    assert all(o["metadata"]["ownerReferences"] == [OWNER] for o in objects[1:])
    spec = deployment["spec"]
    spec["selector"]["matchLabels"]["x"] = "y"
    spec["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"] = 1
    assert "x" not in spec["template"]["metadata"]["labels"]
    term = spec["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert "x" not in term[0]["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert spec["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] == 10259
    assert OWNER["name"] == "rmdconfig"


@pytest.mark.parametrize(
    ("spec", "method", "complaint"),
    [
        (SPEC, "pods-with-cpus", "nrt_pods_fingerprint_method 'pods-with-cpus'"),
        ({"enabled": True}, "all", "spec.scheduler.image"),
        ({**SPEC, "image": "a b"}, "all", "spec.scheduler.image"),
        ({**SPEC, "schedulerName": "Numa_Scheduler"}, "all", "spec.scheduler.schedulerName"),
        ({**SPEC, "schedulerName": "x" * 64}, "all", "at most 63"),
        ({**SPEC, "schedulerName": "default-scheduler"}, "all", "cluster's own scheduler"),
        ({**SPEC, "replicas": 0}, "all", "spec.scheduler.replicas"),
        ({**SPEC, "replicas": 6}, "all", "from 1 to 5"),
        ({**SPEC, "replicas": True}, "all", "spec.scheduler.replicas"),
        ({**SPEC, "resources": {"requests": "1"}}, "all", "spec.scheduler.resources"),
        ({**SPEC, "resources": {"request": {"cpu": "1"}}}, "all", "unknown key(s) request"),
    ],
)
def test_a_bad_spec_is_a_spec_error_saying_what_to_do(spec: Obj, method: str, complaint: str) -> None:
    with pytest.raises(SpecError) as caught:
        scheduler_objects(spec, NS, method, OWNER, cluster=CLUSTER)
    assert complaint in str(caught.value)


def test_an_unknown_fingerprint_method_names_the_known_ones() -> None:
    with pytest.raises(SpecError) as caught:
        render(method="pods-with-cpus")
    assert "all, with-exclusive-resources" in str(caught.value)


def test_a_spec_that_is_not_an_object_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="must be an object"):
        scheduler_objects(["enabled"], NS, "all", OWNER, cluster=CLUSTER)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("namespace", "owner", "cluster"),
    [("", OWNER, CLUSTER), (NS, {"kind": "RmdConfig", "name": "rmdconfig"}, CLUSTER), (NS, OWNER, "")],
)
def test_caller_mistakes_are_value_errors(namespace: str, owner: Obj, cluster: str) -> None:
    with pytest.raises(ValueError) as caught:
        scheduler_objects(SPEC, namespace, "all", owner, cluster=cluster)
    assert type(caught.value) is ValueError  # the caller's bug, not a SpecError for the user
