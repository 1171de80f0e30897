"""The README's first command runs the demo; this keeps it working: a fresh simulated cluster, the samples
applied, a summary printed, and nothing left running."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import psutil
import pytest

from rmd_sim.control_plane import BinariesNotFound, find_bin_dir


def test_demo_applies_the_samples_and_cleans_up() -> None:
    try:
        find_bin_dir()
    except BinariesNotFound as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))
    result = subprocess.run(
        [sys.executable, "-m", "rmd_sim", "demo", "--no-real-node"],  # tests/realnode runs that part
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for expected in ("workloads settled", "RmdWorkloads, per node:", "NodeResourceTopology", "Power (RAPL"):
        assert expected in out, expected
    assert "Failed" not in out and "Pending" not in out
    assert "stopped; nothing left running" in out
    assert len(out.splitlines()) <= 60  # fits on one screen
    workdir = re.search(r"kubeconfig (\S+)/control-plane/admin.kubeconfig", out)
    assert workdir, out
    leftovers = [  # every component of the demo names its work directory on its command line
        p.info["name"]
        for p in psutil.process_iter(["name", "cmdline"])
        if any(workdir.group(1) in arg for arg in p.info["cmdline"] or ())
    ]
    assert leftovers == []
