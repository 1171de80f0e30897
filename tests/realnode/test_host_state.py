"""The real node leaves the host as it found it: after a clean stop, after a run that was cut short (its
successor cleans up), and twice in a row. Runs before the session's stack (one kubelet per host)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmd_sim.control_plane import REAL_NODE_CONTROLLERS, ControlPlane
from rmd_sim.realnode import host_state, images
from rmd_sim.realnode.node import RealNode
from rmd_sim.realnode.stack import wait_for

pytestmark = pytest.mark.before_stack


@pytest.fixture(scope="module")
def control_plane(real_node_bin_dir: Path) -> Iterator[ControlPlane]:
    bin_dir = real_node_bin_dir
    workdir = Path(tempfile.mkdtemp(prefix="rmd-rn-cp-", dir="/var/tmp"))
    cp = ControlPlane(bin_dir, workdir, controllers=REAL_NODE_CONTROLLERS, scheduler=True)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def run_a_pod(node: RealNode, busybox: str) -> None:
    """A Guaranteed pod on the node's exclusive CPU: cgroups, mounts, a sandbox and a shim are made."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "host-probe", "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "c",
                    "image": busybox,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {"cpu": "1", "memory": "32Mi"}},
                }
            ],
        },
    }
    path = node.workdir / "pod.json"
    path.write_text(json.dumps(manifest))
    node.control_plane.kubectl("apply", "-f", str(path))

    def running() -> bool:
        out = node.control_plane.kubectl("get", "pod", "host-probe", "-o", "jsonpath={.status.phase}")
        return out.stdout == "Running"

    wait_for("the probe pod Running", running, timeout=60)


def test_the_host_is_left_as_found(control_plane: ControlPlane) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="rmd-rn-host-", dir="/var/tmp"))
    before = host_state.HostSnapshot.take(workdir, "")
    busybox = images.busybox_image()
    try:
        # A run cut short: the kubelet and containerd die with their pod still running.
        node = RealNode(control_plane, workdir, "host-check")
        node.start(images.pause_image())
        node.import_images([busybox])
        run_a_pod(node, busybox)
        for proc in (node.kubelet, node.containerd):
            assert proc is not None and proc.pid is not None
            os.killpg(proc.pid, signal.SIGKILL)
        assert host_state.kubepods_cgroups(), "the interrupted run left no pod cgroups to clean"
        # Its successor (same name) cleans up first, then runs the pod again; twice in a row, stopped cleanly.
        for _ in range(2):
            node.network = None if node.network is None else node.network.destroy()  # died with the process
            node = RealNode(control_plane, workdir, "host-check")
            node.start(images.pause_image())
            node.import_images([busybox])
            run_a_pod(node, busybox)
            node.stop()
            assert node.host_differences() == []
            control_plane.kubectl("delete", "pod", "host-probe", "--force", "--grace-period=0", check=False)
        fresh = host_state.HostSnapshot.take(workdir, "")
        assert fresh.sysctls == before.sysctls
        assert fresh.kubepods == before.kubepods
        assert fresh.container_logs == before.container_logs
        assert host_state.mounts_under(workdir) == [] and not host_state.KUBELET_DIR.exists()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
