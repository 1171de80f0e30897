"""`rmd-agent` command line. Subcommands: probe (report what the node supports) and serve (run the agent)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from rmd_agent.errors import AgentError, ConfigError
from rmd_agent.settings import AgentSettings, dump_settings, load_settings


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host-root", type=Path, help="root of the host tree to inspect (default /)")
    parser.add_argument("--node-name", help="this node's name (default: $NODE_NAME)")
    _add_config(parser)


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML settings file (default: $RMD_CONFIG)")
    parser.add_argument("--print-config", action="store_true", help="print the effective settings and exit")


def _add_every_setting(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, named after it (--grpc-listen). Values stay strings here and are parsed by
    load_settings, like environment values, so every layer gets the same checks and messages."""
    for f in fields(AgentSettings):
        flag = "--" + f.name.replace("_", "-")
        doc = f.metadata.get("help", "")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=doc)
        else:
            parser.add_argument(flag, metavar=f.name.upper(), help=f"{doc} (default: {_shown(f.default)})")
    _add_config(parser)


def _shown(default: object) -> str:
    if isinstance(default, tuple):
        return ",".join(default) or "none"
    return str(default) if default != "" else "empty"


def _settings(args: argparse.Namespace) -> AgentSettings:
    names = {f.name for f in fields(AgentSettings)}
    flags = {k: v for k, v in vars(args).items() if k in names}
    return load_settings(flags, os.environ, args.config)


def _probe(args: argparse.Namespace, settings: AgentSettings) -> int:
    from rmd_agent.probe import format_table, probe

    report = probe(settings)
    print(json.dumps(report.as_dict(), indent=2) if args.json else format_table(report))
    return 0


def _serve(settings: AgentSettings) -> int:
    from rmd_agent.logsetup import configure_logging
    from rmd_agent.server.app import serve

    configure_logging(settings.log_format, settings.log_level)
    try:
        asyncio.run(serve(settings))
    except ConfigError:
        raise
    except AgentError as exc:  # e.g. the engine could not start on this node
        logging.getLogger(__name__).error("rmd-agent serve: %s", exc)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rmd-agent", description="RMD node agent")
    sub = parser.add_subparsers(dest="command", required=True)
    probe_parser = sub.add_parser("probe", help="report what this node supports, and why not")
    _add_common(probe_parser)
    probe_parser.add_argument(
        "--json", action="store_true", help="machine-readable output (see docs/probe.md)"
    )
    serve_parser = sub.add_parser(
        "serve",
        help="run the agent: gRPC API (mTLS), health and metrics (see docs/agent.md)",
        description="Run the node agent. Every setting is also read from $RMD_<NAME> and the --config file; "
        "flags win over the environment, which wins over the file.",
    )
    _add_every_setting(serve_parser)
    args = parser.parse_args(argv)
    try:
        settings = _settings(args)
        if args.print_config:
            print(dump_settings(settings))
            return 0
        if args.command == "serve":
            return _serve(settings)
    except ConfigError as exc:
        print(f"rmd-agent: {exc}", file=sys.stderr)
        return 2
    return _probe(args, settings)


if __name__ == "__main__":
    sys.exit(main())
