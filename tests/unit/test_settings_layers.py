from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rmd_api.settings_layers import as_plain_dict, layered_values


class Bad(ValueError):
    pass


@dataclass(frozen=True)
class Example:
    name: str = ""
    path: Path = Path("/")
    enabled: bool = False
    seconds: float = 1.0
    items: tuple[str, ...] = field(default=())


def values(tmp_path: Path, file_text: str = "", **kwargs: object) -> dict[str, object]:
    config = None
    if file_text:
        config = tmp_path / "c.yaml"
        config.write_text(file_text)
    options: dict[str, object] = {"flags": None, "environ": {}, "aliases": {}, "config_file": config}
    options.update(kwargs)
    return layered_values(Example, env_prefix="X_", config_env="X_CONFIG", error=Bad, **options)  # type: ignore[arg-type]


def test_flags_beat_variables_beat_aliases_beat_the_file(tmp_path: Path) -> None:
    got = values(
        tmp_path,
        "name: file\nseconds: 3\nitems: [a, b]\n",
        environ={"X_NAME": "env", "ALIAS": "alias", "X_ENABLED": "yes"},
        aliases={"name": "ALIAS", "path": "ALIAS"},
        flags={"seconds": "5", "name": None},
    )
    assert got == {"name": "env", "path": Path("alias"), "enabled": True, "seconds": 5.0, "items": ("a", "b")}


@pytest.mark.parametrize(
    ("text", "message"),
    [("enabled: 1\n", "not a valid bool"), ("seconds: true\n", "not a valid float"), ("nme: x\n", "unknown")],
)
def test_the_file_is_typed_strictly(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(Bad, match=message):
        values(tmp_path, text)


def test_plain_dict_is_json_ready() -> None:
    assert as_plain_dict(Example(items=("a",))) == {
        "name": "",
        "path": "/",
        "enabled": False,
        "seconds": 1.0,
        "items": ["a"],
    }
