"""The real-node tier: a real kubelet with containerd joined to a test control plane, the product installed on
it with helm from images built from the Containerfiles (rmd_sim.realnode). Only RDT, RAPL and cpufreq are
simulated. Needs root, the Debian packages ./dev installs, and the binaries of tools/build-binaries.sh.

Locally the tier is skipped when the machine cannot run it (the reason is shown); with CI set it fails.
Tests marked `before_stack` run first, before the session's stack starts (two kubelets cannot share a host).
When a test fails, the node's and control plane's logs are copied to artifacts/realnode/<test id>/.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from rmd_sim.control_plane import repo_root
from rmd_sim.realnode.node import binaries_or_reason
from rmd_sim.realnode.stack import RealStack

ARTIFACTS_DIR = repo_root() / "artifacts" / "realnode"
_STACK = pytest.StashKey[RealStack]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "before_stack: runs before the session's real-node stack starts")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This folder's `before_stack` tests first among its tests; everything else keeps its place. Its tests
    may build the images (cold: about 5 minutes, in whichever test needs them first), so they get longer than
    the default timeout."""
    here = Path(__file__).parent
    mine = [i for i in items if here in i.path.parents]
    for item in mine:
        item.add_marker(pytest.mark.timeout(1800))
    if mine:
        first = items.index(mine[0])
        rest = [i for i in items if here not in i.path.parents]
        ordered = sorted(mine, key=lambda item: item.get_closest_marker("before_stack") is None)
        items[:] = rest[:first] + ordered + rest[first:]


@pytest.fixture(scope="session")
def real_node_bin_dir() -> Path:
    """The binary directory, or skip (fail under CI) when this machine cannot run a real node."""
    bin_dir, reason = binaries_or_reason()
    if bin_dir is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so the real-node tier must run: {reason}", pytrace=False)
        pytest.skip(f"real node unavailable: {reason}")
    return bin_dir


@pytest.fixture(scope="session")
def stack(request: pytest.FixtureRequest, real_node_bin_dir: Path) -> Iterator[RealStack]:
    """Control plane, simulated hardware, real node, and the chart installed with helm (pods Ready)."""
    bin_dir = real_node_bin_dir
    workdir = Path(tempfile.mkdtemp(prefix="rmd-rn-", dir="/var/tmp"))
    stack = RealStack(bin_dir, workdir)
    try:
        stack.start()
    except Exception:
        _save_logs(stack, ARTIFACTS_DIR / "stack-start")
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    request.config.stash[_STACK] = stack
    try:
        yield stack
    finally:
        del request.config.stash[_STACK]
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _save_logs(stack: RealStack, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for source in (stack.node.logs_dir, stack.control_plane.logs_dir):
        if source.is_dir():
            for log in source.glob("*.log"):
                shutil.copy(log, dest / log.name)
    if stack.control_plane.running:
        (dest / "pods.txt").write_text(stack.describe_pods())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    stack = item.config.stash.get(_STACK, None)
    if report.failed and stack is not None:
        dest = ARTIFACTS_DIR / re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid).strip("_")
        _save_logs(stack, dest)
        report.sections.append(("real node", f"logs saved to {dest}"))
    return report
