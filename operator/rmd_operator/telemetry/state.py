"""What is known of one source (pure): its last value and when it was taken, the last error, the error
counts, and the conditions derived from them at a given time.

A value is served while it is younger than the TTL; older, it is *stale*: no longer exported as a metric
(a dead BMC must not look like a steady temperature) but kept in the status with its time and a Stale
condition, and its age still exported. The TTL is `ttl_intervals` fetch intervals (default 4: WAO's metrics
adapter keeps values 60 s, four of its default 15 s intervals).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from rmd_operator.telemetry.errors import CollectError

AVAILABLE: Final = "Available"
STALE: Final = "Stale"
ERROR: Final = "Error"
FETCHED: Final = "Fetched"
NO_VALUE: Final = "NoValue"
EXPIRED: Final = "Expired"
DEFAULT_TTL_INTERVALS: Final = 4.0


@dataclass(frozen=True)
class Condition:
    type: str  # Available, Stale, Error
    status: bool
    reason: str
    message: str = ""
    since: float | None = None  # wall-clock time `status` last changed (lastTransitionTime)


@dataclass(frozen=True)
class Transition:
    """A change worth an Event: entering an error, recovering, a value going stale."""

    kind: str  # "Normal" or "Warning"
    reason: str  # e.g. Unreachable, Recovered, Stale
    message: str


@dataclass
class SourceState:
    ttl: float
    value: float | None = None
    value_time: float | None = None  # wall-clock seconds of the fetch that gave `value`
    error: CollectError | None = None
    error_time: float | None = None
    failures: int = 0  # fetches failed in a row
    errors_total: Counter[str] = field(default_factory=Counter)
    detail: str = ""  # what the last success used, e.g. the Redfish path found ("DMTF Thermal ...")
    _stale_reported: bool = False
    _since: dict[str, tuple[bool, float]] = field(default_factory=dict)

    def age(self, now: float) -> float | None:
        return None if self.value_time is None else max(0.0, now - self.value_time)

    def fresh(self, now: float) -> bool:
        age = self.age(now)
        return age is not None and age <= self.ttl

    def succeeded(self, value: float, now: float, detail: str = "") -> Transition | None:
        recovered = self.error is not None or self._stale_reported
        previous = self.error
        self.value, self.value_time, self.detail = value, now, detail or self.detail
        self.error, self.error_time, self.failures, self._stale_reported = None, None, 0, False
        if recovered:
            was = f" after {previous.reason}" if previous else ""
            return Transition("Normal", "Recovered", f"fetching again{was}: {value:g}")
        return None

    def failed(self, error: CollectError, now: float) -> Transition | None:
        """Record a failed fetch; a Transition when the reason is new (retries of the same trouble: none)."""
        self.errors_total[error.reason] += 1
        self.failures += 1
        changed = self.error is None or self.error.reason != error.reason
        self.error, self.error_time = error, now
        return Transition("Warning", error.reason, error.message) if changed else None

    def check_stale(self, now: float) -> Transition | None:
        """The Stale transition, once, when a value outlives the TTL without a newer one."""
        if self.value_time is None or self.fresh(now) or self._stale_reported:
            return None
        self._stale_reported = True
        return Transition("Warning", STALE, self._stale_message(now))

    def _stale_message(self, now: float) -> str:
        age = self.age(now) or 0.0
        return f"last value {self.value:g} is {age:.0f}s old (TTL {self.ttl:g}s): not served"

    def conditions(self, now: float) -> tuple[Condition, ...]:
        """Available, Stale and Error at `now`, each with the time its status last changed."""
        out = []
        for condition in self._derive(now):
            seen = self._since.get(condition.type)
            if seen is None or seen[0] != condition.status:
                seen = self._since[condition.type] = (condition.status, now)
            out.append(
                Condition(condition.type, condition.status, condition.reason, condition.message, seen[1])
            )
        return tuple(out)

    def _derive(self, now: float) -> tuple[Condition, ...]:
        fresh = self.fresh(now)
        if fresh:
            where = f" ({self.detail})" if self.detail else ""
            available = Condition(AVAILABLE, True, FETCHED, f"{self.value:g}{where}")
        elif self.error is not None:
            available = Condition(AVAILABLE, False, self.error.reason, self.error.message)
        elif self.value_time is None:
            available = Condition(AVAILABLE, False, NO_VALUE, "no value fetched yet")
        else:
            available = Condition(AVAILABLE, False, EXPIRED, self._stale_message(now))
        stale = (
            Condition(STALE, True, EXPIRED, self._stale_message(now))
            if self.value_time is not None and not fresh
            else Condition(STALE, False, FETCHED if fresh else NO_VALUE)
        )
        error = (
            Condition(ERROR, True, self.error.reason, self.error.message)
            if self.error is not None
            else Condition(ERROR, False, FETCHED if self.value_time is not None else NO_VALUE)
        )
        return (available, stale, error)
