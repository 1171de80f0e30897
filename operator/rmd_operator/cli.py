"""`rmd-operator` command line: load the settings, then run kopf on rmd_operator.handlers.

    rmd-operator run [--standalone | --peering NAME [--priority N]] [--<setting> VALUE ...] [--config FILE]
                     [--print-config]

The settings are loaded and activated before kopf imports the handlers module (kopf reads decorator
arguments at import). kopf then runs exactly as `kopf run -m rmd_operator.handlers` would, with the scope,
peering, liveness and logging flags derived from the settings.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import MutableMapping, Sequence
from dataclasses import fields
from pathlib import Path

from rmd_operator.errors import ConfigError
from rmd_operator.settings import OperatorSettings, activate, dump_settings, load_settings

HANDLERS_MODULE = "rmd_operator.handlers"
_KOPF_LOG_FORMATS = {"text": "full", "json": "json"}


def _shown(default: object) -> str:
    if isinstance(default, tuple):
        return ",".join(default) or "none"
    return str(default) if default != "" else "empty"


def _add_every_setting(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, named after it. Values stay strings here and are parsed by load_settings, like
    environment values, so every layer gets the same checks and messages."""
    for f in fields(OperatorSettings):
        flag = "--" + f.name.replace("_", "-")
        doc = f.metadata.get("help", "")
        if f.name == "peering":
            continue  # --peering / --standalone below
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=doc)
        else:
            parser.add_argument(flag, metavar=f.name.upper(), help=f"{doc} (default: {_shown(f.default)})")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--standalone",
        action="store_const",
        const="",
        dest="peering",
        default=None,
        help="run as the only replica, without peering (the default)",
    )
    mode.add_argument(
        "--peering",
        metavar="NAME",
        help="coordinate replicas through kopf peering object NAME (one is active)",
    )
    parser.add_argument("--config", type=Path, help="YAML settings file (default: $RMD_OPERATOR_CONFIG)")
    parser.add_argument("--print-config", action="store_true", help="print the effective settings and exit")


def kopf_arguments(settings: OperatorSettings) -> list[str]:
    """The `kopf run` command line for these settings."""
    args = ["run", "-m", HANDLERS_MODULE, "--log-format", _KOPF_LOG_FORMATS[settings.log_format]]
    if settings.log_level == "debug":
        args.append("--verbose")
    elif settings.log_level in ("warning", "error"):
        args.append("--quiet")
    if settings.peering:
        args += ["--peering", settings.peering, "--priority", str(settings.priority)]
    else:
        args.append("--standalone")
    if settings.liveness_listen:
        args += ["--liveness", f"http://{settings.liveness_listen}/healthz"]
    if settings.namespaces:
        # The agents' RmdNodeStates must be watched too; handlers ignore RmdWorkloads outside `namespaces`.
        for namespace in dict.fromkeys([*settings.namespaces, settings.node_state_namespace]):
            args += ["--namespace", namespace]
    else:
        args.append("--all-namespaces")
    return args


def name_user_for_kopf(environ: MutableMapping[str, str]) -> None:
    """kopf names itself <user>@<host> through getpass.getuser(), which looks the uid up in /etc/passwd when
    LOGNAME and USER are unset, and fails for a uid without an entry (the image's 65532, OpenShift's random
    uids): the operator pod crashed at start on a real node. Name the user when the environment does not."""
    if not environ.get("LOGNAME") and not environ.get("USER"):
        environ["USER"] = "rmd-operator"


def _run(settings: OperatorSettings) -> int:
    import kopf.cli

    from rmd_operator.agent_client import read_tls_material

    if not settings.insecure_agents:
        read_tls_material(settings)  # fail fast (exit 2) on unreadable certificates, before any connection
    activate(settings)
    name_user_for_kopf(os.environ)
    kopf.cli.main.main(args=kopf_arguments(settings), prog_name="rmd-operator", standalone_mode=False)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rmd-operator", description="RMD operator (see docs/operator.md)")
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser(
        "run",
        help="run the operator",
        description="Run the operator. Every setting is also read from $RMD_OPERATOR_<NAME> and the --config "
        "file; flags win over the environment, which wins over the file.",
    )
    _add_every_setting(run_parser)
    args = parser.parse_args(argv)
    names = {f.name for f in fields(OperatorSettings)}
    flags = {k: v for k, v in vars(args).items() if k in names}
    try:
        settings = load_settings(flags, os.environ, args.config)
    except ConfigError as exc:
        print(f"rmd-operator: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_settings(settings))
        return 0
    try:
        return _run(settings)
    except ConfigError as exc:  # e.g. unreadable certificates, found at start
        print(f"rmd-operator: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
