"""The demo's real-node part (`./dev demo` runs it first where the machine allows): the chart's own pods on a
real kubelet, a cache pod applied there, and nothing left behind."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from rmd_sim.demo import real_node_demo
from rmd_sim.realnode import host_state

pytestmark = pytest.mark.before_stack


def test_the_demo_shows_the_charts_pods_on_a_real_node(
    real_node_bin_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="rmd-rn-demo-", dir="/var/tmp"))
    try:
        assert real_node_demo(workdir, time.monotonic())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = capsys.readouterr().out
    pods = [line.split() for line in out.splitlines() if line.startswith("rmd-system ")]
    assert {p[1].rsplit("-", 2 if "operator" in p[1] else 1)[0] for p in pods} == {
        "rmd-agent",
        "rmd-operator",
    }
    assert all(p[2] == "1/1" and p[3] == "Running" for p in pods), out
    assert "cache-pod-rmd-workload-app" in out and "timed out" not in out
    ways = re.search(r"allocatable on the Node \(the agent's device plugin\): (\d+)", out)
    assert ways and int(ways.group(1)) > 0, out
    assert "the host is as it was" in out
    assert not host_state.KUBELET_DIR.exists() and not host_state.kubepods_cgroups()
