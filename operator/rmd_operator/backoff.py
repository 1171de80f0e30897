"""Retry bookkeeping per node: when an unreachable agent may be tried again. Pure (the caller passes time).

One record per node, shared by every workload on it: if a node's agent is down, all its workloads wait for the
same next attempt instead of each probing it on its own schedule. Delays double from `initial` up to
`maximum`. Several workloads failing against the node at the same moment count as one failure: a failure
reported while the node is already waiting out a delay does not lengthen it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class _Record:
    failures: int
    next_attempt: float


@dataclass
class Backoff:
    initial: float
    maximum: float
    _records: dict[str, _Record] = field(default_factory=dict)

    def due(self, key: str, now: float) -> bool:
        record = self._records.get(key)
        return record is None or now >= record.next_attempt

    def next_attempt(self, key: str) -> float | None:
        """When `key` may be tried again; None when it is not backing off."""
        record = self._records.get(key)
        return None if record is None else record.next_attempt

    def failures(self, key: str) -> int:
        record = self._records.get(key)
        return 0 if record is None else record.failures

    def failed(self, key: str, now: float) -> float:
        """Record a failed attempt; returns the delay until the next one."""
        record = self._records.get(key)
        if record is not None and now < record.next_attempt:
            return record.next_attempt - now  # already counted: a concurrent attempt failed first
        failures = 1 if record is None else record.failures + 1
        delay = min(self.maximum, math.ldexp(self.initial, min(failures - 1, 62)))
        self._records[key] = _Record(failures, now + delay)
        return delay

    def succeeded(self, key: str) -> None:
        self._records.pop(key, None)

    def reset(self, key: str) -> None:
        """Forget the failures (e.g. the agent published a new endpoint or became ready): try at once."""
        self._records.pop(key, None)
