"""`rmdctl`: for people and tools that look at an RMD installation from outside, like kubectl.

    rmdctl validate [-n NAMESPACE] [--kubeconfig FILE] [--context NAME] [--json] [-q]
                    [--scheduler-name NAME] [--scheduler-namespace NAMESPACE ...] [--skip CHECK ...]
                    [--no-certificates] [--timeout SECONDS]

Exit status (docs/validate.md): 0 nothing worse than info, 1 warnings, 2 errors, 3 could not validate.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from typing import NoReturn

from rmd_operator.validate.checks import validate
from rmd_operator.validate.collect import CannotValidate, Options, api_client, collect
from rmd_operator.validate.findings import EXIT_CANNOT_VALIDATE, exit_status
from rmd_operator.validate.report import as_json, as_table

DEFAULT_NAMESPACE = "rmd-system"  # where docs/install.md installs the chart


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Bad arguments exit with 3, "could not validate": 1 and 2 mean findings."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_CANNOT_VALIDATE, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="rmdctl", description="Look at an RMD installation from outside the cluster.")
    commands = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    cmd = commands.add_parser(
        "validate",
        help="report what keeps RMD from working, per node and for the cluster",
        description="Read the cluster (read-only) and report, per node and for the cluster, every check "
        "with its severity and what to do (docs/validate.md). Exit status: 0 nothing worse than info, "
        "1 warnings, 2 errors, 3 could not validate.",
    )
    cmd.add_argument(
        "-n", "--namespace", default=DEFAULT_NAMESPACE, help="the release namespace (default: %(default)s)"
    )
    cmd.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    cmd.add_argument("--context", help="kubeconfig context (default: the current one)")
    cmd.add_argument("--json", action="store_true", help="print JSON for tools instead of the table")
    cmd.add_argument(
        "-q", "--quiet", action="store_true", help="only warnings and errors (nothing when healthy)"
    )
    cmd.add_argument(
        "--scheduler-name",
        help="the NUMA-aware scheduler profile expected (its schedulerName); missing is then an error. "
        "Default: any profile enabling NodeResourceTopologyMatch, and none is only reported",
    )
    cmd.add_argument(
        "--scheduler-namespace",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="also look here for the scheduler's configuration and Deployment (repeatable; the release "
        "namespace always counts)",
    )
    cmd.add_argument(
        "--skip", action="append", default=[], metavar="CHECK", help="leave out a check (repeatable)"
    )
    cmd.add_argument(
        "--no-certificates",
        action="store_true",
        help="do not connect to the agents to read their certificates",
    )
    cmd.add_argument(
        "--timeout", type=float, default=5.0, help="seconds per request and handshake (default: 5)"
    )
    return top


def run_validate(args: argparse.Namespace) -> int:
    options = Options(
        namespace=args.namespace,
        scheduler_name=args.scheduler_name,
        scheduler_namespaces=tuple(args.scheduler_namespace),
        certificates=not args.no_certificates,
        timeout=args.timeout,
    )
    try:
        api = api_client(args.kubeconfig, args.context)
        with api:
            snapshot = collect(api, options)
    except CannotValidate as exc:
        print(f"rmdctl validate: cannot validate: {exc}", file=sys.stderr)
        return EXIT_CANNOT_VALIDATE
    findings = validate(snapshot, frozenset(args.skip))
    if args.json:
        print(as_json(findings, snapshot.namespace, snapshot.now, args.quiet))
    else:
        width = shutil.get_terminal_size((120, 24)).columns
        table = as_table(findings, snapshot.namespace, snapshot.now, width, args.quiet)
        if table:
            print(table)
    return exit_status(findings)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_validate(args)  # the only command


if __name__ == "__main__":
    sys.exit(main())
