"""Each pod's QoS class as the kubelet placed it, by namespace/name, from what the kubelet leaves on the node.

The pod fingerprint must count the pods the scheduler counts, which depends on their QoS class (see
nrt/fingerprint.py). The agent reads no pods from the API server (it has no RBAC for it and must not watch
cluster-wide objects), and PodResources names pods without saying their class or UID. Two kubelet-local
sources together do:

* pod cgroups, which the kubelet creates under its QoS class's parent before starting the pod: Guaranteed
  pods directly under the pod root (`kubepods/pod<uid>`, `kubepods.slice/kubepods-pod<uid>.slice`),
  the others under `burstable`/`besteffort` (`kubepods/burstable/pod<uid>`,
  `kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice`): uid -> QoS class, names
  parsed by power/cgroup_paths.py for both cgroup drivers;
* the kubelet's pod log directories `/var/log/pods/<namespace>_<name>_<uid>` (power/pod_meta.py):
  uid -> namespace/name.

Only directories are listed (the pod root two levels deep, the log directory once), nothing is read. The
class is the one the API server recorded in `status.qosClass` and the scheduler uses: it is computed once,
at creation, and never changes. A pod missing from either source (not started yet, directories not
mounted) is left out, as is a name held by two live pods of different classes (a pod replaced by one with
the same name while the old one terminates); the fingerprint decides those from PodResources alone.

Listing every pod's directories (1,000 entries at 500 pods) was a fifth of the exporter's CPU per change, so
after one full `read()` the exporter hands `update()` the entries the watches saw come or go (each named by
its inotify event) and only those are looked at; a change seen without its name means a full read again.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rmd_agent.errors import HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.config import DEFAULT_CONFIG_PATH
from rmd_agent.nrt.fingerprint import PodKey
from rmd_agent.power.cgroup_paths import QoS, parse_pod_dir
from rmd_agent.power.cpu_time import PodRoot, find_pod_root
from rmd_agent.power.pod_meta import PodMeta, parse_pod_log_dir, pod_logs_dir


def join_pod_qos(classes: Mapping[str, QoS], names: Mapping[str, PodMeta]) -> dict[PodKey, QoS]:
    """(namespace, name) -> QoS class of the pods both sources know, by uid (pure).

    A name whose live uids disagree on the class is left out: which of them PodResources means is unknown.
    """
    found: dict[PodKey, set[QoS]] = {}
    for uid, qos in classes.items():
        meta = names.get(uid)
        if meta is not None:
            found.setdefault((meta.namespace, meta.name), set()).add(qos)
    return {key: next(iter(qos)) for key, qos in found.items() if len(qos) == 1}


def list_pod_cgroups(fs: HostFS, root: PodRoot | Unsupported | None = None) -> dict[str, QoS] | Unsupported:
    """uid -> QoS class of every pod cgroup under the kubelet's pod root (`root`, found when None)."""
    root = find_pod_root(fs) if root is None else root
    if isinstance(root, Unsupported):
        return root
    base = f"{root.hierarchy}/{root.root}"
    parents = tuple(root.root.split("/"))
    try:
        top = fs.listdir(base)
    except HostReadError as exc:
        return Unsupported(str(exc))
    classes: dict[str, QoS] = {}
    for name in top:
        pod = parse_pod_dir(name, parents)
        if pod is not None:
            classes[pod[0]] = pod[1]
            continue
        if name not in ("burstable", "besteffort") and not name.endswith(
            ("-burstable.slice", "-besteffort.slice")
        ):
            continue
        try:
            children = fs.listdir(f"{base}/{name}")
        except HostReadError:
            continue  # a QoS directory that went away: its pods are unknown, not an error of the others
        for child in children:
            pod = parse_pod_dir(child, (*parents, name))
            if pod is not None:
                classes[pod[0]] = pod[1]
    return classes


def qos_parents(root: str) -> tuple[str, str]:
    """The kubelet's Burstable and BestEffort parents under its pod root, for either cgroup driver."""
    last = root.rsplit("/", 1)[-1]
    if last.endswith(".slice"):
        stem = last.removesuffix(".slice")
        return f"{root}/{stem}-burstable.slice", f"{root}/{stem}-besteffort.slice"
    return f"{root}/burstable", f"{root}/besteffort"


def pod_directories(fs: HostFS, kubelet_config: str = DEFAULT_CONFIG_PATH) -> list[str] | Unsupported:
    """The directories (relative to the host root) in which an entry comes or goes whenever a pod starts
    or is gone: the pod cgroup root and its QoS parents, and the pod log directory. Unsupported when the
    kubelet's pod cgroups cannot be found."""
    root = find_pod_root(fs)
    if isinstance(root, Unsupported):
        return root
    base = f"{root.hierarchy}/{root.root}"
    return [base, *qos_parents(base), pod_logs_dir(fs, kubelet_config)]


