"""Smoke test of bench/power_overhead.py (issue #14 item 4): a tiny run, so the script cannot rot. 12 pods,
4 samples at 0.2 s, one repetition: the simulator process, the sampler, the scrape, the per-process scan
and the read step on a real cgroup2 tree (CI runs as root) all run, in a few seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rmd_sim.control_plane import repo_root


def test_power_overhead_tiny_run_reports_cost_accuracy_and_the_real_tree() -> None:
    argv = [
        sys.executable,
        str(repo_root() / "bench" / "power_overhead.py"),
        *("--pods", "12", "--samples", "4", "--interval", "0.2", "--repeats", "1", "--procs", "1", "--json"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    result = json.loads(done.stdout)
    (rep,) = result["repetitions"]
    assert rep["figures"]["sample (cpu)"]["mean_ms"] > 0
    assert rep["scrape_bytes"] > 0 and rep["series_per_scrape"] > 12
    assert rep["conservation_error"] <= 1e-9
    assert abs(rep["accuracy"]["total_error"]) < 0.05  # 4 samples: loose, but the truth is compared
    assert set(result["targets"]) and all(set(t) == {"met", "value"} for t in result["targets"].values())
    real = result["real_cgroup_read"]
    if os.geteuid() == 0 or os.environ.get("CI"):
        assert real is not None and real["files"] == 12 * 3 and real["kept_ms"] > 0 and real["open_ms"] > 0
