"""The helm binary for the tests that render or install the chart (tests/e2e), found as the control plane's
binaries are: skipped where it is not built, a failure under CI."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rmd_sim.control_plane import BinariesNotFound, find_bin_dir, repo_root

CHART = repo_root() / "charts" / "rmd"


def require_binary(name: str) -> Path:
    """The built binary `name` (helm, kube-scheduler, ...); skips the test without it, unless CI is set."""
    try:
        path = find_bin_dir() / name
    except BinariesNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so {name} is required: {exc}", pytrace=False)
        pytest.skip(f"{name} unavailable: {exc}")
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} is not built (tools/build-binaries.sh builds it)")
    return path


@dataclass(frozen=True)
class Helm:
    binary: Path
    home: Path  # helm's cache/config/data, kept out of the user's home

    @classmethod
    def found(cls, home: Path) -> Helm:
        return cls(require_binary("helm"), home)

    def run(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        for name in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            env[name] = str(self.home / name.lower())
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
            env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        result = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=env, timeout=120, check=False
        )
        if check and result.returncode != 0:
            output = f"{result.stdout}\n{result.stderr}".strip()
            pytest.fail(f"helm {' '.join(args)} failed ({result.returncode}):\n{output}", pytrace=False)
        return result

    def template(self, release: str, namespace: str, *args: str) -> list[dict[str, Any]]:
        """The chart's objects as `helm template` renders them."""
        out = self.run("template", release, str(CHART), "--namespace", namespace, *args).stdout
        return [d for d in yaml.safe_load_all(out) if d]
