"""The NUMA-aware scheduler of an RmdConfig's `spec.scheduler`, as Kubernetes objects (issue #16 item 2).

Pure: `scheduler_objects` turns the spec into the objects the RmdConfig controller applies, and raises
SpecError for a spec it cannot honour; it reads and writes nothing. What it makes (docs/scheduler.md):

* ConfigMap `<schedulerName>-config`: a KubeSchedulerConfiguration with one profile, `schedulerName`, that
  adds scheduler-plugins' NodeResourceTopologyMatch to the default plugins (filter, score, and reserve, which
  its reserve cache needs), the cache resynced every 2 s with the resync method the agents' pod fingerprint
  method needs, and leader election on a Lease named `schedulerName` in the namespace;
* Deployment `<schedulerName>` running the image with that file, no host access, probes on the secure port;
* ServiceAccount `<schedulerName>`, a Role and RoleBinding for its Lease only, and three ClusterRoleBindings:
  to the built-in `system:kube-scheduler` and `system:volume-scheduler` and to the chart's ClusterRole
  `<cluster>-numa-scheduler` (NodeResourceTopology read access). The cluster-scoped bindings are named after
  the chart's `cluster` name, not the spec, so the chart can grant the operator their names only.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

import yaml

from rmd_operator.errors import SpecError
from rmd_operator.validate.scheduler import KIND, NRT_PLUGIN, RESYNC_NEEDS

Obj = dict[str, Any]

CONFIG_API_VERSION = "kubescheduler.config.k8s.io/v1"
CONFIG_KEY = "config.yaml"
CONFIG_DIR = "/etc/rmd-numa-scheduler"
CONFIG_HASH_ANNOTATION = "rmd.intel.com/scheduler-config-hash"  # a new configuration restarts the pods
DEFAULT_SCHEDULER_NAME = "rmd-numa-scheduler"
SECURE_PORT = 10259  # kube-scheduler's default; /healthz there is allowed without credentials
# numaresources-operator uses 5 (the value measured in numa-scheduler-interop.md); 2 so that the agents'
# requeue echo (nrt_requeue_seconds, 3 s after a change) comes after the resync it must follow, and a pod
# rejected from the over-reserved cache is retried within 5 s even when the change waited for the agents'
# write-rate bound (bench/nrt_requeue.py, docs/topology.md).
CACHE_RESYNC_SECONDS = 2
# Of the pods other schedulers place, only those holding exclusive resources change a node's NRT, so only
# they make the cache resync that node.
FOREIGN_PODS_DETECT = "OnlyExclusiveResources"
# The agents' nrt_pods_fingerprint_method -> the cache resync method whose fingerprint equals theirs
# (scheduler-plugins CacheResyncMethod); the inverse of the table rmdctl validate checks, so both agree.
RESYNC_METHODS: dict[str, str] = {fingerprint: resync for resync, fingerprint in RESYNC_NEEDS.items()}
MAX_REPLICAS = 5
DEFAULT_RESOURCES: Obj = {"requests": {"cpu": "100m", "memory": "128Mi"}}
RUN_AS = 65532  # the scheduler-plugins image's nonroot user (distroless)

PART_OF_LABEL = "app.kubernetes.io/part-of"
COMPONENT_LABEL = "app.kubernetes.io/component"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT = "numa-scheduler"
BUILTIN_ROLES = ("system:kube-scheduler", "system:volume-scheduler")

# A DNS-1123 label: the name is also a label value (63 characters at most).
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_RESOURCE_KEYS = frozenset({"requests", "limits"})


def numa_cluster_role(cluster: str) -> str:
    """The chart's ClusterRole with the plugin's own API access (charts/rmd/templates/scheduler-rbac.yaml)."""
    return f"{cluster}-numa-scheduler"


def cluster_binding_names(cluster: str) -> dict[str, str]:
    """ClusterRole -> the ClusterRoleBinding granting it to the scheduler; the chart lets the operator manage
    exactly these names."""
    base = numa_cluster_role(cluster)
    return {
        numa_cluster_role(cluster): base,
        "system:kube-scheduler": f"{base}-kube-scheduler",
        "system:volume-scheduler": f"{base}-volume-scheduler",
    }


def _name(spec: Mapping[str, Any]) -> str:
    name = spec.get("schedulerName", DEFAULT_SCHEDULER_NAME)
    if not isinstance(name, str) or len(name) > 63 or not _NAME.match(name):
        raise SpecError(
            f"spec.scheduler.schedulerName: {name!r} is not a valid name: use at most 63 lower-case letters, "
            "digits and '-', starting and ending with a letter or digit (it names the Deployment, its "
            "ConfigMap and its Lease)"
        )
    if name == "default-scheduler":
        raise SpecError(
            "spec.scheduler.schedulerName: 'default-scheduler' is the cluster's own scheduler: choose "
            f"another name (default {DEFAULT_SCHEDULER_NAME}), which pods then name in spec.schedulerName"
        )
    return name


def _image(spec: Mapping[str, Any]) -> str:
    image = spec.get("image")
    if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
        raise SpecError(
            f"spec.scheduler.image: {image!r} is not an image reference: set the scheduler-plugins "
            "kube-scheduler image whose version matches your cluster's Kubernetes minor version, e.g. "
            "registry.k8s.io/scheduler-plugins/kube-scheduler:v0.34.7 for Kubernetes 1.34 (docs/scheduler.md)"
        )
    return image


def _replicas(spec: Mapping[str, Any]) -> int:
    replicas = spec.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
        raise SpecError(
            f"spec.scheduler.replicas: {replicas!r} must be an integer from 1 to {MAX_REPLICAS} "
            "(replicas beyond the first are standbys: one leader schedules at a time)"
        )
    return replicas


def _is_resources(value: object) -> bool:
    """A container's resources: requests and/or limits, each of resource name -> quantity."""
    return isinstance(value, Mapping) and all(
        key in _RESOURCE_KEYS
        and isinstance(quantities, Mapping)
        and all(isinstance(q, str | int) and not isinstance(q, bool) for q in quantities.values())
        for key, quantities in value.items()
    )


