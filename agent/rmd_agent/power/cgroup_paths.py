"""Which pod (and container) a cgroup belongs to, from the path alone. Pure: no I/O.

The kubelet names pod cgroups after the pod UID, so no API lookup is needed for the uid. Shapes handled
(reference power-telemetry-kepler-wao.md §2.1, Kepler's container_test.go vectors):

    systemd driver   kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, - as _>.slice/
                         cri-containerd-<id>.scope | crio-<id>.scope | docker-<id>.scope
                     kubepods.slice/kubepods-pod<uid>.slice/...              (Guaranteed: no QoS slice)
                     kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/
                         kubelet-kubepods-besteffort-pod<uid>.slice/...       (kind: kubelet under a prefix)
    cgroupfs driver  kubepods/burstable/pod<uid>/<id>, kubepods/pod<uid>/<id>, kubelet/kubepods/...
    containerd v1    system.slice/containerd.service/kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>

Paths may be absolute, relative to a cgroup namespace (`/../../kubepods-…`), nested in another container
(kind-in-docker: `/system.slice/docker-<id>.scope/kubelet.slice/…`) or whole `/proc/<pid>/cgroup` lines
(`0::/…`, `11:blkio:/…`). Static pods have 32-hex-digit UIDs (a hash, no dashes); those parse too.
CRI-O's `crio-conmon-<id>.scope` holds the container's monitor process: it belongs to the pod, not to a
container.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class QoS(StrEnum):
    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BESTEFFORT = "besteffort"


@dataclass(frozen=True)
class CgroupRef:
    """What a cgroup path says: always a pod, a container when the path reaches one."""

    pod_uid: str  # canonical, with dashes
    qos: QoS
    container_id: str | None = None
    runtime: str | None = None  # "containerd", "crio", "docker", "libpod"; "" for cgroupfs bare ids


_PROC_LINE = re.compile(r"^\d+:[^:/]*:(?=/|\.\.|[a-z])")
_UID = r"[0-9a-f][0-9a-f_-]{7,}"
# systemd: [<prefix>-]kubepods[-<qos>]-pod<uid>.slice, where the uid has '_' for '-'
_SYSTEMD_POD = re.compile(rf"^(?:[a-z0-9.]+-)*?kubepods(?:-(besteffort|burstable))?-pod({_UID})\.slice$")
_CGROUPFS_POD = re.compile(rf"^pod({_UID})$")
_QOS_DIRS = {"besteffort": QoS.BESTEFFORT, "burstable": QoS.BURSTABLE}
_RUNTIMES = {
    "cri-containerd": "containerd",
    "containerd": "containerd",
    "crio": "crio",
    "docker": "docker",
    "cri-dockerd": "docker",
    "libpod": "libpod",
}
_CONTAINER_SCOPE = re.compile(
    r"^(cri-containerd|containerd|crio|docker|cri-dockerd|libpod)-([0-9a-f]{12,64})(?:\.scope)?$"
)
_BARE_ID = re.compile(r"^[0-9a-f]{64}$")
_CONMON = re.compile(r"^crio-conmon-[0-9a-f]+(?:\.scope)?$")


def canonical_uid(raw: str) -> str:
    """A pod UID as the API shows it: the systemd driver writes '_' where the UID has '-'."""
    return raw.replace("_", "-")


def parse_container_dir(name: str) -> tuple[str, str] | None:
    """(runtime, container id) for a container cgroup directory name; None for anything else.

    None also for CRI-O's conmon scope: its CPU time is the pod's, not a container's.
    """
    if _CONMON.match(name):
        return None
    match = _CONTAINER_SCOPE.match(name)
    if match:
        return _RUNTIMES[match.group(1)], match.group(2)
    if _BARE_ID.match(name):
        return "", name
    return None


def parse_pod_dir(name: str, parents: tuple[str, ...] = ()) -> tuple[str, QoS] | None:
    """(pod uid, QoS) when `name` is a pod cgroup directory; `parents` are the directories above it.

    A cgroupfs `pod<uid>` directory only counts under a `kubepods` directory, so an unrelated cgroup that
    happens to start with "pod" is not taken for one.
    """
    match = _SYSTEMD_POD.match(name)
    if match:
        qos = _QOS_DIRS.get(match.group(1) or "", QoS.GUARANTEED)
        return canonical_uid(match.group(2)), qos
    match = _CGROUPFS_POD.match(name)
    if match and "kubepods" in parents:
        above = parents[-1] if parents else ""
        return canonical_uid(match.group(1)), _QOS_DIRS.get(above, QoS.GUARANTEED)
    return None


def parse_cgroup_path(path: str) -> CgroupRef | None:
    """The pod (and container) of a cgroup path or `/proc/<pid>/cgroup` line; None when it is no pod's."""
    path = _PROC_LINE.sub("", path.strip(), count=1)
    parents: list[str] = []
    segments = [s for s in path.split("/") if s and s not in (".", "..")]
    for index, segment in enumerate(segments):
        # cgroup v1 with containerd's systemd cgroup: "<pod slice>:<runtime prefix>:<container id>"
        slice_name, runtime_prefix, container_id = _split_colon_form(segment)
        pod = parse_pod_dir(slice_name, tuple(parents))
        if pod is None:
            parents.append(segment)
            continue
        uid, qos = pod
        if container_id is not None:
            runtime = _RUNTIMES.get(runtime_prefix, runtime_prefix)
            return CgroupRef(uid, qos, container_id, runtime)
        if index + 1 < len(segments):
            container = parse_container_dir(segments[index + 1])
            if container is not None:
                return CgroupRef(uid, qos, container[1], container[0])
        return CgroupRef(uid, qos)
    return None


def _split_colon_form(segment: str) -> tuple[str, str, str | None]:
    parts = segment.split(":")
    if len(parts) == 3 and re.fullmatch(r"[0-9a-f]{12,64}", parts[2]):
        return parts[0], parts[1], parts[2]
    return segment, "", None
