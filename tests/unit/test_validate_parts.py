"""The parts of `rmdctl validate` around the checks: CRD schema digests, the readers of API objects, the
report (table and JSON), the command line, and the topology manager detail the agent writes for it."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from rmd_api.node_state import parse_topology_manager_detail, topology_manager_detail
from rmd_operator import ctl
from rmd_operator.validate.certs import name_matches
from rmd_operator.validate.crd_schema import schema_digest, version_digests, without_descriptions
from rmd_operator.validate.expected_crds import EXPECTED_CRDS
from rmd_operator.validate.findings import (
    EXIT_CANNOT_VALIDATE,
    EXIT_ERRORS,
    EXIT_OK,
    EXIT_WARNINGS,
    Finding,
    Severity,
    error,
    exit_status,
    info,
    ok,
    warning,
)
from rmd_operator.validate.report import as_json, as_table
from rmd_operator.validate.snapshot import ago, quantity, selector_matches
from rmd_operator.validate.tls_peer import split_endpoint

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


# --- CRD schemas --------------------------------------------------------------------------------------------


def test_the_expected_digests_are_those_of_crds_in_the_repository() -> None:
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        storage = next(v["name"] for v in crd["spec"]["versions"] if v["storage"])
        assert EXPECTED_CRDS[crd["metadata"]["name"]] == (storage, version_digests(crd))


def test_descriptions_do_not_count_but_a_property_named_description_does() -> None:
    schema = {
        "type": "object",
        "description": "top",
        "properties": {
            "description": {"type": "string", "description": "a field called description"},
            "items": {"type": "array", "items": {"type": "string", "description": "an item"}},
            "either": {"anyOf": [{"type": "integer", "description": "n"}, {"type": "string"}]},
            "map": {"type": "object", "additionalProperties": {"type": "string", "description": "v"}},
        },
    }
    assert without_descriptions(schema) == {
        "type": "object",
        "properties": {
            "description": {"type": "string"},
            "items": {"type": "array", "items": {"type": "string"}},
            "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "map": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }

    def version(properties: dict[str, object]) -> dict[str, object]:
        return {
            "name": "v1",
            "served": True,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": properties}},
        }

    base = version({"description": {"type": "string"}})
    assert schema_digest(base) == schema_digest(
        version({"description": {"type": "string", "description": "x"}})
    )
    assert schema_digest(base) != schema_digest(version({}))
    assert schema_digest(base) != schema_digest({**base, "subresources": {"status": {}}})


# --- readers ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("31", 31),
        ("500m", 0.5),
        ("4Gi", 4 * 1024**3),
        ("1k", 1000),
        ("0", 0),
        ("2x", None),
        ("", None),
        (None, None),
    ],
)
def test_quantities(text: str | None, value: float | None) -> None:
    parsed = quantity(text)
    assert (None if parsed is None else float(parsed)) == value


def test_label_selectors() -> None:
    labels = {"app": "rmd", "tier": "node"}
    assert selector_matches({"matchLabels": {"app": "rmd"}}, labels)
    assert not selector_matches({"matchLabels": {"app": "other"}}, labels)
    assert selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["node"]}]}, labels
    )
    assert not selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["node"]}]}, labels
    )
    assert selector_matches({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "x", "operator": "Exists"}]}, labels)


def test_times_for_people() -> None:
    assert ago(NOW, NOW - timedelta(seconds=12)) == "12s ago"
    assert ago(NOW, NOW - timedelta(minutes=5)) == "5m ago"
    assert ago(NOW, NOW + timedelta(days=3, hours=1)) == "in 3d"


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("worker-1.rmd-agent.ns.svc", "worker-1.rmd-agent.ns.svc", True),
        ("*.rmd-agent.ns.svc", "worker-1.rmd-agent.ns.svc", True),
        ("*.rmd-agent.ns.svc", "ip-10-0-0-1.ec2.internal.rmd-agent.ns.svc", False),  # one label only
        ("*.rmd-agent.ns.svc", "rmd-agent.ns.svc", False),
        ("Worker-1.RMD-agent.ns.svc.", "worker-1.rmd-agent.ns.svc", True),
    ],
)
def test_certificate_names_match_as_tls_matches_them(pattern: str, name: str, matches: bool) -> None:
    assert name_matches(pattern, name) is matches


@pytest.mark.parametrize(
    ("endpoint", "parsed"),
    [
        ("10.0.3.17:50051", ("10.0.3.17", 50051)),
        ("[fd00::5]:50051", ("fd00::5", 50051)),
        ("node:1", ("node", 1)),
    ],
)
def test_endpoints(endpoint: str, parsed: tuple[str, int]) -> None:
    assert split_endpoint(endpoint) == parsed


@pytest.mark.parametrize("endpoint", ["10.0.3.17", ":50051", "host:port"])
def test_endpoints_that_are_not(endpoint: str) -> None:
    with pytest.raises(ValueError, match="is not host:port"):
        split_endpoint(endpoint)


def test_the_topology_manager_detail_round_trips() -> None:
    """The agent writes it (rmd_agent.probe), rmdctl reads it: one spelling in rmd_api."""
    detail = topology_manager_detail("single-numa-node", "pod")
    assert detail == "single-numa-node (scope pod)"
    assert parse_topology_manager_detail(detail) == ("single-numa-node", "pod")
    for other in ("single-numa-node", "a b (scope pod)", " (scope pod)", "x (scope )", "x (scope pod"):
        assert parse_topology_manager_detail(other) is None


# --- findings and the report --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("severities", "status"),
    [
        ((), EXIT_OK),
        (("ok", "info"), EXIT_OK),
        (("ok", "warning"), EXIT_WARNINGS),
        (("warning", "error"), EXIT_ERRORS),
    ],
)
def test_the_exit_status_is_the_worst_severity(severities: tuple[str, ...], status: int) -> None:
    assert exit_status([Finding(None, "x", Severity(s), "m") for s in severities]) == status


FINDINGS = [
    ok(None, "operator", "Deployment rmd-operator: 1/1 available"),
    info(None, "scheduler", "no NUMA-aware scheduler deployed", "deploy one"),
    warning(
        "worker-1", "cpu-manager", "the kubelet's CPU manager is not static: " + "x " * 60, "set it static"
    ),
    error("worker-2", "agent", "not Ready (AgentStopped)", "start it"),
]


def test_the_table_shows_every_finding_and_the_fix_of_problems() -> None:
    table = as_table(FINDINGS, "rmd-system", NOW, width=100)
    lines = table.splitlines()
    assert lines[0] == "rmdctl validate: release namespace rmd-system, at 2026-11-25T12:00:00Z"
    assert lines[1].split() == ["NODE", "CHECK", "SEVERITY", "FINDING"]
    assert lines[2].split()[:3] == ["(cluster)", "operator", "ok"]
    assert any(line.split()[:3] == ["worker-2", "agent", "ERROR"] for line in lines)
    assert all(len(line) <= 100 for line in lines)
    assert sum("fix: " in line for line in lines) == 3  # not for ok
    assert lines[-1] == "1 error(s), 1 warning(s), 1 info, 1 ok"


def test_quiet_shows_only_problems_and_nothing_when_there_are_none() -> None:
    quiet = as_table(FINDINGS, "rmd-system", NOW, quiet=True)
    assert "operator" not in quiet and "scheduler" not in quiet and "cpu-manager" in quiet
    assert as_table(FINDINGS[:2], "rmd-system", NOW, quiet=True) == ""


def test_json_counts_every_finding_even_when_quiet() -> None:
    document = json.loads(as_json(FINDINGS, "rmd-system", NOW, quiet=True))
    assert document["exitStatus"] == EXIT_ERRORS
    assert document["summary"] == {"ok": 1, "info": 1, "warning": 1, "error": 1}
    assert [f["check"] for f in document["findings"]] == ["cpu-manager", "agent"]
    assert document["findings"][1] == {
        "node": "worker-2",
        "check": "agent",
        "severity": "error",
        "message": "not Ready (AgentStopped)",
        "fix": "start it",
    }


# --- the command line ---------------------------------------------------------------------------------------


def test_rmdctl_is_a_console_script() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["rmdctl"] == "rmd_operator.ctl:main"
    assert callable(ctl.main)


def test_bad_arguments_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        ctl.main(["validate", "--no-such-flag"])
    assert exited.value.code == EXIT_CANNOT_VALIDATE
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_no_usable_kubeconfig_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["validate", "--kubeconfig", str(tmp_path / "missing")]) == EXIT_CANNOT_VALIDATE
    assert capsys.readouterr().err.startswith(
        f"rmdctl validate: cannot validate: kubeconfig {tmp_path}/missing"
    )


def test_an_api_server_that_does_not_answer_exits_3(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rmd_operator.ctl",
            "validate",
            "--kubeconfig",
            str(kubeconfig),
            "--timeout",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_CANNOT_VALIDATE, done.stderr
    assert "cannot reach the API server" in done.stderr and done.stdout == ""
