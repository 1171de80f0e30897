"""The import contracts (pyproject.toml's [tool.importlinter], run by `lint-imports` in `./dev test`) bite.

Each case copies the packages, the tests and pyproject.toml into a temporary directory, adds one forbidden
import and runs the real `lint-imports` there: exactly the contract that forbids the import breaks, and the
output names the import. The unmodified copy keeps every contract.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("proto", "agent", "operator", "sim")  # hold rmd_api, rmd_agent, rmd_operator, rmd_sim
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
_CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS: dict[str, str] = {c["id"]: c["name"] for c in _CONFIG["contracts"]}  # id: name

# (case id, {file: text appended to it (created if absent)}, the contract that breaks, an import it names)
CASES = [
    (
        "operator-imports-agent",
        {"operator/rmd_operator/layering_probe.py": "from rmd_agent import errors\n"},
        "layers",
        "rmd_operator.layering_probe -> rmd_agent.errors",
    ),
    (
        "agent-imports-simulator",
        {"agent/rmd_agent/layering_probe.py": "import rmd_sim.spec\n"},
        "layers",
        "rmd_agent.layering_probe -> rmd_sim.spec",
    ),
    (
        "api-imports-agent",
        {"proto/rmd_api/layering_probe.py": "import rmd_agent.errors\n"},
        "layers",
        "rmd_api.layering_probe -> rmd_agent.errors",
    ),
    (
        "simulator-imports-a-test",
        {"sim/rmd_sim/layering_probe.py": "import tests.conftest\n"},
        "layers",
        "rmd_sim.layering_probe -> tests.conftest",
    ),
    (
        "plan-imports-hostfs",
        {"agent/rmd_agent/plan/layering_probe.py": "from rmd_agent.hostfs import HostFS\n"},
        "plan-is-pure",
        "rmd_agent.plan.layering_probe -> rmd_agent.hostfs",
    ),
    (
        "plan-imports-yaml-in-a-function",  # an import inside a function counts like any other
        {"agent/rmd_agent/plan/layering_probe.py": "def load() -> None:\n    import yaml\n"},
        "plan-is-pure",
        "rmd_agent.plan.layering_probe -> yaml",
    ),
    (
        "node-config-plan-imports-the-client",  # the template controller's decisions stay pure
        {"operator/rmd_operator/node_config_plan.py": "\nimport kubernetes  # noqa: E402\n"},
        "node-config-plan-is-pure",
        "rmd_operator.node_config_plan -> kubernetes",
    ),
    (
        "scheduler-objects-import-kopf",  # the scheduler's objects are computed, not written (#16)
        {"operator/rmd_operator/scheduler_objects.py": "\nimport kopf  # noqa: E402\n"},
        "scheduler-objects-are-pure",
        "rmd_operator.scheduler_objects -> kopf",
    ),
    (
        "agent-imports-kubernetes",  # the agent has its own API client (issue #14)
        {"agent/rmd_agent/layering_probe.py": "from kubernetes import client\n"},
        "agent-without-kubernetes",
        "rmd_agent.layering_probe -> kubernetes",
    ),
    (
        "agent-imports-grpcio",  # the agent's gRPC is grpclib (issue #14): grpcio's pool wakes an idle agent
        {"agent/rmd_agent/layering_probe.py": "import grpc\n"},
        "agent-without-grpcio",
        "rmd_agent.layering_probe -> grpc",
    ),
    (
        "simulator-cycle",  # the cycle an import inside a function once hid: perf needs hosttree back
        {"sim/rmd_sim/perf.py": "\n\ndef _tree() -> None:\n    from rmd_sim import hosttree\n"},
        "acyclic",
        ".perf -> .hosttree",
    ),
]


@pytest.fixture(scope="module")
def clean_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layering") / "clean"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in (*SOURCE_DIRS, "tests"):
        shutil.copytree(REPO / name, root / name, ignore=skip)
    shutil.copy2(REPO / "pyproject.toml", root)
    return root


def lint_imports(root: Path) -> tuple[int, str]:
    """Run lint-imports in `root` on the packages there (not on the installed ones)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(root / d) for d in SOURCE_DIRS),
        "COLUMNS": "400",  # one contract name per line
        "NO_COLOR": "1",
    }
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def verdicts(output: str) -> dict[str, str]:
    """{contract id: "KEPT" or "BROKEN"} from lint-imports' summary."""
    found = {}
    for contract_id, name in CONTRACTS.items():
        match = re.search(re.escape(name) + r"\s+(KEPT|BROKEN)\b", output)
        assert match is not None, f"contract {contract_id!r} missing from the output:\n{output}"
        found[contract_id] = match.group(1)
    return found


def test_the_tree_keeps_every_contract(clean_copy: Path) -> None:
    status, output = lint_imports(clean_copy)
    assert status == 0, output
    assert set(verdicts(output).values()) == {"KEPT"}


@pytest.mark.parametrize(("edits", "contract", "named"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_forbidden_import_breaks_its_contract(
    clean_copy: Path, tmp_path: Path, edits: dict[str, str], contract: str, named: str
) -> None:
    root = tmp_path / "tree"
    shutil.copytree(clean_copy, root)
    for rel, text in edits.items():
        with (root / rel).open("a") as f:
            f.write(text)
    status, output = lint_imports(root)
    assert status != 0, output
    assert {c for c, verdict in verdicts(output).items() if verdict == "BROKEN"} == {contract}, output
    assert named in output
