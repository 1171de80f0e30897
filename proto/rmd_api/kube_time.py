"""Kubernetes `Time` (metav1.Time: RFC 3339 in UTC, whole seconds), as conditions' lastTransitionTime and
lastUpdateTime carry it: the one spelling the agent and the operator write."""

from __future__ import annotations

from datetime import UTC, datetime


def format_time(moment: datetime) -> str:
    """`moment` as a Kubernetes Time: 2026-11-25T21:00:00Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_time() -> str:
    """The current time as a Kubernetes Time."""
    return format_time(datetime.now(UTC))


def now_micro_time() -> str:
    """The current time as a Kubernetes MicroTime (microseconds), for values that must differ every time."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
