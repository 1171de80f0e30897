"""The agent's one settings object. Precedence: command-line flags > environment > config file > defaults.

Environment variables are the field names upper-cased with an RMD_ prefix (RMD_HOST_ROOT); NODE_NAME is
also read, since that is what the downward API conventionally sets. Nothing else in the agent reads
os.environ.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from rmd_agent.errors import ConfigError


@dataclass(frozen=True)
class AgentSettings:
    node_name: str = ""
    host_root: Path = Path("/")
    # Kubelet paths are relative to host_root, so one flag moves the agent onto a simulated node.
    kubelet_dir: str = "var/lib/kubelet"
    kubelet_config: str = "var/lib/kubelet/config.yaml"
    pod_resources_socket: str = "var/lib/kubelet/pod-resources/kubelet.sock"
    kubelet_timeout_seconds: float = 2.0
    log_format: str = "text"  # "text" or "json"

    def host_path(self, rel: str) -> Path:
        return self.host_root / rel.lstrip("/")

    def as_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()}


def _coerce(name: str, raw: Any, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if isinstance(raw, str):
                if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError(raw)
                return raw.lower() in ("1", "true", "yes")
            return bool(raw)
        if isinstance(default, Path):
            return Path(raw)
        return type(default)(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"setting {name}: {raw!r} is not a valid {type(default).__name__}") from None


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of setting names to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_settings(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> AgentSettings:
    """Build the settings from flags (only those given, i.e. not None), environment and an optional file."""
    environ = environ or {}
    known = {f.name: f.default for f in fields(AgentSettings)}
    if config_file is None and environ.get("RMD_CONFIG"):
        config_file = Path(environ["RMD_CONFIG"])
    layers: list[dict[str, Any]] = [_read_config_file(config_file)] if config_file else []
    env_layer = {name: environ[f"RMD_{name.upper()}"] for name in known if f"RMD_{name.upper()}" in environ}
    if "node_name" not in env_layer and environ.get("NODE_NAME"):
        env_layer["node_name"] = environ["NODE_NAME"]
    layers.append(env_layer)
    layers.append({k: v for k, v in (flags or {}).items() if v is not None})
    values: dict[str, Any] = {}
    for layer in layers:
        unknown = sorted(set(layer) - set(known))
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values.update({k: _coerce(k, v, known[k]) for k, v in layer.items()})
    if values.get("log_format", "text") not in ("text", "json"):
        raise ConfigError(f"setting log_format: {values['log_format']!r} must be 'text' or 'json'")
    return AgentSettings(**values)


def dump_settings(settings: AgentSettings) -> str:
    return json.dumps(settings.as_dict(), indent=2, sort_keys=True)