def _resources(spec: Mapping[str, Any]) -> Obj:
    resources = spec.get("resources") or DEFAULT_RESOURCES
    if not _is_resources(resources):
        unknown = set(resources) - _RESOURCE_KEYS if isinstance(resources, Mapping) else set()
        raise SpecError(
            f"spec.scheduler.resources: {resources!r} must look like a container's resources, "
            "{requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 512Mi}}"
            + (f"; unknown key(s) {', '.join(sorted(map(str, unknown)))}" if unknown else "")
        )
    return {key: dict(quantities) for key, quantities in resources.items()}


def _resync_method(fingerprint_method: str) -> str:
    method = RESYNC_METHODS.get(fingerprint_method)
    if method is None:
        raise SpecError(
            f"the agents' nrt_pods_fingerprint_method {fingerprint_method!r} has no matching scheduler cache "
            f"resync method: use one of {', '.join(sorted(RESYNC_METHODS))} (docs/topology.md, Fingerprint)"
        )
    return method


def _owner_reference(owner: Mapping[str, Any]) -> Obj:
    missing = [key for key in ("apiVersion", "kind", "name", "uid") if not owner.get(key)]
    if missing:
        raise ValueError(f"owner reference lacks {', '.join(missing)}: {dict(owner)!r}")
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["name"],
        "uid": owner["uid"],
        "controller": bool(owner.get("controller", True)),
        "blockOwnerDeletion": bool(owner.get("blockOwnerDeletion", True)),
    }


def scheduler_config(scheduler_name: str, namespace: str, fingerprint_method: str) -> Obj:
    """The KubeSchedulerConfiguration: the default plugins plus NodeResourceTopologyMatch, one profile."""
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": KIND,
        # Several replicas are safe: only the Lease holder schedules.
        "leaderElection": {
            "leaderElect": True,
            "resourceLock": "leases",
            "resourceName": scheduler_name,
            "resourceNamespace": namespace,
        },
        "profiles": [
            {
                "schedulerName": scheduler_name,
                "plugins": {
                    "filter": {"enabled": [{"name": NRT_PLUGIN}]},
                    "score": {"enabled": [{"name": NRT_PLUGIN}]},
                    # The reserve point feeds the over-reserve cache that cacheResyncPeriodSeconds turns on.
                    "reserve": {"enabled": [{"name": NRT_PLUGIN}]},
                },
                "pluginConfig": [
                    {
                        "name": NRT_PLUGIN,
                        "args": {
                            "cacheResyncPeriodSeconds": CACHE_RESYNC_SECONDS,
                            "cache": {
                                "foreignPodsDetect": FOREIGN_PODS_DETECT,
                                # Fixed, not Autodetect: a node whose NRT lacks the method attribute would
                                # fall back to All and never match an agent counting exclusive pods only.
                                "resyncMethod": _resync_method(fingerprint_method),
                            },
                        },
                    }
                ],
            }
        ],
    }


def _probe() -> Obj:
    # HTTPS with the scheduler's self-signed certificate, which the kubelet does not verify.
    return {
        "httpGet": {"path": "/healthz", "port": SECURE_PORT, "scheme": "HTTPS"},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
    }


