"""`python -m rmd_sim`: simulated nodes, their kubelets, the test control plane and the demo.

Each subcommand is one `add_<name>` function that registers its parser and sets `run`; add a new one to
`COMMANDS`. `run` takes the parsed arguments and returns the exit status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rmd_sim.control_plane import add_control_plane_command
from rmd_sim.demo import add_demo
from rmd_sim.hosttree import summary, write_host_tree
from rmd_sim.kubelet_cli import add_kubelet_command
from rmd_sim.resctrl import check_resctrl_tree
from rmd_sim.resctrl_fuse import add_resctrl_mount_command
from rmd_sim.spec import SpecError, load_spec

Subparsers = Any  # argparse's _SubParsersAction is private; its add_parser is all a command needs


def _run_node(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.spec)
        write_host_tree(spec, args.out, replace=args.force)
    except (SpecError, FileExistsError) as exc:
        print(f"rmd_sim node: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {summary(spec)}")
    return 0


def add_node(sub: Subparsers) -> None:
    p = sub.add_parser("node", help="write a simulated node's host tree (sysfs, procfs, kubelet config)")
    p.add_argument("--out", type=Path, required=True, help="directory to create (absent or empty)")
    p.add_argument("--spec", default="default", help="default, large, or a YAML/JSON file of overrides")
    p.add_argument("--force", action="store_true", help="replace an existing simulated tree at --out")
    p.set_defaults(run=_run_node)


def _run_check(args: argparse.Namespace) -> int:
    violations = check_resctrl_tree(args.dir)
    for violation in violations:
        print(violation)
    if violations:
        print(f"{len(violations)} resctrl rule violation(s) in {args.dir}", file=sys.stderr)
        return 1
    print(f"ok: {args.dir} follows the kernel's resctrl rules")
    return 0


def add_check(sub: Subparsers) -> None:
    p = sub.add_parser(
        "check", help="check a host tree's resctrl against the kernel's rules (exit 1 if broken)"
    )
    p.add_argument("dir", type=Path, help="the host root (the directory holding sys/)")
    p.set_defaults(run=_run_check)


COMMANDS: list[Callable[[Subparsers], None]] = [
    add_node,
    add_check,
    add_kubelet_command,
    add_resctrl_mount_command,
    add_control_plane_command,
    add_demo,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rmd_sim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    status: int = args.run(args)
    return status
