"""The agent's error hierarchy. gRPC status codes and probe output are derived from these classes."""

from __future__ import annotations

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
