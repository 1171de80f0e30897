"""The operator's errors. Handlers map them to kopf's: RetryLater becomes kopf.TemporaryError (its delay)."""

from __future__ import annotations


class OperatorError(Exception):
    """Base of the operator's own errors."""


class ConfigError(OperatorError, ValueError):
    """Settings the operator cannot run with (bad value, unreadable certificate); the message says which."""


class SpecError(OperatorError, ValueError):
    """An RmdWorkload spec the operator cannot turn into a request (the CRD's validation normally stops
    these at the API server; this is the defence for objects stored before a stricter schema)."""


class RetryLater(OperatorError):
    """Work that could not finish now (e.g. an agent unreachable while a workload is being deleted)."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay
