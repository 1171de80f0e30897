"""Pod and container identity from cgroup paths: every real-world shape in the reference notes
(power-telemetry-kepler-wao.md §2.1, Kepler's container_test.go vectors), with full-length ids; and pod and
container names from the kubelet's log layout."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmd_agent.hostfs import HostFS
from rmd_agent.power.cgroup_paths import (
    CgroupRef,
    QoS,
    canonical_uid,
    parse_cgroup_path,
    parse_container_dir,
    parse_pod_dir,
)
from rmd_agent.power.pod_meta import (
    KubeletLogDirs,
    PodMeta,
    parse_container_log_link,
    parse_pod_log_dir,
    pod_logs_dir,
)

CID = "a093c0e8b9d1c3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d18d"  # 64 hex digits
UID = "2c9f8a79-5391-454b-88cb-86190881cb96"
UID_ = UID.replace("-", "_")
STATIC_UID = "33d556edd3ae8ef21980288cef77ae8b"  # static pods: a config hash, no dashes

REAL_WORLD = [
    # cgroup v2, systemd driver, CRI-O
    (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope",
        CgroupRef(UID, QoS.BURSTABLE, CID, "crio"),
    ),
    (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope",
        CgroupRef(UID, QoS.BESTEFFORT, CID, "crio"),
    ),
    # Guaranteed pods sit directly under kubepods.slice
    (
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope",
        CgroupRef(UID, QoS.GUARANTEED, CID, "crio"),
    ),
    # containerd
    (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
        CgroupRef(UID, QoS.BURSTABLE, CID, "containerd"),
    ),
    # docker through cri-dockerd, systemd driver
    (
        f"/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope",
        CgroupRef(UID, QoS.GUARANTEED, CID, "docker"),
    ),
    # cgroup v1 named hierarchy line
    (
        f"1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope",
        CgroupRef(UID, QoS.BURSTABLE, CID, "crio"),
    ),
    # cgroupfs driver: the container directory is the bare id
    (f"0::/kubepods/pod{UID}/{CID}", CgroupRef(UID, QoS.GUARANTEED, CID, "")),
    (f"0::/kubepods/burstable/pod{UID}/{CID}", CgroupRef(UID, QoS.BURSTABLE, CID, "")),
    (f"11:blkio:/kubepods/burstable/pod{UID}/{CID}", CgroupRef(UID, QoS.BURSTABLE, CID, "")),
    (f"kubelet/kubepods/besteffort/pod{UID}/{CID}", CgroupRef(UID, QoS.BESTEFFORT, CID, "")),
    # cgroupfs driver with CRI-O keeps the runtime prefix
    (f"/kubepods/besteffort/pod{UID}/crio-{CID}", CgroupRef(UID, QoS.BESTEFFORT, CID, "crio")),
    # containerd's v1 "slice:prefix:id" form under containerd.service
    (
        f"13:memory:/system.slice/containerd.service/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}",
        CgroupRef(UID, QoS.BESTEFFORT, CID, "containerd"),
    ),
    # kind: the kubelet's root under kubelet.slice
    (
        "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
        f"kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
        CgroupRef(UID, QoS.BURSTABLE, CID, "containerd"),
    ),
    # kind-in-docker: a docker scope above the pods must not be taken for the container
    (
        f"0::/system.slice/docker-{'f' * 64}.scope/kubelet.slice/kubelet-kubepods.slice/"
        f"kubelet-kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
        CgroupRef(UID, QoS.GUARANTEED, CID, "containerd"),
    ),
    # cgroup namespace: paths relative to the reader's own cgroup
    (
        f"0::/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
        CgroupRef(UID, QoS.BESTEFFORT, CID, "containerd"),
    ),
    # static pod (uid is a hash), cgroupfs and systemd
    (f"/kubepods/burstable/pod{STATIC_UID}/{CID}", CgroupRef(STATIC_UID, QoS.BURSTABLE, CID, "")),
    (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice",
        CgroupRef(STATIC_UID, QoS.BURSTABLE),
    ),
    # pod level only (the pod cgroup itself), and CRI-O's conmon scope which is pod overhead
    (f"/kubepods.slice/kubepods-pod{UID_}.slice", CgroupRef(UID, QoS.GUARANTEED)),
    (
        f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope",
        CgroupRef(UID, QoS.GUARANTEED),
    ),
]


@pytest.mark.parametrize(("path", "expected"), REAL_WORLD, ids=range(len(REAL_WORLD)))
def test_real_world_shapes(path: str, expected: CgroupRef) -> None:
    assert parse_cgroup_path(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "0::/system.slice/containerd.service",
        "0::/user.slice/user-1000.slice/session-3.scope",
        f"0::/system.slice/docker-{CID}.scope",  # a plain docker container, no pod
        "0::/kubepods.slice/kubepods-burstable.slice",  # a QoS slice, not a pod
        "0::/kubepods",
        f"0::/podman/pod{UID}/{CID}",  # "pod<uid>" outside kubepods is not a kubelet pod
        "0::/",
        "",
    ],
)
def test_not_a_pod(path: str) -> None:
    assert parse_cgroup_path(path) is None


def test_container_dir_names() -> None:
    assert parse_container_dir(f"cri-containerd-{CID}.scope") == ("containerd", CID)
    assert parse_container_dir(f"crio-{CID}.scope") == ("crio", CID)
    assert parse_container_dir(f"docker-{CID}.scope") == ("docker", CID)
    assert parse_container_dir(CID) == ("", CID)
    assert parse_container_dir(f"crio-conmon-{CID}.scope") is None
    assert parse_container_dir("cpu.stat") is None
    assert parse_container_dir(CID[:63]) is None  # a bare id must be a full one


def test_pod_dir_qos_from_parent_for_cgroupfs() -> None:
    assert parse_pod_dir(f"pod{UID}", ("kubepods", "besteffort")) == (UID, QoS.BESTEFFORT)
    assert parse_pod_dir(f"pod{UID}", ("kubepods",)) == (UID, QoS.GUARANTEED)
    assert parse_pod_dir(f"pod{UID}", ()) is None


# --- generated paths: every driver x QoS x runtime x prefix, any uid ---

uids = st.uuids().map(str)
container_ids = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
qoses = st.sampled_from(list(QoS))
runtimes = st.sampled_from([("cri-containerd", "containerd"), ("crio", "crio"), ("docker", "docker")])
prefixes = st.sampled_from(["", "0::", "1:name=systemd:", "4:cpu,cpuacct:", "0::/../.."])


def systemd_path(prefix: str, uid: str, qos: QoS, runtime: str, cid: str, *, kubelet_root: bool) -> str:
    pre = "kubelet-" if kubelet_root else ""
    root = "/kubelet.slice/kubelet-kubepods.slice" if kubelet_root else "/kubepods.slice"
    encoded = uid.replace("-", "_")
    if qos is QoS.GUARANTEED:
        pod = f"{root}/{pre}kubepods-pod{encoded}.slice"
    else:
        pod = f"{root}/{pre}kubepods-{qos}.slice/{pre}kubepods-{qos}-pod{encoded}.slice"
    return f"{prefix}{pod}/{runtime}-{cid}.scope"


def cgroupfs_path(prefix: str, uid: str, qos: QoS, cid: str) -> str:
    qos_dir = "" if qos is QoS.GUARANTEED else f"/{qos}"
    return f"{prefix}/kubepods{qos_dir}/pod{uid}/{cid}"


@given(st.tuples(prefixes, uids, qoses, runtimes, container_ids, st.booleans()))
def test_systemd_shapes_round_trip(case: tuple[str, str, QoS, tuple[str, str], str, bool]) -> None:
    prefix, uid, qos, runtime, cid, kubelet_root = case
    path = systemd_path(prefix, uid, qos, runtime[0], cid, kubelet_root=kubelet_root)
    assert parse_cgroup_path(path) == CgroupRef(uid, qos, cid, runtime[1])


@given(prefixes, uids, qoses, container_ids)
def test_cgroupfs_shapes_round_trip(prefix: str, uid: str, qos: QoS, cid: str) -> None:
    assert parse_cgroup_path(cgroupfs_path(prefix, uid, qos, cid)) == CgroupRef(uid, qos, cid, "")


@given(uids)
def test_canonical_uid_undoes_systemd_escaping(uid: str) -> None:
    assert canonical_uid(uid.replace("-", "_")) == uid


# --- names: the kubelet's log layout (power/pod_meta.py) ---


def test_pod_log_dir_names() -> None:
    assert parse_pod_log_dir(f"kube-system_kube-proxy-6xsx9_{UID}") == (
        UID,
        PodMeta("kube-system", "kube-proxy-6xsx9"),
    )
    assert parse_pod_log_dir(f"kube-system_kube-apiserver-cp_{STATIC_UID}") == (
        STATIC_UID,
        PodMeta("kube-system", "kube-apiserver-cp"),
    )
    assert parse_pod_log_dir(UID) is None  # kubelets before 1.14 used the bare uid
    assert parse_pod_log_dir("a_b") is None


def test_container_log_link_names() -> None:
    link = f"kube-proxy-6xsx9_kube-system_kube-proxy-{CID}.log"
    assert parse_container_log_link(link) == (CID, PodMeta("kube-system", "kube-proxy-6xsx9"), "kube-proxy")
    assert parse_container_log_link(f"web-0_shop_app-{CID[:12]}.log") is None  # ids are full length
    assert parse_container_log_link("README") is None


def test_log_dirs_are_listed_only_for_unknown_ids(tmp_path: Path) -> None:
    now = [0.0]
    (tmp_path / "var/log/pods" / f"shop_web-0_{UID}").mkdir(parents=True)
    (tmp_path / "var/log/containers").mkdir(parents=True)
    (tmp_path / "var/log/containers" / f"web-0_shop_app-{CID}.log").touch()
    names = KubeletLogDirs(HostFS(tmp_path), retry_seconds=60, clock=lambda: now[0])
    names.refresh([UID], [CID])
    assert (names.pod(UID), names.container_name(CID), names.listings) == (PodMeta("shop", "web-0"), "app", 1)
    names.refresh([UID], [CID])
    assert names.listings == 1  # all known: no listing
    other = "11111111-2222-3333-4444-555555555555"
    names.refresh([UID, other], [CID])
    names.refresh([UID, other], [CID])
    assert names.listings == 2  # the unknown uid was looked for once, not on every sample
    now[0] = 61.0
    names.refresh([UID, other], [CID])
    assert names.listings == 3  # and again after retry_seconds
    names.refresh([], [])
    assert names.pod(UID) is None  # forgotten once no longer in use


def test_pod_logs_dir_follows_the_kubelet_config(tmp_path: Path) -> None:
    fs = HostFS(tmp_path)
    assert pod_logs_dir(fs) == "var/log/pods"
    (tmp_path / "var/lib/kubelet").mkdir(parents=True)
    (tmp_path / "var/lib/kubelet/config.yaml").write_text(
        "kind: KubeletConfiguration\npodLogsDir: /data/pods\n"
    )
    assert pod_logs_dir(fs) == "data/pods"
