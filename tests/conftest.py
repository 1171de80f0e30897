"""Shared test helpers. Kept tiny: fixtures that several test folders need."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import settings

# Shared helper modules under tests/ (telemetry_peers.py) import by their name in any test folder: with
# --import-mode=importlib this directory is on no path otherwise.
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Before any test module imports grpc: see rmd_sim/__init__.py (tests start agents, kubelets and the operator
# as subprocesses while in-process gRPC servers run).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# Property tests check behaviour, not speed: on a 2-CPU machine shared with builds and simulated clusters a
# single example can take longer than hypothesis's default 200 ms deadline.
settings.register_profile("rmd", deadline=None)
settings.load_profile("rmd")
# The fuzz campaign over the parsers of untrusted input (tests/unit/test_fuzz_*.py, docs/security.md): the
# same examples on every run (derandomize) and a deadline per example. A parser takes microseconds, so 500 ms
# means a hang or a blow-up (a cpu range expanded into millions of CPUs), not a busy machine.
# RMD_FUZZ_EXAMPLES=N runs a longer campaign with N examples per test, new ones on every run.
_FUZZ_EXAMPLES = int(os.environ.get("RMD_FUZZ_EXAMPLES") or 0)
settings.register_profile(
    "fuzz",
    deadline=timedelta(milliseconds=500),
    derandomize=not _FUZZ_EXAMPLES,
    max_examples=_FUZZ_EXAMPLES or 200,
    database=None,
)


@pytest.fixture
def make_tree(tmp_path: Path) -> Callable[[Mapping[str, str]], Path]:
    """Write {relative path: content} under a fresh root and return the root."""

    def make(files: Mapping[str, str]) -> Path:
        root = tmp_path / "host"
        for rel, content in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        root.mkdir(exist_ok=True)
        return root

    return make


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh directory with a short path (unix sockets must fit AF_UNIX's 108 bytes), in memory when
    /dev/shm exists: simulated host trees are thousands of small files."""
    parent = "/dev/shm" if Path("/dev/shm").is_dir() else None
    root = Path(tempfile.mkdtemp(prefix="rmd-", dir=parent))
    yield root
    shutil.rmtree(root, ignore_errors=True)
