"""The agent's error hierarchy. gRPC status codes and probe output are derived from these classes."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Unsupported:
    """A feature the host lacks, with the reason a person can act on."""

    reason: str

    def __str__(self) -> str:
        return f"unsupported: {self.reason}"


class AgentError(Exception):
    """Base class of every error the agent raises on purpose."""


class ConfigError(AgentError, ValueError):
    """Bad settings: a flag, environment variable or config file value."""


class HostReadError(AgentError, OSError):
    """A host file that is missing, unreadable or malformed. `reason` is a short human explanation."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class CheckpointError(AgentError, ValueError):
    """A kubelet checkpoint file that cannot be trusted (bad JSON, unknown format, checksum mismatch)."""


class KubeletUnavailable(AgentError):
    """The kubelet PodResources socket cannot be reached or did not answer in time."""


class KubeApiError(AgentError):
    """A Kubernetes API request that failed: the API server's answer, with its HTTP `status`, `reason` phrase
    and `body` (a Status object as JSON, usually). Status 0 is a request that got no answer
    (KubeConnectionError). str() is "409 Conflict: <the Status message>"."""

    def __init__(self, status: int = 0, reason: str = "", body: str | None = None) -> None:
        self.status = status
        self.reason = reason
        self.body = body
        super().__init__(_describe(status, reason, body))


class KubeConnectionError(KubeApiError):
    """No answer from the API server: refused, unreachable, a TLS failure or a timeout (status 0)."""

    def __init__(self, reason: str) -> None:
        super().__init__(0, reason)


def _describe(status: int, reason: str, body: str | None) -> str:
    if not status:
        return reason
    message = None
    try:
        found = json.loads(body or "")
    except ValueError:
        found = None
    if isinstance(found, dict) and isinstance(found.get("message"), str):
        message = found["message"]
    return f"{status} {reason}" + (f": {message}" if message else "")
