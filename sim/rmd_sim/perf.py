"""Simulated per-CPU branch counters, the stand-in for hardware perf events on a simulated node.

The agent's FileCounters reads them; the layout, relative to the host root, is

    .rmd-sim/perf/cpuN/branches        cumulative retired branch instructions, decimal + newline
    .rmd-sim/perf/cpuN/branch_misses   cumulative branch misses, decimal + newline

Tests and the demo make load with `advance` (a number of branches at a given miss ratio, so the expected
ratio, 100 * misses / branches, is known in advance) or with `keep_loaded` (the same every tick, until
cancelled). Each file is replaced atomically, so a reader never sees a torn number.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from pathlib import Path

from rmd_sim.spec import read_tree_spec

PERF_DIR = ".rmd-sim/perf"
BRANCHES = "branches"
MISSES = "branch_misses"


def perf_dir(root: Path) -> Path:
    return Path(root) / PERF_DIR


def initial_counts(cpu: int) -> tuple[int, int]:
    """Distinct, non-zero starting counts, so a reader that assumes counters start at 0 is caught."""
    branches = 5_000_000 + cpu * 1_000_003
    return branches, branches // 97


def write_perf_counters(root: Path, cpus: Iterable[int] | None = None) -> list[int]:
    """Create the counter files for `cpus` (default: every CPU of the tree's spec); returns the CPUs."""
    chosen = sorted(set(cpus)) if cpus is not None else list(range(read_tree_spec(root).cpus))
    for cpu in chosen:
        branches, misses = initial_counts(cpu)
        _write(root, cpu, branches, misses)
    return chosen


def read_counts(root: Path, cpu: int) -> tuple[int, int]:
    """(branches, branch_misses) of `cpu`."""
    base = perf_dir(root) / f"cpu{cpu}"
    return int((base / BRANCHES).read_text()), int((base / MISSES).read_text())


def misses_for(branches: int, ratio_pct: float) -> int:
    """Branch misses that give `ratio_pct` misses per 100 branches."""
    if branches < 0 or not 0 <= ratio_pct <= 100:
        raise ValueError(f"need branches >= 0 and 0 <= ratio <= 100, got {branches}, {ratio_pct}")
    return round(branches * ratio_pct / 100)


def advance(root: Path, cpu: int, branches: int, ratio_pct: float) -> tuple[int, int]:
    """Add `branches` branch instructions with `ratio_pct` per cent of them missed; returns the new totals."""
    old_branches, old_misses = read_counts(root, cpu)
    new = old_branches + branches, old_misses + misses_for(branches, ratio_pct)
    # The two files are not replaced as one: a reader between the writes gets one sample slightly off,
    # which the next sample evens out. Neither count ever goes backwards.
    _write(root, cpu, *new)
    return new


def set_counts(root: Path, cpu: int, branches: int, misses: int) -> None:
    """Set the counters outright, e.g. lower than before to simulate a counter reset."""
    _write(root, cpu, branches, misses)


async def keep_loaded(
    root: Path, cpus: Iterable[int], *, branches_per_tick: int, ratio_pct: float, tick_s: float
) -> None:
    """Advance every CPU in `cpus` by the same load each tick until cancelled."""
    chosen = sorted(set(cpus))
    while True:
        for cpu in chosen:
            advance(root, cpu, branches_per_tick, ratio_pct)
        await asyncio.sleep(tick_s)


def _write(root: Path, cpu: int, branches: int, misses: int) -> None:
    base = perf_dir(root) / f"cpu{cpu}"
    base.mkdir(parents=True, exist_ok=True)
    for name, value in ((BRANCHES, branches), (MISSES, misses)):
        tmp = base / f".{name}.tmp"
        tmp.write_text(f"{value}\n")
        os.replace(tmp, base / name)
