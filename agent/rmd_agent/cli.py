"""`rmd-agent` command line. Subcommands: probe (serve comes with the enforcement work)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rmd_agent.errors import ConfigError
from rmd_agent.settings import AgentSettings, dump_settings, load_settings


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host-root", type=Path, help="root of the host tree to inspect (default /)")
    parser.add_argument("--node-name", help="this node's name (default: $NODE_NAME)")
    parser.add_argument("--config", type=Path, help="YAML settings file (default: $RMD_CONFIG)")
    parser.add_argument("--print-config", action="store_true", help="print the effective settings and exit")


def _settings(args: argparse.Namespace) -> AgentSettings:
    flags = {"host_root": args.host_root, "node_name": args.node_name}
    return load_settings(flags, os.environ, args.config)


def _probe(args: argparse.Namespace, settings: AgentSettings) -> int:
    from rmd_agent.probe import format_table, probe

    report = probe(settings)
    print(json.dumps(report.as_dict(), indent=2) if args.json else format_table(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rmd-agent", description="RMD node agent")
    sub = parser.add_subparsers(dest="command", required=True)
    probe_parser = sub.add_parser("probe", help="report what this node supports, and why not")
    _add_common(probe_parser)
    probe_parser.add_argument(
        "--json", action="store_true", help="machine-readable output (see docs/probe.md)"
    )
    args = parser.parse_args(argv)
    try:
        settings = _settings(args)
    except ConfigError as exc:
        print(f"rmd-agent: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_settings(settings))
        return 0
    return _probe(args, settings)


if __name__ == "__main__":
    sys.exit(main())
