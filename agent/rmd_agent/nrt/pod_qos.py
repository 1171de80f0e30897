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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rmd_agent.errors import HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.config import DEFAULT_CONFIG_PATH
from rmd_agent.nrt.fingerprint import PodKey
from rmd_agent.power.cgroup_paths import QoS, parse_pod_dir
from rmd_agent.power.cpu_time import find_pod_root
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


def list_pod_cgroups(fs: HostFS) -> dict[str, QoS] | Unsupported:
    """uid -> QoS class of every pod cgroup under the kubelet's pod root."""
    root = find_pod_root(fs)
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
    """Reads the QoS class of the node's pods on every `read()` (a few directory listings)."""

    def __init__(self, fs: HostFS, kubelet_config: str = DEFAULT_CONFIG_PATH) -> None:
        self.fs = fs
        self.kubelet_config = kubelet_config
        self._pods_dir: str | None = None

    @property
    def pods_dir(self) -> str:
        """The kubelet's podLogsDir (relative to the host root), read from its config once."""
        if self._pods_dir is None:
            self._pods_dir = pod_logs_dir(self.fs, self.kubelet_config)
        return self._pods_dir

    def read(self) -> PodQoSReading:
        classes = list_pod_cgroups(self.fs)
        names = list_pod_log_dirs(self.fs, self.pods_dir)
        problems = _problems((classes, names))
        if isinstance(classes, Unsupported) or isinstance(names, Unsupported):
            return PodQoSReading({}, problems)
        return PodQoSReading(join_pod_qos(classes, names))


def _problems(results: Iterable[object]) -> tuple[str, ...]:
    return tuple(r.reason for r in results if isinstance(r, Unsupported))