def list_pod_log_dirs(fs: HostFS, pods_dir: str) -> dict[str, PodMeta] | Unsupported:
    """uid -> namespace/name of every pod log directory."""
    try:
        entries = fs.listdir(pods_dir)
    except HostReadError as exc:
        return Unsupported(str(exc))
    return dict(parsed for parsed in map(parse_pod_log_dir, entries) if parsed is not None)


@dataclass(frozen=True)
class PodQoSReading:
    classes: dict[PodKey, QoS]
    problems: tuple[str, ...] = ()  # sources that could not be read (then `classes` is empty)


class KubeletPodQoS:
    """The QoS class of the node's pods: `read()` lists every source, `update()` looks only at named entries
    of them that came or went since (module docstring)."""

    def __init__(self, fs: HostFS, kubelet_config: str = DEFAULT_CONFIG_PATH) -> None:
        self.fs = fs
        self.kubelet_config = kubelet_config
        self._pods_dir: str | None = None
        # What the last full read found, kept up to date by update(); None until a read succeeded.
        self._root: Path | None = None  # the cgroup hierarchy holding the pod root (absolute)
        self._logs: Path | None = None  # the pod log directory (absolute)
        self._classes: dict[str, QoS] = {}  # uid -> class
        self._names: dict[str, PodMeta] = {}  # uid -> namespace/name
        self._uids: dict[PodKey, set[str]] = {}  # namespace/name -> uids (both sources' or either's)
        self._joined: dict[PodKey, QoS] = {}

    @property
    def pods_dir(self) -> str:
        """The kubelet's podLogsDir (relative to the host root), read from its config once."""
        if self._pods_dir is None:
            self._pods_dir = pod_logs_dir(self.fs, self.kubelet_config)
        return self._pods_dir

    def read(self) -> PodQoSReading:
        self._root = None
        root = find_pod_root(self.fs)
        classes = list_pod_cgroups(self.fs, root)
        names = list_pod_log_dirs(self.fs, self.pods_dir)
        problems = _problems((classes, names))
        if isinstance(classes, Unsupported) or isinstance(names, Unsupported):
            return PodQoSReading({}, problems)
        assert not isinstance(root, Unsupported)  # list_pod_cgroups answered
        self._root, self._logs = self.fs.path(root.hierarchy), self.fs.path(self.pods_dir)
        self._classes, self._names = classes, names
        self._uids = {}
        for uid, meta in names.items():
            self._uids.setdefault((meta.namespace, meta.name), set()).add(uid)
        self._joined = join_pod_qos(classes, names)
        return PodQoSReading(self._joined)

    def update(self, entries: Iterable[Path]) -> PodQoSReading | None:
        """The classes after the pod directory entries `entries` (absolute paths) came or went; each is looked
        at as it is now, so an entry named twice or out of order does no harm. The same dict as before when
        nothing changed. None when there is no full read to update, or an entry is in no directory of it."""
        if self._root is None or self._logs is None:
            return None
        keys: set[PodKey] = set()
        for entry in entries:
            parent = entry.parent
            if parent == self._logs:
                parsed_name = parse_pod_log_dir(entry.name)
                if parsed_name is None:
                    continue
                uid, meta = parsed_name
                old = self._names.pop(uid, None)
                if old is not None:
                    keys.add(self._forget_name(uid, old))
                if os.path.isdir(entry):
                    self._names[uid] = meta
                    key = (meta.namespace, meta.name)
                    self._uids.setdefault(key, set()).add(uid)
                    keys.add(key)
                continue
            if not parent.is_relative_to(self._root):
                return None
            parsed = parse_pod_dir(entry.name, parent.relative_to(self._root).parts)
            if parsed is None:
                continue  # not a pod: a QoS parent coming or going also rebuilds the watches (full read)
            uid, qos = parsed
            # In cgroup v1 the pod is in every hierarchy; only the one accounting CPU is watched.
            if os.path.isdir(entry):
                self._classes[uid] = qos
            else:
                self._classes.pop(uid, None)
            named = self._names.get(uid)
            if named is not None:
                keys.add((named.namespace, named.name))
        changed = False
        for key in keys:
            found = {self._classes[u] for u in self._uids.get(key, ()) if u in self._classes}
            qos_now = next(iter(found)) if len(found) == 1 else None
            if self._joined.get(key) is not qos_now:
                if not changed:  # a new dict: callers compare by identity
                    self._joined, changed = dict(self._joined), True
                if qos_now is None:
                    del self._joined[key]
                else:
                    self._joined[key] = qos_now
        return PodQoSReading(self._joined)

    def _forget_name(self, uid: str, meta: PodMeta) -> PodKey:
        key = (meta.namespace, meta.name)
        uids = self._uids.get(key)
        if uids is not None:
            uids.discard(uid)
            if not uids:
                del self._uids[key]
        return key


def _problems(results: Iterable[object]) -> tuple[str, ...]:
    return tuple(r.reason for r in results if isinstance(r, Unsupported))
