#!/usr/bin/env python3
"""Copy the CRD manifests (crds/*.yaml, the source of truth) into the Helm chart (charts/rmd/crds/).

    python tools/sync_chart_crds.py           # make the chart's copies identical (adds, updates, removes)
    python tools/sync_chart_crds.py --check   # exit 1 and list the differences, change nothing (CI)

Helm installs a chart's crds/ on first install only and never upgrades them; docs/install.md says how to
apply them on upgrade. The copies are byte-for-byte identical, so there is nothing to review in them.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "crds"
CHART_CRDS = REPO / "charts" / "rmd" / "crds"


def differences(source: Path = SOURCE, copies: Path = CHART_CRDS) -> list[str]:
    """What differs between the CRDs and the chart's copies, one line per file; empty when in sync."""
    wanted = {p.name: p.read_bytes() for p in sorted(source.glob("*.yaml"))}
    present = {p.name: p.read_bytes() for p in sorted(copies.glob("*.yaml"))} if copies.is_dir() else {}
    problems = [f"missing: {copies / name}" for name in sorted(wanted.keys() - present.keys())]
    changed = [name for name in sorted(wanted) if name in present and present[name] != wanted[name]]
    problems += [f"differs: {copies / name}" for name in changed]
    problems += [f"not in {source}: {copies / name}" for name in sorted(present.keys() - wanted.keys())]
    return problems


def sync(source: Path = SOURCE, copies: Path = CHART_CRDS) -> list[str]:
    """Make `copies` hold exactly source/*.yaml; returns what was changed (as differences() saw it)."""
    changes = differences(source, copies)
    copies.mkdir(parents=True, exist_ok=True)
    for stale in copies.glob("*.yaml"):
        if not (source / stale.name).is_file():
            stale.unlink()
    for crd in source.glob("*.yaml"):
        target = copies / crd.name
        if not target.is_file() or target.read_bytes() != crd.read_bytes():
            shutil.copyfile(crd, target)
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
