"""The RmdConfig controller without a cluster: the planner (the seed's manifest and every override on the
chart's base), the status and Events, one pass of the loop against a fake API, and the agent setting names the
operator knows against rmd-agent's and the chart's. The real thing runs in tests/e2e/test_rmdconfig.py.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client

from rmd_agent.settings import AgentSettings
from rmd_api.agent_settings import CHART_ONLY, OVERRIDABLE
from rmd_operator.node_config_api import WriteError
from rmd_operator.rmdconfig_api import RmdConfigApi
from rmd_operator.rmdconfig_plan import (
    DAEMONSET_KEY,
    ObjectRef,
    Plan,
    PlanError,
    parse_base,
    plan,
    ref_entry,
)
from rmd_operator.rmdconfig_status import Observed, desired_status, events, settled
from rmd_operator.rmdconfig_sync import RmdConfigSync
from rmd_operator.status import EventText
from rmdconfig_seed import NFD, SEED

REPO = Path(__file__).resolve().parents[2]
NS = "rmd"
Obj = dict[str, Any]

LABELS = {"app.kubernetes.io/name": "rmd", "app.kubernetes.io/managed-by": "Helm"}
SELECTOR = {"app.kubernetes.io/name": "rmd", "app.kubernetes.io/component": "agent"}


def _meta(name: str, namespace: str | None = NS) -> Obj:
    meta: Obj = {"name": name, "labels": dict(LABELS)}
    if namespace:
        meta["namespace"] = namespace
    return meta


# What the chart renders into <fullname>-agent-manifests, cut down to what the planner touches.
BASE_OBJECTS: dict[str, Obj] = {
    "daemonset.yaml": {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta("rmd-agent"),
        "spec": {
            "selector": {"matchLabels": SELECTOR},
            "template": {
                "metadata": {"labels": SELECTOR},
                "spec": {
                    "nodeSelector": {NFD: "true"},
                    "containers": [
                        {
                            "name": "agent",
                            "image": "rmd-k8s/rmd-agent:0.1.0",
                            "imagePullPolicy": "IfNotPresent",
                            "env": [
                                {"name": "NODE_NAME", "value": "x"},
                                {"name": "RMD_LOG_LEVEL", "value": "info"},
                            ],
                            "resources": {"requests": {"cpu": "50m"}},
                        }
                    ],
                },
            },
        },
    },
    "service.yaml": {"apiVersion": "v1", "kind": "Service", "metadata": _meta("rmd-agent"), "spec": {}},
    "serviceaccount.yaml": {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta("rmd-agent")},
    "rolebinding.yaml": {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta("rmd-agent"),
    },
    "clusterrolebinding.yaml": {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": _meta("rmd-rmd-agent", None),
    },
    "servicemonitor.yaml": {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta("rmd-agent"),
        "spec": {"endpoints": [{"port": "http-metrics", "interval": "30s"}]},
    },
    "dashboard.yaml": {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**_meta("rmd-dashboard"), "labels": {**LABELS, "grafana_dashboard": "1"}},
        "data": {"rmd.json": "{}"},
    },
}
BASE_DATA = {key: yaml.safe_dump(obj) for key, obj in BASE_OBJECTS.items()}


def config(spec: Obj | None = None, generation: int = 1, status: Obj | None = None) -> Obj:
    body: Obj = yaml.safe_load(SEED)
    body["metadata"].update(uid="uid-1", generation=generation)
    if spec is not None:
        body["spec"] = spec
    if status is not None:
        body["status"] = status
    return body


def by_kind(p: Plan) -> dict[str, Obj]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in p.apply}


def agent_container(ds: Obj) -> Obj:
    container: Obj = ds["spec"]["template"]["spec"]["containers"][0]
    return container


# --- the planner ----------------------------------------------------------------------------------------


def test_the_seed_manifest_deploys_rmd_image_on_the_selected_nodes_owned_by_the_rmdconfig() -> None:
    p = plan(config(), parse_base(BASE_DATA), service_monitor_crd=False)
    assert agent_container(p.daemonset)["image"] == "rmd:latest"
    assert p.daemonset["spec"]["template"]["spec"]["nodeSelector"] == {NFD: "true"}
    assert sorted(by_kind(p)) == [
        "ClusterRoleBinding/rmd-rmd-agent",
        "ConfigMap/rmd-dashboard",  # the dashboard by default
        "DaemonSet/rmd-agent",
        "RoleBinding/rmd-agent",
        "Service/rmd-agent",
        "ServiceAccount/rmd-agent",
    ]
    for obj in p.apply:
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "intel.com/v1alpha1",
            "kind": "RmdConfig",
            "name": "rmdconfig",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rmd-operator"
    assert by_kind(p)["ConfigMap/rmd-dashboard"]["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert p.ignored_settings == {} and p.service_monitor == "NotRequested" and p.remove == []
    assert BASE_OBJECTS["daemonset.yaml"]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_an_empty_spec_keeps_the_charts_pod() -> None:
    p = plan(config({}), parse_base(BASE_DATA), service_monitor_crd=False)
    base_ds = copy.deepcopy(BASE_OBJECTS[DAEMONSET_KEY])
    assert p.daemonset["spec"] == base_ds["spec"]


def test_overrides_reach_the_daemonset() -> None:
    tolerations = [{"key": "rdt", "operator": "Exists", "effect": "NoSchedule"}]
    resources = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
    spec = {
        "rmdImage": "registry.example/rmd-agent:1.2",
        "imagePullPolicy": "Always",
        "rmdNodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": tolerations,
        "resources": resources,
        "agentSettings": {
            "log_level": "debug",
            "nrt_resync_seconds": 30,
            "insecure": False,
            "nrt_exclude": ["a", "b"],
        },
    }
    p = plan(config(spec), parse_base(BASE_DATA), service_monitor_crd=False)
    pod = p.daemonset["spec"]["template"]["spec"]
    agent = agent_container(p.daemonset)
    assert agent["image"] == "registry.example/rmd-agent:1.2" and agent["imagePullPolicy"] == "Always"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == tolerations and agent["resources"] == resources
    env = {e["name"]: e["value"] for e in agent["env"]}
    assert env == {
        "NODE_NAME": "x",
        "RMD_LOG_LEVEL": "debug",  # replaces the chart's, not a second variable of the same name
        "RMD_NRT_RESYNC_SECONDS": "30",
        "RMD_INSECURE": "false",
        "RMD_NRT_EXCLUDE": "a,b",
    }
    assert [e["name"] for e in agent["env"]].count("RMD_LOG_LEVEL") == 1
    assert p.ignored_settings == {}


def test_unknown_and_chart_only_agent_settings_are_left_out_and_reported() -> None:
    spec = {
        "agentSettings": {
            "log_levle": "debug",
            "power_enabled": False,
            "node_name": "n1",
            "log_level": {"x": 1},
        }
    }
    p = plan(config(spec), parse_base(BASE_DATA), service_monitor_crd=False)
    assert set(p.ignored_settings) == {"log_levle", "power_enabled", "node_name", "log_level"}
    assert p.ignored_settings["log_levle"] == "unknown setting"
    assert p.ignored_settings["node_name"] == "unknown setting"  # the pod's own: never overridable
    assert "chart" in p.ignored_settings["power_enabled"]
    env = {e["name"] for e in agent_container(p.daemonset)["env"]}
    assert env == {"NODE_NAME", "RMD_LOG_LEVEL"}  # nothing added
    status = desired_status(p, Observed(1, None), "2026-01-01T00:00:00Z")
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "AgentSettingsIgnored")
    assert "log_levle (unknown setting)" in degraded["message"]
    assert status["settingsIgnored"] == ["log_level", "log_levle", "node_name", "power_enabled"]
    (event,) = events({}, status)
    assert (event.type, event.reason) == ("Warning", "AgentSettingsIgnored")


def test_the_service_monitor_only_when_its_crd_exists() -> None:
    spec = {"serviceMonitor": {"enabled": True, "interval": "15s"}}
    with_crd = plan(config(spec), parse_base(BASE_DATA), service_monitor_crd=True)
    monitor = by_kind(with_crd)["ServiceMonitor/rmd-agent"]
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
    assert with_crd.service_monitor == "Planned"
    without = plan(config(spec), parse_base(BASE_DATA), service_monitor_crd=False)
    assert "ServiceMonitor/rmd-agent" not in by_kind(without) and without.service_monitor == "CRDMissing"
    assert without.remove == []
    off = plan(
        config({"serviceMonitor": {"enabled": False}}), parse_base(BASE_DATA), service_monitor_crd=True
    )
    assert "ServiceMonitor/rmd-agent" not in by_kind(off)
    assert off.remove == [ObjectRef("monitoring.coreos.com/v1", "ServiceMonitor", NS, "rmd-agent")]


def test_the_dashboard_can_be_turned_off() -> None:
    p = plan(config({"dashboard": {"enabled": False}}), parse_base(BASE_DATA), service_monitor_crd=False)
    assert "ConfigMap/rmd-dashboard" not in by_kind(p)
    assert p.remove == [ObjectRef("v1", "ConfigMap", NS, "rmd-dashboard")]


SCHEDULER = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sched", "namespace": NS}}


def scheduler_extra(spec: Mapping[str, Any], owner: Mapping[str, Any]) -> list[Obj]:
    """Stands in for scheduler_objects: one object while spec.scheduler.enabled, refusing replicas 0."""
    scheduler = spec.get("scheduler") or {}
    if scheduler.get("replicas") == 0:
        raise ValueError("spec.scheduler.replicas: 1 to 5, not 0")
    if not scheduler.get("enabled"):
        return []
    obj = copy.deepcopy(SCHEDULER)
    obj["metadata"]["ownerReferences"] = [{**owner, "name": "given"}]  # its own, kept as given
    return [obj]


def test_extra_objects_get_the_spec_and_the_owner() -> None:
    p = plan(
        config({"scheduler": {"enabled": True}}),
        parse_base(BASE_DATA),
        service_monitor_crd=False,
        extra=scheduler_extra,
    )
    (owner,) = by_kind(p)["Deployment/sched"]["metadata"]["ownerReferences"]
    assert (owner["uid"], owner["kind"], owner["name"]) == ("uid-1", "RmdConfig", "given")
    assert p.spec_error == ""


def test_a_spec_extra_cannot_honour_degrades_but_the_agents_are_deployed() -> None:
    p = plan(
        config({"scheduler": {"enabled": True, "replicas": 0}}),
        parse_base(BASE_DATA),
        service_monitor_crd=False,
        extra=scheduler_extra,
    )
    assert "DaemonSet/rmd-agent" in by_kind(p) and "Deployment/sched" not in by_kind(p)
    status = desired_status(p, Observed(1, ds_with(1, 1, 1)), NOW)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "replicas: 1 to 5" in degraded["message"]


def test_objects_a_later_plan_no_longer_has_are_deleted() -> None:
    api = FakeApi(BASE_DATA)
    sync = RmdConfigSync(
        api, lambda obj, event: None, namespace=NS, configmap="rmd-agent-manifests", resync=60.0,
        extra=scheduler_extra, now=lambda: NOW,
    )  # fmt: skip
    asyncio.run(sync.sync(config({"scheduler": {"enabled": True}})))
    assert {"kind": "Deployment", "apiVersion": "apps/v1", "namespace": NS, "name": "sched"} in api.statuses[
        -1
    ]["managedObjects"]
    assert api.deleted == []
    asyncio.run(sync.sync(config({"scheduler": {"enabled": False}}, generation=2)))
    assert api.deleted == [ObjectRef("apps/v1", "Deployment", NS, "sched")]
    assert all(e["kind"] != "Deployment" for e in api.statuses[-1]["managedObjects"])


def _scheduler_sync(api: FakeApi) -> RmdConfigSync:
    return RmdConfigSync(
        api, lambda obj, event: None, namespace=NS, configmap="rmd-agent-manifests", resync=60.0,
        extra=scheduler_extra, now=lambda: NOW,
    )  # fmt: skip


SCHEDULER_REF = ObjectRef("apps/v1", "Deployment", NS, "sched")


def test_an_object_whose_deletion_failed_is_deleted_by_a_later_pass() -> None:
    api = FakeApi(BASE_DATA)
    sync = _scheduler_sync(api)
    asyncio.run(sync.sync(config({"scheduler": {"enabled": True}})))
    api.refuse_delete = True
    off = config({"scheduler": {"enabled": False}}, generation=2)
    asyncio.run(sync.sync(off))
    status = api.statuses[-1]
    assert conds(status)["Degraded"] == ("True", "ApplyFailed")
    assert "deleting Deployment sched: forbidden" in degraded_message(status)
    api.refuse_delete = False
    asyncio.run(sync.sync(off))
    assert api.deleted == [SCHEDULER_REF]
    assert all(e["kind"] != "Deployment" for e in api.statuses[-1]["managedObjects"])


def test_an_invalid_scheduler_spec_keeps_the_scheduler_made_before() -> None:
    api = FakeApi(BASE_DATA)
    sync = _scheduler_sync(api)
    asyncio.run(sync.sync(config({"scheduler": {"enabled": True}})))
    asyncio.run(sync.sync(config({"scheduler": {"enabled": True, "replicas": 0}}, generation=2)))
    assert api.deleted == []
    assert conds(api.statuses[-1])["Degraded"] == ("True", "InvalidSpec")
    assert ref_entry(SCHEDULER_REF) in api.statuses[-1]["managedObjects"]
    asyncio.run(sync.sync(config({"scheduler": {"enabled": False}}, generation=3)))
    assert api.deleted == [SCHEDULER_REF]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"daemonset.yaml": "a: [b"}, "not YAML"),
        ({"daemonset.yaml": "kind: DaemonSet"}, "not a Kubernetes object"),
        ({"service.yaml": BASE_DATA["service.yaml"]}, "no DaemonSet"),
    ],
)
def test_unusable_manifests_are_refused(data: dict[str, str], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        parse_base(data)


# --- status -----------------------------------------------------------------------------------------------

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def ds_with(desired: int, ready: int, updated: int, generation: int = 2, observed: int = 2) -> Obj:
    ds = copy.deepcopy(BASE_OBJECTS[DAEMONSET_KEY])
    ds["metadata"]["generation"] = generation
    ds["status"] = {
        "observedGeneration": observed,
        "desiredNumberScheduled": desired,
        "numberReady": ready,
        "updatedNumberScheduled": updated,
        "numberAvailable": ready,
    }
    return ds


def pod(node: str, ready: bool, image: str = "rmd:latest") -> Obj:
    return {
        "metadata": {"name": f"rmd-agent-{node}"},
        "spec": {"nodeName": node, "containers": [{"name": "agent", "image": image}]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def node_state(node: str, supported: bool, reason: str = "", detail: str = "") -> Obj:
    cap = {"supported": supported, "reason": reason, "detail": detail}
    return {"spec": {"node": node}, "status": {"capabilities": {"rdtL3Cat": cap}}}


def degraded_message(status: Mapping[str, Any]) -> str:
    return str(next(c["message"] for c in status["conditions"] if c["type"] == "Degraded"))


def conds(status: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_status_of_a_rollout_then_of_ready_agents() -> None:
    p = plan(config(generation=3), parse_base(BASE_DATA), service_monitor_crd=False)
    nodes = {"n1": {NFD: "true"}, "n2": {NFD: "true"}, "n3": {}}
    states = [node_state("n1", True), node_state("n2", False, "ResctrlNotMounted", "no /sys/fs/resctrl")]
    rolling = desired_status(
        p, Observed(3, ds_with(2, 1, 1), [pod("n1", True), pod("n2", False)], nodes, states), NOW
    )
    assert conds(rolling) == {
        "Ready": ("False", "AgentsNotReady"),
        "Progressing": ("True", "RollingOut"),
        "Degraded": ("False", "AsExpected"),
    }
    assert rolling["observedGeneration"] == 3
    assert (rolling["desiredNumberScheduled"], rolling["numberReady"]) == (2, 1)
    assert rolling["nodes"] == [
        {"name": "n1", "pod": "rmd-agent-n1", "ready": True, "image": "rmd:latest"},
        {"name": "n2", "pod": "rmd-agent-n2", "ready": False, "image": "rmd:latest"},
    ]
    assert rolling["unsupportedNodes"] == [
        {"name": "n2", "reason": "ResctrlNotMounted", "message": "no /sys/fs/resctrl"}
    ]
    done = desired_status(
        p,
        Observed(3, ds_with(2, 2, 2), [pod("n1", True), pod("n2", True)], nodes, states, previous=rolling),
        LATER,
    )
    assert conds(done)["Ready"] == ("True", "AgentsReady")
    assert conds(done)["Progressing"] == ("False", "RolledOut")
    times = {c["type"]: c["lastTransitionTime"] for c in done["conditions"]}
    assert times == {"Ready": LATER, "Progressing": LATER, "Degraded": NOW}  # Degraded stayed False


def test_a_template_the_daemonset_controller_has_not_seen_is_still_rolling_out() -> None:
    p = plan(config(), parse_base(BASE_DATA), service_monitor_crd=False)
    status = desired_status(p, Observed(1, ds_with(1, 1, 1, generation=3, observed=2)), NOW)
    assert conds(status)["Progressing"] == ("True", "RollingOut")
    assert conds(status)["Ready"] == ("False", "AgentsNotReady")


def test_no_node_matching_the_selector_is_not_ready() -> None:
    p = plan(config(), parse_base(BASE_DATA), service_monitor_crd=False)
    status = desired_status(p, Observed(1, ds_with(0, 0, 0)), NOW)
    assert conds(status)["Ready"] == ("False", "NoMatchingNodes")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert NFD in ready["message"]


def test_service_monitor_condition_and_events_follow_the_crd() -> None:
    spec = {"serviceMonitor": {"enabled": True}}
    missing = desired_status(
        plan(config(spec), parse_base(BASE_DATA), service_monitor_crd=False),
        Observed(1, ds_with(1, 1, 1)),
        NOW,
    )
    assert conds(missing)["ServiceMonitorReady"] == ("False", "CRDMissing")
    (warning,) = events({}, missing)
    assert (warning.type, warning.reason) == ("Warning", "CRDMissing")
    assert "servicemonitors.monitoring.coreos.com" in warning.message
    assert events(missing, missing) == []  # said once
    made = desired_status(
        plan(config(spec), parse_base(BASE_DATA), service_monitor_crd=True),
        Observed(1, ds_with(1, 1, 1), previous=missing),
        LATER,
    )
    assert conds(made)["ServiceMonitorReady"] == ("True", "Created")
    assert [(e.type, e.reason) for e in events(missing, made)] == [("Normal", "ServiceMonitorCreated")]
    not_asked = desired_status(
        plan(config(), parse_base(BASE_DATA), service_monitor_crd=True), Observed(1, None), NOW
    )
    assert "ServiceMonitorReady" not in conds(not_asked)


def test_failed_writes_degrade_and_unready() -> None:
    p = plan(config(), parse_base(BASE_DATA), service_monitor_crd=False)
    status = desired_status(p, Observed(1, None, failures=["DaemonSet rmd-agent: forbidden"]), NOW)
    assert conds(status)["Degraded"] == ("True", "ApplyFailed")
    assert conds(status)["Ready"] == ("False", "ApplyFailed")
    nothing = desired_status(None, Observed(1, None, failures=["ConfigMap rmd/x: not found"]), NOW)
    assert conds(nothing)["Degraded"] == ("True", "ApplyFailed")


# --- one pass of the loop ---------------------------------------------------------------------------------


@dataclasses.dataclass
class FakeApi:
    data: dict[str, str] | None
    crd: bool = False
    applied: list[Obj] = dataclasses.field(default_factory=list)
    deleted: list[ObjectRef] = dataclasses.field(default_factory=list)
    statuses: list[Obj] = dataclasses.field(default_factory=list)
    refuse_delete: bool = False
    refuse_apply: str = ""  # a kind whose apply is refused
    refuse_node_states: bool = False

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        assert (namespace, name) == (NS, "rmd-agent-manifests")
        return self.data

    async def crd_exists(self, name: str) -> bool:
        return self.crd

    async def apply(self, obj: Mapping[str, Any]) -> None:
        if obj["kind"] == self.refuse_apply:
            raise WriteError(403, "forbidden")
        self.applied.append(json.loads(json.dumps(obj)))

    async def delete(self, ref: ObjectRef) -> None:
        if self.refuse_delete:
            raise WriteError(403, "forbidden")
        self.deleted.append(ref)

    async def read_daemonset(self, namespace: str, name: str) -> dict[str, Any] | None:
        return ds_with(1, 1, 1) if any(o["kind"] == "DaemonSet" for o in self.applied) else None

    async def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        assert dict(labels) == SELECTOR
        return [pod("n1", True)]

    async def node_labels(self) -> dict[str, dict[str, str]]:
        return {"n1": {NFD: "true"}}

    async def list_node_states(self, namespace: str) -> list[dict[str, Any]]:
        if self.refuse_node_states:
            raise WriteError(403, "forbidden")
        return []

    async def patch_status(self, name: str, status: Mapping[str, Any]) -> None:
        assert name == "rmdconfig"
        self.statuses.append(dict(status))


def _sync(api: FakeApi, posted: list[EventText]) -> RmdConfigSync:
    return RmdConfigSync(
        api,
        lambda obj, event: posted.append(event),
        namespace=NS,
        configmap="rmd-agent-manifests",
        resync=60.0,
        now=lambda: NOW,
    )


def test_a_pass_applies_the_plan_and_writes_the_status() -> None:
    api = FakeApi(BASE_DATA, crd=False)
    posted: list[EventText] = []
    busy = asyncio.run(
        _sync(api, posted).sync(config({**yaml.safe_load(SEED)["spec"], "serviceMonitor": {"enabled": True}}))
    )
    kinds = [o["kind"] for o in api.applied]
    assert kinds[0] == "ServiceAccount"  # first: the DaemonSet's pods need it
    assert kinds.index("DaemonSet") > max(kinds.index("RoleBinding"), kinds.index("ClusterRoleBinding"))
    assert len(api.applied) == 6 and api.deleted == []
    (status,) = api.statuses
    assert conds(status)["Ready"] == ("True", "AgentsReady")
    assert conds(status)["ServiceMonitorReady"] == ("False", "CRDMissing")
    assert [(e.type, e.reason) for e in posted] == [("Warning", "CRDMissing")]
    assert not busy  # settled: the next pass waits for the resync (or the CRD's event)


def test_a_second_pass_before_the_watch_event_writes_and_says_nothing_again() -> None:
    api = FakeApi(BASE_DATA, crd=False)
    posted: list[EventText] = []
    sync = _sync(api, posted)
    body = config({"serviceMonitor": {"enabled": True}})
    asyncio.run(sync.sync(body))
    asyncio.run(sync.sync(body))  # the same body: its status event has not arrived yet
    assert len(api.statuses) == 1
    assert [(e.type, e.reason) for e in posted] == [("Warning", "CRDMissing")]


def test_a_status_changed_by_someone_else_after_the_watch_caught_up_is_written_again() -> None:
    api = FakeApi(BASE_DATA)
    sync = _sync(api, [])
    asyncio.run(sync.sync(config()))
    (written,) = api.statuses
    asyncio.run(sync.sync(config(status=written)))  # the watch event of that write
    assert len(api.statuses) == 1
    asyncio.run(sync.sync(config(status={})))  # e.g. the status cleared by hand
    assert len(api.statuses) == 2 and api.statuses[1] == written


def test_service_monitor_ready_says_whether_the_service_monitor_itself_was_applied() -> None:
    spec = {"serviceMonitor": {"enabled": True}}
    other = FakeApi(BASE_DATA, crd=True, refuse_apply="Service")
    asyncio.run(_sync(other, []).sync(config(spec)))
    assert conds(other.statuses[-1])["ServiceMonitorReady"] == ("True", "Created")
    refused = FakeApi(BASE_DATA, crd=True, refuse_apply="ServiceMonitor")
    asyncio.run(_sync(refused, []).sync(config(spec)))
    (monitor,) = (c for c in refused.statuses[-1]["conditions"] if c["type"] == "ServiceMonitorReady")
    assert (monitor["status"], monitor["reason"]) == ("False", "ApplyFailed")
    assert monitor["message"] == "ServiceMonitor rmd-agent: forbidden"


def test_a_failed_read_keeps_what_the_other_reads_and_the_writes_found() -> None:
    api = FakeApi(BASE_DATA)
    sync = _scheduler_sync(api)
    asyncio.run(sync.sync(config({"scheduler": {"enabled": True}})))
    api.refuse_delete = api.refuse_node_states = True
    asyncio.run(sync.sync(config({"scheduler": {"enabled": False}}, generation=2)))
    status = api.statuses[-1]
    assert (status["desiredNumberScheduled"], status["numberReady"]) == (1, 1)
    assert conds(status)["Ready"] == ("True", "AgentsReady")  # the DaemonSet was read
    assert conds(status)["Degraded"] == ("True", "ApplyFailed")
    assert "reading RmdNodeStates: forbidden" in degraded_message(status)
    assert ref_entry(SCHEDULER_REF) in status["managedObjects"]  # not deleted yet: still listed


def test_a_daemonset_its_controller_has_not_counted_yet_is_not_without_nodes() -> None:
    p = plan(config(), parse_base(BASE_DATA), service_monitor_crd=False)
    fresh = desired_status(p, Observed(1, ds_with(0, 0, 0, generation=1, observed=0)), NOW)
    assert conds(fresh)["Ready"] == ("False", "AgentsNotReady")
    assert conds(fresh)["Progressing"] == ("True", "RollingOut")


def test_no_matching_node_is_settled_a_rollout_is_not() -> None:
    p = plan(config(), parse_base(BASE_DATA), service_monitor_crd=False)
    assert settled(desired_status(p, Observed(1, ds_with(0, 0, 0)), NOW))
    assert not settled(desired_status(p, Observed(1, ds_with(2, 1, 1)), NOW))
    assert not settled(desired_status(p, Observed(1, None), NOW))


def test_a_pass_without_the_manifests_reports_it() -> None:
    api = FakeApi(None)
    posted: list[EventText] = []
    busy = asyncio.run(_sync(api, posted).sync(config()))
    assert api.applied == [] and busy
    (status,) = api.statuses
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ApplyFailed" and "rmd/rmd-agent-manifests: not found" in degraded["message"]


def test_an_unreachable_api_server_is_a_write_error_the_pass_reports() -> None:
    def unreachable() -> None:
        raise urllib3.exceptions.MaxRetryError(None, "/apis", "connection refused")  # type: ignore[arg-type]

    api = RmdConfigApi(client.ApiClient())
    try:
        with pytest.raises(WriteError, match="connection refused"):
            asyncio.run(api._call(unreachable))
    finally:
        api.close()


# --- the agent setting names the operator knows -------------------------------------------------------------


def test_overridable_agent_settings_are_rmd_agents_and_the_charts() -> None:
    fields = {f.name for f in dataclasses.fields(AgentSettings)}
    schema = json.loads((REPO / "charts" / "rmd" / "values.schema.json").read_text())
    chart = set(schema["properties"]["agent"]["properties"]["settings"]["properties"])
    assert chart == OVERRIDABLE
    assert fields >= OVERRIDABLE
    assert CHART_ONLY <= OVERRIDABLE
