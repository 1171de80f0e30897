#!/usr/bin/env python3
"""Copy the CRD manifests (crds/*.yaml, the source of truth) into the Helm chart.

    python tools/sync_chart_crds.py           # make the chart's copies identical (adds, updates, removes)
    python tools/sync_chart_crds.py --check   # exit 1 and list the differences, change nothing (CI)

Two places in the chart:

* charts/rmd/crds/: Helm installs these on first install only, always, and never upgrades them;
  docs/install.md says how to apply them on upgrade.
* charts/rmd/wao-crds/: the CRDs of wao-core's API (group wao.bitmedia.co.jp, OPTIONAL_GROUPS), which a
  cluster running wao-core has already. templates/wao-crds.yaml renders them only with
  nodeTelemetry.installCRDs (Helm's crds/ cannot be left out one by one), so Helm upgrades them and keeps
  them on uninstall.

The copies are byte-for-byte identical, so there is nothing to review in them.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "crds"
CHART = REPO / "charts" / "rmd"
ALWAYS_DIR = "crds"
OPTIONAL_DIR = "wao-crds"
OPTIONAL_GROUPS = ("wao.bitmedia.co.jp",)


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


def differences(source: Path = SOURCE, chart: Path = CHART) -> list[str]:
    """What differs between the CRDs and the chart's copies, one line per file; empty when in sync."""
    wanted, present = _wanted(source), _present(chart)
    problems = [f"missing: {chart / name}" for name in sorted(wanted.keys() - present.keys())]
    changed = [name for name in sorted(wanted) if name in present and present[name] != wanted[name]]
    problems += [f"differs: {chart / name}" for name in changed]
    problems += [f"not in {source}: {chart / name}" for name in sorted(present.keys() - wanted.keys())]
    return problems


def sync(source: Path = SOURCE, chart: Path = CHART) -> list[str]:
    """Make the chart's CRD directories hold exactly source/*.yaml; returns what was changed."""
    changes = differences(source, chart)
    wanted = _wanted(source)
    for name in _present(chart).keys() - wanted.keys():
        (chart / name).unlink()
    for name, content in wanted.items():
        target = chart / name
        if not target.is_file() or target.read_bytes() != content:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / target.name, target)
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
