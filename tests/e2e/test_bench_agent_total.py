"""Smoke test of bench/agent_total.py (issue #14 item 5): a tiny run of the whole-agent benchmark, so the
script cannot rot. It starts its own control plane, simulated node, simulator and agent; here with 20 pods, 5
workloads, 2 s windows and one part turned off (the scrapes), in about half a minute."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from rmd_sim.control_plane import BinariesNotFound, find_bin_dir, repo_root
from rmd_sim.resctrl_fuse import fuse_unavailable_reason


@pytest.fixture(scope="module")
def needs_cluster_parts() -> None:
    reasons = [fuse_unavailable_reason() or ""]
    try:
        find_bin_dir()
    except BinariesNotFound as exc:
        reasons.append(str(exc))
    reason = "; ".join(r for r in reasons if r)
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so the benchmark's parts are required: {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.mark.usefixtures("needs_cluster_parts")
def test_agent_total_tiny_run_measures_every_part_it_was_asked_for() -> None:
    argv = [
        sys.executable,
        str(repo_root() / "bench" / "agent_total.py"),
        *("--pods", "20", "--workloads", "5", "--window", "2", "--repeats", "1", "--warmup", "1"),
        *("--scrape-interval", "1", "--parts", "scrape", "--json"),
    ]
    profiled = shutil.which("py-spy") is not None  # optional: the profile is checked where py-spy is
    if profiled:
        argv += ["--profile", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    result = json.loads(done.stdout)

    # Everything was on in the measured agent, and the node was left as the kernel allows.
    assert result["checks"] and all(result["checks"].values()), result["checks"]
    assert result["resctrl_rule_violations"] == []
    # Everything on, the part off, everything on again (the baseline is both).
    all_on, scrapes_off, again = result["runs"]
    assert (all_on["part"], scrapes_off["part"], again["part"]) == ("all", "scrape", "all")
    assert [r["scrapes"] for r in all_on["repetitions"]] == [2]  # at 0 s and 1 s of the 2 s window
    assert [r["scrapes"] for r in scrapes_off["repetitions"]] == [0]
    assert result["total"]["windows"] == 2
    assert all_on["repetitions"][0]["scrape_bytes"] > 10_000
    assert 20 < all_on["rss_mib"] <= all_on["rss_peak_mib"]
    assert 0 <= all_on["cpu_share"] < 1
    assert result["simulator_steps_per_second"] > 0
    (contribution,) = result["contributions"]
    assert contribution["part"] == "scrape"
    assert contribution["cpu_share"] == pytest.approx(
        (all_on["cpu_share"] + again["cpu_share"]) / 2 - scrapes_off["cpu_share"]
    )
    if profiled:  # py-spy ran; a second of a small idle agent may hold no sample at all
        profile = result["profile"]
        assert "error" not in profile, profile
        assert not profile["shares"] or sum(profile["shares"].values()) == pytest.approx(1.0)
    # The exit status is the targets' verdict.
    assert done.returncode == (0 if all(t["met"] for t in result["targets"]) else 1)
