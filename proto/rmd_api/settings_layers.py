"""The layered settings both programs use: flags > environment > config file > defaults.

A settings object is a frozen dataclass whose field defaults say each value's type (bool, int, float, str,
Path, tuple of str). Each program keeps its own dataclass, environment prefix, aliases (the downward API's
conventional names) and checks; only the layering and the conversion of raw values live here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from rmd_api.yaml_errors import YAML_ERRORS

ErrorFactory = Callable[[str], Exception]  # the program's ConfigError


def coerce(name: str, raw: Any, default: Any, error: ErrorFactory) -> Any:
    """`raw` (from a flag, variable or YAML file) as the type of `default`. Strings are accepted for every
    type; from YAML, a bool must be a bool and a number must not be one."""
    try:
        if isinstance(default, bool):
            if isinstance(raw, str):
                if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError(raw)
                return raw.lower() in ("1", "true", "yes")
            if not isinstance(raw, bool):
                raise ValueError(raw)
            return raw
        if isinstance(default, Path):
            return Path(raw)
        if isinstance(default, tuple):
            items = raw.split(",") if isinstance(raw, str) else raw
            if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
                raise ValueError(raw)
            return tuple(i.strip() for i in items if i.strip())
        if isinstance(default, int | float) and isinstance(raw, bool):
            raise ValueError(raw)
        return type(default)(raw)
    except (TypeError, ValueError):
        raise error(f"setting {name}: {raw!r} is not a valid {type(default).__name__}") from None


def read_config_file(path: Path, error: ErrorFactory) -> dict[str, Any]:
    """A YAML mapping of setting names (`-` or `_`) to values."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise error(f"config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"config file {path}: not UTF-8 text") from None
    except YAML_ERRORS as exc:
        raise error(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"config file {path} must hold a mapping of setting names to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def layered_values(
    settings_class: type[Any],
    *,
    flags: Mapping[str, Any] | None,
    environ: Mapping[str, str],
    config_file: Path | None,
    env_prefix: str,
    config_env: str,
    aliases: Mapping[str, str],
    error: ErrorFactory,
) -> dict[str, Any]:
    """The constructor arguments of `settings_class`: the config file (`config_file`, else `$<config_env>`),
    then `<env_prefix><NAME>` variables, then `aliases` (setting -> variable, used when its prefixed variable
    is absent), then the flags that were given (not None). Unknown names are an error."""
    known = {f.name: f.default for f in dataclasses.fields(settings_class)}
    if config_file is None and environ.get(config_env):
        config_file = Path(environ[config_env])
    layers = [read_config_file(config_file, error)] if config_file else []
    env_layer = {
        name: environ[env_prefix + name.upper()] for name in known if env_prefix + name.upper() in environ
    }
    for name, variable in aliases.items():
        if name not in env_layer and environ.get(variable):
            env_layer[name] = environ[variable]
    layers.append(env_layer)
    layers.append({k: v for k, v in (flags or {}).items() if v is not None})
    values: dict[str, Any] = {}
    for layer in layers:
        unknown = sorted(set(layer) - set(known))
        if unknown:
            raise error(f"unknown setting(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values.update({k: coerce(k, v, known[k], error) for k, v in layer.items()})
    return values


def as_plain_dict(settings: Any) -> dict[str, Any]:
    """The settings as JSON-ready values (paths as strings, tuples as lists)."""

    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        return list(value) if isinstance(value, tuple) else value

    return {k: plain(v) for k, v in dataclasses.asdict(settings).items()}


def dump(settings: Any) -> str:
    return json.dumps(as_plain_dict(settings), indent=2, sort_keys=True)
