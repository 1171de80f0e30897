"""Write docs/configuration.md from the settings objects, so the reference cannot drift from the code.

    python tools/gen_config_doc.py            rewrite docs/configuration.md
    python tools/gen_config_doc.py --check    exit 1 if docs/configuration.md is out of date

Each settings object is a dataclass whose fields carry their help text in `metadata["help"]`; a field's
flag is `--<name-with-dashes>` and its environment variable `<PREFIX><NAME>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

# (program, module, class, environment prefix, one-line description)
SETTINGS = [
    ("rmd-agent", "rmd_agent.settings", "AgentSettings", "RMD_", "the node agent (`probe` and `serve`)"),
    ("rmd-operator", "rmd_operator.settings", "OperatorSettings", "RMD_OPERATOR_", "the operator"),
]

HEADER = """# Configuration reference

Generated from the settings objects by `python tools/gen_config_doc.py`; do not edit by hand (CI checks
it). Each program has one settings object. Precedence: command-line flags > environment variables >
config file (YAML, keys are the setting names) > defaults. `--print-config` prints the effective
settings. Lists take a YAML list in the file and a comma-separated string in a flag or variable.
"""


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "(required)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | list | frozenset):
        return f"`{','.join(map(str, value))}`" if value else "(none)"
    return f"`{value}`" if str(value) else "(empty)"


def _section(program: str, module: str, cls: str, prefix: str, about: str) -> str:
    settings = getattr(importlib.import_module(module), cls)
    lines = [
        f"## {program}",
        "",
        f"`{module}.{cls}`: {about}.",
        "",
        "| setting | flag | variable | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for field in dataclasses.fields(settings):
        flag, variable = "--" + field.name.replace("_", "-"), prefix + field.name.upper()
        meaning = " ".join(str(field.metadata.get("help", "")).split()).replace("|", "\\|")
        lines.append(f"| `{field.name}` | `{flag}` | `{variable}` | {_default(field)} | {meaning} |")
    return "\n".join(lines)


def render() -> str:
    return "\n\n".join([HEADER.rstrip(), *(_section(*entry) for entry in SETTINGS)]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only report drift")
    text = render()
    if parser.parse_args().check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is out of date: run python tools/gen_config_doc.py", file=sys.stderr)
            return 1
        print(f"{DOC.name} up to date")
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
