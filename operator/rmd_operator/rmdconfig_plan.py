"""The cluster's RmdConfig -> the agents' objects (pure, no I/O; docs/install.md "Deployed by an RmdConfig").

The base is what the chart rendered into the <fullname>-agent-manifests ConfigMap (agent.deployedBy
rmdconfig), one object per key, so the agents' pod spec has one source whoever deploys it. The RmdConfig
overrides the DaemonSet's image (rmdImage), pull policy, node selector (rmdNodeSelector when not empty, as
rmd-operator did), tolerations, resources and agent settings, and says whether the ServiceMonitor (only if
its CRD exists) and the dashboard ConfigMap are made. Agent settings become RMD_<NAME> environment
variables, which rmd-agent reads above its config file, so the chart's ConfigMap stays as it is and a change
rolls the pods. Every object gets a controller owner reference to the RmdConfig: deleting it lets the
garbage collector remove them all.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from rmd_api.agent_settings import CHART_ONLY, OVERRIDABLE, env_name
from rmd_api.names import RMD_CONFIG
from rmd_operator.scheduler_objects import scheduler_objects

DAEMONSET_KEY = "daemonset.yaml"
SERVICE_MONITOR_KEY = "servicemonitor.yaml"
DASHBOARD_KEY = "dashboard.yaml"
SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"
AGENT_CONTAINER = "agent"
MANAGER = "rmd-operator"  # the managed-by label and the server-side apply field manager

Obj = dict[str, Any]
# More objects for an RmdConfig: (its spec, its owner reference) -> objects (the scheduler's); a ValueError
# says the spec cannot be honoured (status Degraded, InvalidSpec).
Extra = Callable[[Mapping[str, Any], Mapping[str, Any]], list[Obj]]


def no_extra(spec: Mapping[str, Any], owner: Mapping[str, Any]) -> list[Obj]:
    return []


def scheduler_extra(namespace: str, cluster: str, fingerprint_method: str) -> Extra:
    """The NUMA-aware scheduler of `spec.scheduler` (scheduler_objects), its cache resync matched to the pod
    fingerprint method the agents publish: the RmdConfig's `agentSettings` override, else the chart's."""

    def extra(spec: Mapping[str, Any], owner: Mapping[str, Any]) -> list[Obj]:
        settings = spec.get("agentSettings") or {}
        method = str(settings.get("nrt_pods_fingerprint_method") or fingerprint_method)
        return scheduler_objects(spec.get("scheduler") or {}, namespace, method, owner, cluster=cluster)

    return extra


class PlanError(ValueError):
    """The manifests ConfigMap cannot be used (not YAML, or no DaemonSet): the chart is not the operator's."""


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    namespace: str  # "" for cluster-scoped objects
    name: str

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectRef:
        meta = obj.get("metadata") or {}
        return cls(
            str(obj["apiVersion"]), str(obj["kind"]), str(meta.get("namespace") or ""), str(meta["name"])
        )


@dataclass(frozen=True)
class Plan:
    apply: list[Obj]  # created or updated (server-side apply), owned by the RmdConfig
    remove: list[ObjectRef]  # turned off: deleted if present
    daemonset: Obj
    ignored_settings: dict[str, str] = field(default_factory=dict)  # name -> why it was left out
    service_monitor: str = "NotRequested"  # NotRequested | Planned | CRDMissing
    spec_error: str = ""  # why `extra` could not make its objects

    @property
    def node_selector(self) -> dict[str, str]:
        selector = self.daemonset["spec"]["template"]["spec"].get("nodeSelector") or {}
        return {str(k): str(v) for k, v in selector.items()}

    @property
    def pod_labels(self) -> dict[str, str]:
        labels = self.daemonset["spec"]["selector"].get("matchLabels") or {}
        return {str(k): str(v) for k, v in labels.items()}


def parse_base(data: Mapping[str, str]) -> dict[str, Obj]:
    """The ConfigMap's objects by key; PlanError if one is no Kubernetes object or there is no DaemonSet."""
    objects: dict[str, Obj] = {}
    for key, text in data.items():
        try:
            obj = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise PlanError(f"key {key}: not YAML ({exc})") from None
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not (isinstance(meta, dict) and obj.get("apiVersion") and obj.get("kind") and meta.get("name")):
            raise PlanError(f"key {key}: not a Kubernetes object (apiVersion, kind and metadata.name)")
        objects[key] = obj
    ds = objects.get(DAEMONSET_KEY)
    if ds is None or ds.get("kind") != "DaemonSet":
        raise PlanError(f"no DaemonSet under key {DAEMONSET_KEY}")
    return objects


