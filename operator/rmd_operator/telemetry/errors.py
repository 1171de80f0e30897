"""Why a fetch failed: one reason per failure, the reason a condition and an Event carry."""

from __future__ import annotations

from typing import Final

UNREACHABLE: Final = "Unreachable"  # connection refused, DNS, timeout: retried with backoff
UNAUTHORIZED: Final = "Unauthorized"  # 401/403: the Secret's username/password do not work
TLS_ERROR: Final = "TLSError"  # the server's certificate is not trusted (or the handshake failed)
BAD_RESPONSE: Final = "BadResponse"  # an answer we cannot use: other HTTP status, not JSON, no value in it
INVALID_CONFIG: Final = "InvalidConfig"  # no endpoint, a Secret or key missing: needs a user's change
INPUTS_UNAVAILABLE: Final = "InputsUnavailable"  # the predictor lacks a fresh input (CPU, inlet temp, deltaP)

REASONS: Final = (UNREACHABLE, UNAUTHORIZED, TLS_ERROR, BAD_RESPONSE, INVALID_CONFIG, INPUTS_UNAVAILABLE)
# Worth another attempt within the same fetch: the peer may answer a moment later.
RETRYABLE: Final = frozenset({UNREACHABLE})


class CollectError(Exception):
    """A fetch that gave no value. `retryable` also covers 5xx answers (BadResponse, server busy)."""

    def __init__(self, reason: str, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retryable = reason in RETRYABLE if retryable is None else retryable

    def __repr__(self) -> str:
        return f"CollectError({self.reason!r}, {self.message!r})"
