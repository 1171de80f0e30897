"""Pod namespace/name by UID and container name by id, from what the kubelet keeps on the node.

cgroup paths give the pod UID and the container id only. The kubelet's other local sources fall short:
PodResources List has namespace/name but no UID, `cpu_manager_state` has UIDs but no names, and the
kubelet's /pods endpoint needs a token with nodes/proxy rights. What every kubelet with a CRI runtime does
keep is its container log layout (kubelet kuberuntime `BuildPodLogsDirectory`, `BuildContainerLogsDirectory`
and the /var/log/containers links):

    /var/log/pods/<namespace>_<pod name>_<pod uid>/<container name>/<restart>.log
    /var/log/containers/<pod name>_<namespace>_<container name>-<container id>.log  -> the file above

Namespaces, pod names and container names are DNS labels or subdomains and cannot contain "_", so the
names split unambiguously. Only directory listings are read, never a log. The kubelet's `podLogsDir`
setting (KubeletConfiguration) moves the first directory; the second is fixed. The chart mounts both
read-only. When neither is available the metrics keep the uid label and leave namespace and pod empty.

Any other source (a watch on pods with spec.nodeName=<node>) can stand in through `PodMetaSource`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

import yaml

from rmd_agent.hostfs import HostFS
from rmd_api.yaml_errors import YAML_ERRORS

POD_LOGS_DIR = "var/log/pods"
CONTAINER_LOGS_DIR = "var/log/containers"
KUBELET_CONFIG = "var/lib/kubelet/config.yaml"
_CONTAINER_LINK = re.compile(r"^([^_]+)_([^_]+)_(.+)-([0-9a-f]{64})\.log$")


@dataclass(frozen=True)
class PodMeta:
    namespace: str
    name: str


class PodMetaSource(Protocol):
    def refresh(self, uids: Collection[str], container_ids: Collection[str]) -> None:
        """Called once per sample with the ids in use, before any lookup."""
        ...

    def pod(self, uid: str) -> PodMeta | None: ...

    def container_name(self, container_id: str) -> str | None: ...


def parse_pod_log_dir(name: str) -> tuple[str, PodMeta] | None:
    """ "<namespace>_<name>_<uid>" -> (uid, meta); None for other names (e.g. kubelets before 1.14: <uid>)."""
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    namespace, pod, uid = parts
    return uid, PodMeta(namespace, pod)


def parse_container_log_link(name: str) -> tuple[str, PodMeta, str] | None:
    """ "<pod>_<namespace>_<container>-<id>.log" -> (container id, pod meta, container name)."""
    match = _CONTAINER_LINK.match(name)
    if match is None:
        return None
    pod, namespace, container, container_id = match.groups()
    return container_id, PodMeta(namespace, pod), container


def pod_logs_dir(fs: HostFS, config_path: str = KUBELET_CONFIG) -> str:
    """The kubelet's podLogsDir from its config file (relative to the host root), else the default."""
    try:
        document = yaml.safe_load(fs.read_text(config_path))
    except (OSError, *YAML_ERRORS):
        return POD_LOGS_DIR
    value = document.get("podLogsDir") if isinstance(document, dict) else None
    return value.strip("/") if isinstance(value, str) and value.strip("/") else POD_LOGS_DIR


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


class KubeletLogDirs:
    """PodMetaSource over the kubelet's log directories. Lists them only when an id in use is unknown:
    at once for ids never looked for, at most every `retry_seconds` for ids a listing did not explain."""

    def __init__(
        self,
        fs: HostFS,
        *,
        pods_dir: str | None = None,
        containers_dir: str = CONTAINER_LOGS_DIR,
        retry_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pods_path = str(fs.path(pods_dir if pods_dir is not None else pod_logs_dir(fs)))
        self.containers_path = str(fs.path(containers_dir))
        self.retry_seconds = retry_seconds
        self.clock = clock
        self._pods: dict[str, PodMeta] = {}
        self._containers: dict[str, str] = {}
        self._unexplained: set[str] = set()
        self._listed_at: float | None = None
        self.listings = 0  # how many times the directories were listed (for tests and the bench)

    def refresh(self, uids: Collection[str], container_ids: Collection[str]) -> None:
        wanted = set(uids) | set(container_ids)
        unknown = {u for u in uids if u not in self._pods} | {
            c for c in container_ids if c not in self._containers
        }
        if unknown:
            stale = self._listed_at is None or self.clock() - self._listed_at >= self.retry_seconds
            if stale or not unknown <= self._unexplained:
                self._list()
                self._unexplained = {u for u in uids if u not in self._pods} | {
                    c for c in container_ids if c not in self._containers
                }
        # forget what is no longer in use, so the maps stay as small as the node's pods
        for key in [k for k in self._pods if k not in wanted]:
            del self._pods[key]
        for key in [k for k in self._containers if k not in wanted]:
            del self._containers[key]

    def _list(self) -> None:
        self.listings += 1
        self._listed_at = self.clock()
        for name in _listdir(self.pods_path):
            parsed = parse_pod_log_dir(name)
            if parsed is not None:
                self._pods[parsed[0]] = parsed[1]
        for name in _listdir(self.containers_path):
            link = parse_container_log_link(name)
            if link is not None:
                self._containers[link[0]] = link[2]

    def pod(self, uid: str) -> PodMeta | None:
        return self._pods.get(uid)

    def container_name(self, container_id: str) -> str | None:
        return self._containers.get(container_id)
