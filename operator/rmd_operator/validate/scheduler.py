"""The NUMA-aware scheduler as a cluster runs it: a KubeSchedulerConfiguration in a ConfigMap whose profile
enables NodeResourceTopologyMatch (scheduler-plugins), and the Deployment that mounts it. rmdctl finds it by
its configuration, not by a name, so it recognises the scheduler however it was deployed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from rmd_operator.validate.snapshot import Obj, meta, name_of

KIND = "KubeSchedulerConfiguration"
NRT_PLUGIN = "NodeResourceTopologyMatch"
# How its cache matches the pods it placed with an NRT (NodeResourceTopologyMatchArgs.cache.resyncMethod),
# and the agent's pod fingerprint method each fixed one needs (nodeTopologyPodsFingerprintMethod).
AUTODETECT = "Autodetect"  # the default: whatever method the NRT says
RESYNC_NEEDS = {"All": "all", "OnlyExclusiveResources": "with-exclusive-resources"}


@dataclass(frozen=True)
class SchedulerProfile:
    configmap: str  # namespace/name
    namespace: str
    configmap_name: str
    scheduler_name: str
    numa_aware: bool  # NodeResourceTopologyMatch enabled as a filter
    resync_seconds: int  # cacheResyncPeriodSeconds; 0: no reserve cache (the NRT is read as is)
    resync_method: str


def _names(entries: object) -> set[str]:
    if not isinstance(entries, list):
        return set()
    return {str(e.get("name")) for e in entries if isinstance(e, Mapping)}


def _enabled(plugins: Mapping[str, Any], point: str) -> bool | None:
    """True/False when extension point `point` enables/disables the plugin; None when it does not say."""
    section = plugins.get(point) or {}
    if not isinstance(section, Mapping):
        return None
    if NRT_PLUGIN in _names(section.get("enabled")):
        return True
    disabled = _names(section.get("disabled"))
    return False if NRT_PLUGIN in disabled or "*" in disabled else None


def _numa_aware(profile: Mapping[str, Any]) -> bool:
    plugins = profile.get("plugins") or {}
    if not isinstance(plugins, Mapping):
        return False
    filter_point = _enabled(plugins, "filter")
    return filter_point if filter_point is not None else bool(_enabled(plugins, "multiPoint"))


def _plugin_args(profile: Mapping[str, Any]) -> Mapping[str, Any]:
    for entry in profile.get("pluginConfig") or ():
        if isinstance(entry, Mapping) and entry.get("name") == NRT_PLUGIN:
            args = entry.get("args")
            return args if isinstance(args, Mapping) else {}
    return {}


def profiles_in(configmap: Mapping[str, Any]) -> tuple[list[SchedulerProfile], list[str]]:
    """The profiles of the KubeSchedulerConfigurations in a ConfigMap, and what could not be read."""
    namespace, name = str(meta(configmap).get("namespace") or ""), name_of(configmap)
    found: list[SchedulerProfile] = []
    problems: list[str] = []
    for key, text in sorted((configmap.get("data") or {}).items()):
        if not isinstance(text, str) or KIND not in text:
            continue
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            problems.append(f"ConfigMap {namespace}/{name} key {key}: not YAML ({exc})")
            continue
        if not isinstance(document, Mapping) or document.get("kind") != KIND:
            continue
        for profile in document.get("profiles") or ():
            if not isinstance(profile, Mapping):
                continue
            args = _plugin_args(profile)
            cache = args.get("cache") if isinstance(args.get("cache"), Mapping) else {}
            try:
                resync = int(args.get("cacheResyncPeriodSeconds") or 0)
            except (TypeError, ValueError):
                resync = 0
            found.append(
                SchedulerProfile(
                    configmap=f"{namespace}/{name}",
                    namespace=namespace,
                    configmap_name=name,
                    scheduler_name=str(profile.get("schedulerName") or "default-scheduler"),
                    numa_aware=_numa_aware(profile),
                    resync_seconds=resync,
                    resync_method=str((cache or {}).get("resyncMethod") or AUTODETECT),
                )
            )
    return found, problems


def all_profiles(configmaps: Iterable[Mapping[str, Any]]) -> tuple[list[SchedulerProfile], list[str]]:
    profiles: list[SchedulerProfile] = []
    problems: list[str] = []
    for configmap in configmaps:
        found, bad = profiles_in(configmap)
        profiles += found
        problems += bad
    return profiles, problems


def _mounts(deployment: Mapping[str, Any], configmap_name: str) -> bool:
    template = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    for volume in template.get("volumes") or ():
        if ((volume.get("configMap") or {}).get("name")) == configmap_name:
            return True
        for source in (volume.get("projected") or {}).get("sources") or ():
            if ((source.get("configMap") or {}).get("name")) == configmap_name:
                return True
    return False


def deployment_of(profile: SchedulerProfile, deployments: Sequence[Obj]) -> Obj | None:
    """The Deployment that mounts the profile's ConfigMap, in its namespace."""
    for deployment in deployments:
        if meta(deployment).get("namespace") == profile.namespace and _mounts(
            deployment, profile.configmap_name
        ):
            return deployment
    return None


def available(deployment: Mapping[str, Any]) -> tuple[int, int]:
    """(available replicas, wanted replicas)."""
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    wanted = spec.get("replicas")
    return int(status.get("availableReplicas") or 0), 1 if wanted is None else int(wanted)
