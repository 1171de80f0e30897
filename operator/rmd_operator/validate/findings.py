"""What a check found: a Finding per node (or for the whole cluster), its severity and what to do."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum


class Severity(Enum):
    OK = "ok"
    INFO = "info"  # worth knowing, nothing is broken
    WARNING = "warning"  # something RMD offers does not work, or will stop working, on this node or cluster
    ERROR = "error"  # RMD is broken here now

    @property
    def rank(self) -> int:
        return _RANKS[self]


_RANKS = {Severity.OK: 0, Severity.INFO: 1, Severity.WARNING: 2, Severity.ERROR: 3}

# Exit statuses of `rmdctl validate` (docs/validate.md): the worst severity found, or that it could not look.
EXIT_OK = 0  # nothing worse than info
EXIT_WARNINGS = 1
EXIT_ERRORS = 2
EXIT_CANNOT_VALIDATE = 3  # no API server, unusable kubeconfig, bad arguments


@dataclass(frozen=True)
class Finding:
    node: str | None  # None: the cluster as a whole
    check: str  # a stable name, documented in docs/validate.md
    severity: Severity
    message: str
    fix: str = ""  # what to do; empty when there is nothing to do

    def as_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "check": self.check,
            "severity": self.severity.value,
            "message": self.message,
            "fix": self.fix,
        }


def ok(node: str | None, check: str, message: str) -> Finding:
    return Finding(node, check, Severity.OK, message)


def info(node: str | None, check: str, message: str, fix: str = "") -> Finding:
    return Finding(node, check, Severity.INFO, message, fix)


def warning(node: str | None, check: str, message: str, fix: str) -> Finding:
    return Finding(node, check, Severity.WARNING, message, fix)


def error(node: str | None, check: str, message: str, fix: str) -> Finding:
    return Finding(node, check, Severity.ERROR, message, fix)


def exit_status(findings: Iterable[Finding]) -> int:
    worst = max((f.severity.rank for f in findings), default=0)
    if worst >= Severity.ERROR.rank:
        return EXIT_ERRORS
    return EXIT_WARNINGS if worst >= Severity.WARNING.rank else EXIT_OK


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    """Findings per severity, every severity present (0 when none)."""
    found = Counter(f.severity for f in findings)
    return {s.value: found[s] for s in Severity}
