"""The report: a table for people, JSON for tools (docs/validate.md, "Output")."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from datetime import datetime

from rmd_operator.validate.findings import Finding, Severity, counts, exit_status

CLUSTER = "(cluster)"
_SHOWN = {Severity.OK: "ok", Severity.INFO: "info", Severity.WARNING: "WARNING", Severity.ERROR: "ERROR"}


def as_json(findings: Sequence[Finding], namespace: str, now: datetime, quiet: bool = False) -> str:
    """Every finding (only warnings and errors when `quiet`); exitStatus and summary count them all."""
    return json.dumps(
        {
            "namespace": namespace,
            "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "exitStatus": exit_status(findings),
            "summary": counts(findings),
            "findings": [f.as_dict() for f in shown(findings, quiet)],
        },
        indent=2,
    )


def shown(findings: Sequence[Finding], quiet: bool) -> list[Finding]:
    return [f for f in findings if not quiet or f.severity.rank >= Severity.WARNING.rank]


def as_table(
    findings: Sequence[Finding], namespace: str, now: datetime, width: int = 120, quiet: bool = False
) -> str:
    """One row per finding (NODE, CHECK, SEVERITY, FINDING), the fix below it, wrapped to `width`; with
    `quiet` only warnings and errors, and nothing at all when there are none. The summary counts all."""
    rows = [(f.node or CLUSTER, f.check, _SHOWN[f.severity], f) for f in shown(findings, quiet)]
    if quiet and not rows:
        return ""
    node_w = max([len("NODE"), *(len(r[0]) for r in rows)])
    check_w = max([len("CHECK"), *(len(r[1]) for r in rows)])
    sev_w = max(len("SEVERITY"), *(len(s) for s in _SHOWN.values()))
    indent = " " * (node_w + check_w + sev_w + 6)
    text_w = max(40, width - len(indent))
    lines = [
        f"rmdctl validate: release namespace {namespace}, at {now:%Y-%m-%dT%H:%M:%SZ}",
        f"{'NODE':<{node_w}}  {'CHECK':<{check_w}}  {'SEVERITY':<{sev_w}}  FINDING",
    ]
    for node, check, severity, finding in rows:
        message = textwrap.wrap(finding.message, text_w, break_on_hyphens=False) or [""]
        lines.append(f"{node:<{node_w}}  {check:<{check_w}}  {severity:<{sev_w}}  {message[0]}")
        lines += [indent + line for line in message[1:]]
        if finding.fix and finding.severity is not Severity.OK:
            fix = textwrap.wrap(f"fix: {finding.fix}", text_w, break_on_hyphens=False)
            lines += [indent + line for line in fix]
    summary = counts(findings)
    lines.append(
        f"{summary['error']} error(s), {summary['warning']} warning(s), {summary['info']} info, "
        f"{summary['ok']} ok"
    )
    return "\n".join(lines)
