"""End-to-end fixtures: one real control plane per test session, a fresh namespace per test.

Without the binaries (tools/build-binaries.sh) the e2e tests are skipped locally but fail in CI (env CI
set). When a test fails, the component logs are copied to artifacts/e2e/<test>/ in the repository.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_sim.control_plane import BinariesNotFound, ControlPlane, find_bin_dir, repo_root

ARTIFACTS_DIR = repo_root() / "artifacts" / "e2e"
_RUNNING = pytest.StashKey[ControlPlane]()


def _artifact_dir(nodeid: str) -> Path:
    return ARTIFACTS_DIR / re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """The session's control plane, with every crds/*.yaml applied; KUBECONFIG points at it."""
    try:
        bin_dir = find_bin_dir()
    except BinariesNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so the e2e control plane is required: {exc}", pytrace=False)
        pytest.skip(f"e2e control plane unavailable: {exc}")
    crds = sorted((repo_root() / "crds").glob("*.yaml"))
    # A temp dir rather than tmp_path_factory: pytest keeps old basetemps, and etcd preallocates 64 MB WALs.
    with tempfile.TemporaryDirectory(prefix="rmd-e2e-", ignore_cleanup_errors=True) as workdir:
        cp = ControlPlane(bin_dir, Path(workdir), crds=crds)
        try:
            cp.start()
        except Exception:
            cp.save_logs(_artifact_dir("control-plane-start"))
            raise
        request.config.stash[_RUNNING] = cp
        try:
            with pytest.MonkeyPatch.context() as mp:
                env = cp.env()
                for name in ("KUBECONFIG", "NO_PROXY", "no_proxy"):
                    mp.setenv(name, env[name])
                yield cp
        finally:
            del request.config.stash[_RUNNING]
            cp.stop()


@pytest.fixture(autouse=True)
def _mark_control_plane_logs(request: pytest.FixtureRequest) -> None:
    """Write the test id into the component logs so saved logs show where each test began."""
    if "control_plane" in request.fixturenames:
        cp: ControlPlane = request.getfixturevalue("control_plane")
        cp.mark_logs(f"test {request.node.nodeid} starts")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    cp = item.config.stash.get(_RUNNING, None)
    if report.failed and cp is not None and "control_plane" in getattr(item, "fixturenames", ()):
        dest = cp.save_logs(_artifact_dir(item.nodeid))
        report.sections.append(("control plane", f"component logs saved to {dest}"))
    return report


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount in place), deleted after the test."""
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        created = core.create_namespace(
            client.V1Namespace(
                metadata=client.V1ObjectMeta(generate_name="e2e-", labels={"rmd.test/e2e": "true"})
            )
        )
        assert created.metadata is not None and created.metadata.name
        name = created.metadata.name
        if "serviceaccount-controller" in control_plane.controllers:
            # Pods are rejected by the ServiceAccount admission plugin until this exists.
            deadline = time.monotonic() + 30
            while True:
                try:
                    core.read_namespaced_service_account("default", name)
                    break
                except ApiException as exc:
                    if exc.status != 404 or time.monotonic() > deadline:
                        raise
                time.sleep(0.1)
        try:
            yield name
        finally:
            try:
                core.delete_namespace(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
