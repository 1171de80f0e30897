"""A NodeConfig's status.sources and Events from its collectors' snapshots (pure; telemetry-collectors.md).

Each fetch changes a source's `time`, but writing the status after every fetch of every node would make the
API server carry one write per source and interval. So a source's entry is written when anything but its
time changed (value, conditions), and otherwise only once its stored time is older than half the value's TTL:
`kubectl get nodeconfigs` never shows a time more than two intervals behind, and a steady node costs a write
per source every two intervals, not every one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rmd_operator.status import EventText
from rmd_operator.telemetry.manager import SourceSnapshot
from rmd_operator.telemetry.state import Transition

Entry = dict[str, Any]


def _complete(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The entry with `value` and `time` always named: a merge patch keeps every key it leaves out, so a
    source without a value (replaced, or not fetched since a restart) must say null to clear the old one."""
    return {"value": None, "time": None, **entry}


def _without_time(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in _complete(entry).items() if k != "time"}


def sources_patch(
    snapshots: Iterable[SourceSnapshot],
    written: Mapping[str, Mapping[str, Any]],
    wall: float,
    written_at: Mapping[str, float],
) -> dict[str, Entry | None]:
    """The status.sources merge patch that brings `written` (what the status holds, by source) up to the
    snapshots of one NodeConfig; {} when nothing is worth a write. A source that is no longer configured is
    removed (null). `written_at`: when each entry was last written (wall-clock seconds)."""
    patch: dict[str, Entry | None] = {}
    current: dict[str, SourceSnapshot] = {snap.kind: snap for snap in snapshots}
    for kind, snap in current.items():
        entry = _complete(snap.status())
        old = written.get(kind)
        changed = old is None or _without_time(old) != _without_time(entry)
        refresh = old is not None and entry.get("time") != old.get("time")
        if changed or (refresh and wall - written_at.get(kind, 0.0) >= snap.ttl / 2):
            patch[kind] = entry
    for gone in written:
        if gone not in current:
            patch[gone] = None
    return patch


def transition_event(kind: str, transition: Transition) -> EventText:
    """The Event of a source's change: a Warning with the error's reason (or Stale), Normal Recovered."""
    return EventText(transition.kind, transition.reason, f"{kind}: {transition.message}")