def _deployment(name: str, image: str, replicas: int, resources: Obj, config_text: str) -> Obj:
    selector = {COMPONENT_LABEL: COMPONENT, INSTANCE_LABEL: name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(selector)},
            "template": {
                "metadata": {
                    "labels": {PART_OF_LABEL: "rmd-k8s", **selector},
                    "annotations": {
                        CONFIG_HASH_ANNOTATION: hashlib.sha256(config_text.encode()).hexdigest()[:16]
                    },
                },
                "spec": {
                    "serviceAccountName": name,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": RUN_AS,
                        "runAsGroup": RUN_AS,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    # Standbys on other nodes, so losing a node does not stop scheduling for long.
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "labelSelector": {"matchLabels": dict(selector)},
                                        "topologyKey": "kubernetes.io/hostname",
                                    },
                                }
                            ]
                        }
                    },
                    "containers": [
                        {
                            "name": "kube-scheduler",
                            "image": image,
                            "command": ["/bin/kube-scheduler"],  # the image's binary (scheduler-plugins)
                            "args": [
                                f"--config={CONFIG_DIR}/{CONFIG_KEY}",
                                # No client-CA lookup in kube-system's extension-apiserver-authentication:
                                # it would need read access there; bearer tokens (TokenReview, granted by
                                # system:kube-scheduler) still authenticate scrapers of /metrics.
                                "--authentication-skip-lookup=true",
                            ],
                            "ports": [{"name": "https", "containerPort": SECURE_PORT, "protocol": "TCP"}],
                            "livenessProbe": {**_probe(), "initialDelaySeconds": 15, "failureThreshold": 3},
                            "readinessProbe": _probe(),
                            "resources": resources,
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "runAsNonRoot": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
                        }
                    ],
                    "volumes": [{"name": "config", "configMap": {"name": f"{name}-config"}}],
                },
            },
        },
    }


def _lease_role(name: str) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "rules": [
            # RBAC cannot limit create by name (the name is in the body, not the URL).
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [name],
                "verbs": ["get", "update"],
            },
        ],
    }


def _binding(kind: str, role_kind: str, role: str, name: str, namespace: str) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }


def scheduler_objects(
    spec: Mapping[str, Any],
    namespace: str,
    fingerprint_method: str,
    owner: Mapping[str, Any],
    *,
    cluster: str,
) -> list[Obj]:
    """The objects for RmdConfig `spec.scheduler` (`spec`), in `namespace`, for agents publishing pod
    fingerprints with `fingerprint_method`, each owned by `owner` (the RmdConfig: apiVersion, kind, name,
    uid). `cluster` is the chart's cluster-scoped name prefix (`rmd.clusterName`). Empty when the scheduler
    is not enabled; SpecError when the spec cannot be honoured."""
    if not isinstance(spec, Mapping):
        raise SpecError(f"spec.scheduler: must be an object, not {type(spec).__name__}")
    if not spec.get("enabled", False):
        return []
    if not namespace or not _NAME.match(namespace):
        raise ValueError(f"namespace {namespace!r} is not a namespace name")
    if not cluster:
        raise ValueError("cluster: the chart's cluster name is required")
    name = _name(spec)
    config_text = yaml.safe_dump(
        scheduler_config(name, namespace, fingerprint_method), sort_keys=False, default_flow_style=False
    )
    image, replicas, resources = _image(spec), _replicas(spec), _resources(spec)
    namespaced: list[tuple[str, Obj]] = [
        (f"{name}-config", {"apiVersion": "v1", "kind": "ConfigMap", "data": {CONFIG_KEY: config_text}}),
        (name, {"apiVersion": "v1", "kind": "ServiceAccount"}),
        (name, _lease_role(name)),
        (name, _binding("RoleBinding", "Role", name, name, namespace)),
        (name, _deployment(name, image, replicas, resources, config_text)),
    ]
    cluster_scoped = [
        (binding, _binding("ClusterRoleBinding", "ClusterRole", role, name, namespace))
        for role, binding in cluster_binding_names(cluster).items()
    ]
    labels = {PART_OF_LABEL: "rmd-k8s", COMPONENT_LABEL: COMPONENT, INSTANCE_LABEL: name}
    owner_ref = _owner_reference(owner)
    objects: list[Obj] = []
    for obj_name, obj in [*namespaced, *cluster_scoped]:
        metadata: Obj = {"name": obj_name}
        if obj["kind"] != "ClusterRoleBinding":
            metadata["namespace"] = namespace
        metadata |= {"labels": dict(labels), "ownerReferences": [dict(owner_ref)]}
        objects.append(
            {"apiVersion": obj.pop("apiVersion"), "kind": obj.pop("kind"), "metadata": metadata, **obj}
        )
    return objects
