"""Shared test helpers. Kept tiny: fixtures that several test folders need."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest


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
