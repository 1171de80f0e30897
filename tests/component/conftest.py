"""Fixtures of the component tests (real sockets, real FUSE mounts)."""

from __future__ import annotations

import os

import pytest

from rmd_sim.resctrl_fuse import fuse_unavailable_reason


@pytest.fixture(scope="session")
def fuse_ok() -> None:
    """Skip without FUSE on a developer's machine; in CI, where ./dev installs fuse3, its absence fails."""
    reason = fuse_unavailable_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"FUSE is required in CI: {reason}")
        pytest.skip(reason)
