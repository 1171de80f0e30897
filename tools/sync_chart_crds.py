#!/usr/bin/env python3
"""Copy the CRD manifests (crds/*.yaml, the source of truth) into the Helm chart, and write what
`rmdctl validate` expects of them (operator/rmd_operator/validate/expected_crds.py).

    python tools/sync_chart_crds.py           # make the copies and the digests match (adds, updates, removes)
    python tools/sync_chart_crds.py --check   # exit 1 and list the differences, change nothing (CI)

Two places in the chart:

* charts/rmd/crds/: Helm installs these on first install only, always, and never upgrades them;
  docs/install.md says how to apply them on upgrade.
* charts/rmd/wao-crds/: the CRDs of wao-core's API (group wao.bitmedia.co.jp, OPTIONAL_GROUPS), which a
  cluster running wao-core has already. templates/wao-crds.yaml renders them only with
  nodeTelemetry.installCRDs (Helm's crds/ cannot be left out one by one), so Helm upgrades them and keeps
  them on uninstall.

The copies are byte-for-byte identical, so there is nothing to review in them. `rmdctl validate` reports an
installed CRD whose schema is not this release's (docs/validate.md); the package carries only their storage
versions and schema digests, so it needs no crds/ at run time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))  # the digest function, whatever the installed package is

from rmd_operator.validate.crd_schema import storage_version, version_digests  # noqa: E402

SOURCE = REPO / "crds"
CHART = REPO / "charts" / "rmd"
ALWAYS_DIR = "crds"
OPTIONAL_DIR = "wao-crds"
OPTIONAL_GROUPS = ("wao.bitmedia.co.jp",)
EXPECTED = REPO / "operator" / "rmd_operator" / "validate" / "expected_crds.py"
_EXPECTED_HEADER = '''"""Generated from crds/*.yaml by tools/sync_chart_crds.py: do not edit (CI checks it).

What `rmdctl validate` expects of each CRD of this release: its storage version and, per served version,
the digest of its schema (rmd_operator.validate.crd_schema.schema_digest)."""

from __future__ import annotations

# CRD name -> (storage version, {served version: schema digest})
EXPECTED_CRDS: dict[str, tuple[str, dict[str, str]]] = {
'''


def expected_crds_module(source: Path = SOURCE) -> str:
    """The text of expected_crds.py for the CRDs in `source`."""
    lines = [_EXPECTED_HEADER]
    for path in sorted(source.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
            continue
        versions = sorted(version_digests(crd).items())
        digests = ", ".join(f"{json.dumps(v)}: {json.dumps(d)}" for v, d in versions)
        name, storage = json.dumps(crd["metadata"]["name"]), json.dumps(storage_version(crd))
        lines.append(f"    {name}: ({storage}, {{{digests}}}),\n")
    lines.append("}\n")
    return "".join(lines)


def destination(crd: str) -> str:
    """The chart directory a CRD file (named <plural>.<group>.yaml) goes to."""
    group = crd.removesuffix(".yaml").partition(".")[2]
    return OPTIONAL_DIR if group in OPTIONAL_GROUPS else ALWAYS_DIR


def _wanted(source: Path) -> dict[str, bytes]:
    """chart-relative path -> content."""
    return {f"{destination(p.name)}/{p.name}": p.read_bytes() for p in sorted(source.glob("*.yaml"))}


def _present(chart: Path) -> dict[str, bytes]:
    return {
        f"{d}/{p.name}": p.read_bytes()
        for d in (ALWAYS_DIR, OPTIONAL_DIR)
        if (chart / d).is_dir()
        for p in sorted((chart / d).glob("*.yaml"))
    }


def differences(source: Path = SOURCE, chart: Path = CHART, expected: Path = EXPECTED) -> list[str]:
    """What differs between the CRDs and the chart's copies and the digests, one line per file; empty when
    in sync."""
    wanted, present = _wanted(source), _present(chart)
    problems = [f"missing: {chart / name}" for name in sorted(wanted.keys() - present.keys())]
    changed = [name for name in sorted(wanted) if name in present and present[name] != wanted[name]]
    problems += [f"differs: {chart / name}" for name in changed]
    problems += [f"not in {source}: {chart / name}" for name in sorted(present.keys() - wanted.keys())]
    if not expected.is_file() or expected.read_text() != expected_crds_module(source):
        problems.append(f"differs: {expected}")
    return problems


def sync(source: Path = SOURCE, chart: Path = CHART, expected: Path = EXPECTED) -> list[str]:
    """Make the chart's CRD directories hold exactly source/*.yaml and `expected` their digests; returns what
    was changed (as differences() saw it)."""
    changes = differences(source, chart, expected)
    wanted = _wanted(source)
    for name in _present(chart).keys() - wanted.keys():
        (chart / name).unlink()
    for name, content in wanted.items():
        target = chart / name
        if not target.is_file() or target.read_bytes() != content:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / target.name, target)
    expected.write_text(expected_crds_module(source))
    return changes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report differences and exit 1; change nothing")
    args = parser.parse_args(argv)
    if args.check:
        problems = differences()
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run: python tools/sync_chart_crds.py", file=sys.stderr)
        return 1 if problems else 0
    for line in sync():
        print(f"updated ({line})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
