from pathlib import Path

import pytest

from rmd_agent.errors import ConfigError
from rmd_agent.settings import AgentSettings, dump_settings, load_settings


def test_defaults() -> None:
    assert load_settings() == AgentSettings()


def test_flags_beat_environment_beat_file(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("host_root: /from-file\nnode_name: file-node\nkubelet-timeout-seconds: 7\n")
    env = {"RMD_HOST_ROOT": "/from-env", "NODE_NAME": "env-node"}
    settings = load_settings({"host_root": "/from-flag", "node_name": None}, env, config)
    assert settings.host_root == Path("/from-flag")
    assert settings.node_name == "env-node"
    assert settings.kubelet_timeout_seconds == 7.0


def test_rmd_prefixed_node_name_wins_over_downward_api_name() -> None:
    assert load_settings(environ={"NODE_NAME": "a", "RMD_NODE_NAME": "b"}).node_name == "b"


def test_config_file_named_by_environment(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("node_name: from-file\n")
    assert load_settings(environ={"RMD_CONFIG": str(config)}).node_name == "from-file"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("node_nam: x\n", "unknown setting"),
        ("- a\n", "must hold a mapping"),
        ("a: [\n", "not valid YAML"),
        ("kubelet_timeout_seconds: soon\n", "not a valid float"),
        ("log_format: xml\n", "must be 'text' or 'json'"),
    ],
)
def test_bad_config_file_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_settings(config_file=config)


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_settings(config_file=tmp_path / "absent.yaml")


def test_host_path_is_relative_to_host_root() -> None:
    settings = load_settings({"host_root": "/host"})
    assert settings.host_path("/var/lib/kubelet") == Path("/host/var/lib/kubelet")
    assert '"host_root": "/host"' in dump_settings(settings)
