"""Operator settings (flags > environment > file), the kopf command line they give, and retry backoff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kopf._core.engines import peering

from rmd_operator.backoff import Backoff
from rmd_operator.cli import kopf_arguments, main, name_user_for_kopf
from rmd_operator.errors import ConfigError
from rmd_operator.settings import OperatorSettings, dump_settings, load_settings


def test_defaults() -> None:
    settings = load_settings()
    assert settings == OperatorSettings()
    assert settings.insecure_agents is False  # TLS unless asked otherwise
    assert settings.server_name("worker-1") == "rmd-agent.worker-1"


def test_flags_beat_environment_beat_file(tmp_path: Path) -> None:
    config = tmp_path / "operator.yaml"
    config.write_text("drift-interval-seconds: 7\nnamespaces: [a, b]\nretry_max_seconds: 50\n")
    env = {"RMD_OPERATOR_DRIFT_INTERVAL_SECONDS": "9", "RMD_OPERATOR_RETRY_MAX_SECONDS": "40"}
    settings = load_settings({"drift_interval_seconds": "11", "retry_max_seconds": None}, env, config)
    assert settings.drift_interval_seconds == 11.0
    assert settings.retry_max_seconds == 40.0
    assert settings.namespaces == ("a", "b")


def test_downward_api_names_are_fallbacks() -> None:
    env = {"POD_NAMESPACE": "rmd-system", "POD_NAME": "rmd-operator-abc"}
    settings = load_settings(environ=env)
    assert (settings.node_state_namespace, settings.instance) == ("rmd-system", "rmd-operator-abc")
    both = load_settings(environ={**env, "RMD_OPERATOR_NODE_STATE_NAMESPACE": "agents"})
    assert both.node_state_namespace == "agents"


def test_config_file_named_by_environment(tmp_path: Path) -> None:
    config = tmp_path / "operator.yaml"
    config.write_text("insecure_agents: true\n")
    assert load_settings(environ={"RMD_OPERATOR_CONFIG": str(config)}).insecure_agents is True


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"drift_interval_seconds": "soon"}, "not a valid float"),
        ({"drift_interval_seconds": "0"}, "must be positive"),
        ({"retry_initial_seconds": "10", "retry_max_seconds": "5"}, "below retry_initial_seconds"),
        ({"agent_server_name": "rmd-agent"}, r"must contain \{node\}"),
        ({"log_format": "xml"}, "'text' or 'json'"),
        ({"insecure_agents": "maybe"}, "not a valid bool"),
        ({"agent_max_calls": "0"}, "at least 1"),
        ({"node_nam": "x"}, "unknown setting"),
    ],
)
def test_bad_settings_are_clear_errors(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(flags)


def test_kopf_command_line() -> None:
    args = kopf_arguments(OperatorSettings())
    assert args[:3] == ["run", "-m", "rmd_operator.handlers"]
    assert "--standalone" in args
    assert "--all-namespaces" in args
    assert args[args.index("--liveness") + 1] == "http://0.0.0.0:8080/healthz"
    scoped = kopf_arguments(
        load_settings(
            {"namespaces": "team-a", "node_state_namespace": "rmd", "peering": "rmd", "priority": "5"}
        )
    )
    assert "--standalone" not in scoped
    assert scoped[scoped.index("--peering") + 1] == "rmd"
    assert scoped[scoped.index("--priority") + 1] == "5"
    namespaces = [scoped[i + 1] for i, a in enumerate(scoped) if a == "--namespace"]
    assert namespaces == ["team-a", "rmd"]  # the agents' namespace is watched too
    quiet = kopf_arguments(
        load_settings({"log_level": "warning", "log_format": "json", "liveness_listen": ""})
    )
    assert "--quiet" in quiet
    assert quiet[quiet.index("--log-format") + 1] == "json"
    assert "--liveness" not in quiet


def test_kopf_identity_needs_no_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's identity looks the uid up in /etc/passwd, which fails for the image's 65532 (seen on a real
    node: KeyError in getpwuid, the operator pod crashed at start)."""

    def no_entry(uid: int) -> None:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr("pwd.getpwuid", no_entry)
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    name_user_for_kopf(os.environ)
    assert peering.detect_own_id(manual=True).startswith("rmd-operator@")
    monkeypatch.setenv("USER", "alice")
    name_user_for_kopf(os.environ)
    assert os.environ["USER"] == "alice"  # an environment that names the user wins


def test_print_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--peering", "p", "--drift-interval-seconds", "3", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert '"peering": "p"' in out
    assert '"drift_interval_seconds": 3.0' in out
    assert main(["run", "--standalone", "--print-config"]) == 0
    assert '"peering": ""' in capsys.readouterr().out
    assert '"insecure_agents": false' in dump_settings(OperatorSettings())


def test_bad_flag_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--retry-initial-seconds", "-1", "--print-config"]) == 2
    assert "retry_initial_seconds" in capsys.readouterr().err


def test_backoff_doubles_up_to_the_maximum_and_resets_on_success() -> None:
    b = Backoff(initial=1.0, maximum=5.0)
    assert b.due("n", 0.0)
    assert b.failed("n", 0.0) == 1.0
    assert not b.due("n", 0.5)
    assert b.due("n", 1.0)
    assert b.failed("n", 1.0) == 2.0
    assert b.failed("n", 3.0) == 4.0
    assert b.failed("n", 7.0) == 5.0
    assert b.next_attempt("n") == 12.0
    assert b.due("other", 7.0)  # per node
    b.succeeded("n")
    assert b.due("n", 7.0)
    assert b.next_attempt("n") is None


def test_concurrent_failures_count_once() -> None:
    b = Backoff(initial=2.0, maximum=60.0)
    b.failed("n", 10.0)
    assert b.failed("n", 10.1) == pytest.approx(1.9)  # a second workload failing on the same outage
    assert b.failures("n") == 1