def owner_reference(config: Mapping[str, Any]) -> Obj:
    meta = config["metadata"]
    return {
        "apiVersion": RMD_CONFIG.api_version,
        "kind": RMD_CONFIG.kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def plan(
    config: Mapping[str, Any],
    base: Mapping[str, Obj],
    *,
    service_monitor_crd: bool,
    extra: Extra = no_extra,
) -> Plan:
    """What to apply and remove for `config` (the RmdConfig) on `base` (parse_base's objects)."""
    spec: Mapping[str, Any] = config.get("spec") or {}
    owner = owner_reference(config)
    daemonset, ignored = _daemonset(base[DAEMONSET_KEY], spec)
    # The DaemonSet after its ServiceAccount and bindings: pods asked for sooner are refused until the
    # ServiceAccount exists, and the DaemonSet controller retries them with a growing backoff.
    apply: list[Obj] = [
        copy.deepcopy(obj)
        for key, obj in sorted(
            base.items(), key=lambda item: (item[1].get("kind") != "ServiceAccount", item[0])
        )
        if key not in (DAEMONSET_KEY, SERVICE_MONITOR_KEY, DASHBOARD_KEY)
    ]
    apply.append(daemonset)
    remove: list[ObjectRef] = []
    monitor = "NotRequested"
    wanted = base.get(SERVICE_MONITOR_KEY)
    if wanted is not None:
        asked = bool((spec.get("serviceMonitor") or {}).get("enabled", False))
        if asked and service_monitor_crd:
            apply.append(_service_monitor(wanted, spec))
            monitor = "Planned"
        elif asked:
            monitor = "CRDMissing"
        elif service_monitor_crd:  # turned off: remove one made before
            remove.append(ObjectRef.of(wanted))
    dashboard = base.get(DASHBOARD_KEY)
    if dashboard is not None:
        if (spec.get("dashboard") or {}).get("enabled", True):
            apply.append(copy.deepcopy(dashboard))
        else:
            remove.append(ObjectRef.of(dashboard))
    spec_error = ""
    try:
        apply += [copy.deepcopy(o) for o in extra(spec, owner)]
    except ValueError as exc:  # the agents still get what they need
        spec_error = str(exc)
    for obj in apply:
        _own(obj, owner)
    return Plan(apply, remove, daemonset, ignored, monitor, spec_error)


def _own(obj: Obj, owner: Obj) -> None:
    meta = obj.setdefault("metadata", {})
    if not meta.get("ownerReferences"):
        meta["ownerReferences"] = [owner]
    labels = meta.get("labels")
    if isinstance(labels, dict) and "app.kubernetes.io/managed-by" in labels:
        labels["app.kubernetes.io/managed-by"] = MANAGER  # not Helm's: no release holds it


def _daemonset(base: Obj, spec: Mapping[str, Any]) -> tuple[Obj, dict[str, str]]:
    ds = copy.deepcopy(base)
    pod = ds["spec"]["template"]["spec"]
    containers = pod.get("containers") or []
    agent = next(
        (c for c in containers if c.get("name") == AGENT_CONTAINER), containers[0] if containers else {}
    )
    if spec.get("rmdImage"):
        agent["image"] = spec["rmdImage"]
    if spec.get("imagePullPolicy"):
        agent["imagePullPolicy"] = spec["imagePullPolicy"]
    if spec.get("rmdNodeSelector"):  # empty: the chart's, as rmd-operator kept its manifest's
        pod["nodeSelector"] = dict(spec["rmdNodeSelector"])
    if "tolerations" in spec:
        pod["tolerations"] = copy.deepcopy(spec["tolerations"])
    if spec.get("resources"):
        agent["resources"] = copy.deepcopy(spec["resources"])
    env, ignored = settings_env(spec.get("agentSettings") or {})
    if env:
        names = {e["name"] for e in env}
        agent["env"] = [e for e in agent.get("env") or [] if e.get("name") not in names] + env
    return ds, ignored


def settings_env(settings: Mapping[str, Any]) -> tuple[list[dict[str, str]], dict[str, str]]:
    """agentSettings as environment variables, and the names left out with why."""
    env: list[dict[str, str]] = []
    ignored: dict[str, str] = {}
    for name in sorted(settings):
        value = settings[name]
        if name not in OVERRIDABLE:
            ignored[name] = "unknown setting"
            continue
        if name in CHART_ONLY:
            ignored[name] = "set in the chart's agent.settings only (it shapes the pod or its RBAC)"
            continue
        text = _setting_text(value)
        if text is None:
            ignored[name] = "the value must be a string, number, boolean or list of strings"
            continue
        env.append({"name": env_name(name), "value": text})
    return env, ignored


def _setting_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)  # list settings take a comma-separated string from the environment
    return None


def _service_monitor(base: Obj, spec: Mapping[str, Any]) -> Obj:
    monitor = copy.deepcopy(base)
    interval = (spec.get("serviceMonitor") or {}).get("interval")
    if interval:
        for endpoint in monitor.get("spec", {}).get("endpoints") or []:
            endpoint["interval"] = interval
    return monitor


def ignored_message(ignored: Mapping[str, str]) -> str:
    return "agentSettings left out: " + "; ".join(f"{name} ({why})" for name, why in sorted(ignored.items()))


def matching_nodes(selector: Mapping[str, str], nodes: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The nodes whose labels carry every label of `selector`, sorted."""
    return sorted(n for n, labels in nodes.items() if all(labels.get(k) == v for k, v in selector.items()))


def ref_entry(ref: ObjectRef) -> dict[str, str]:
    """An object as status.managedObjects lists it."""
    entry = {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name}
    if ref.namespace:
        entry["namespace"] = ref.namespace
    return entry


def stale(previous: Sequence[Mapping[str, Any]], the_plan: Plan) -> list[ObjectRef]:
    """Objects an earlier pass made (status.managedObjects) that this plan no longer has: turned off (e.g. the
    scheduler disabled), to delete."""
    now = {ObjectRef.of(o) for o in the_plan.apply}
    out = []
    for entry in previous:
        if not isinstance(entry, Mapping) or not all(
            isinstance(entry.get(k), str) for k in ("apiVersion", "kind", "name")
        ):
            continue
        ref = ObjectRef(entry["apiVersion"], entry["kind"], str(entry.get("namespace") or ""), entry["name"])
        if ref not in now and ref not in the_plan.remove:
            out.append(ref)
    return out
