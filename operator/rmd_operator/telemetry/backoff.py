"""Retry timing (pure; the caller supplies the clock and the random draw).

Two levels. Inside one fetch, a transient failure (connection refused, timeout, 5xx) is retried after
`initial`, 2x, 4x ... as long as the fetch's deadline leaves room: a BMC that drops one request still gives a
value this interval. Between fetches, a source that keeps failing waits longer: interval, 2x, up to
`cap_factor` x interval, so a dead BMC is asked at most every few intervals and recovery is still seen soon.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

RETRY_INITIAL: Final = 0.2
RETRY_MAX: Final = 2.0
CAP_FACTOR: Final = 4.0
JITTER: Final = 0.2  # +-20 %: runners that failed together do not retry in step


def jittered(delay: float, draw: float) -> float:
    """`delay` scaled by a uniform draw in [0, 1) to within +-JITTER."""
    return delay * (1.0 + JITTER * (2.0 * draw - 1.0))


def retry_delays(initial: float = RETRY_INITIAL, maximum: float = RETRY_MAX) -> Iterator[float]:
    """Delays between attempts inside one fetch: initial, doubling, capped at `maximum` (without end)."""
    delay = initial
    while True:
        yield delay
        delay = min(delay * 2.0, maximum)


def fits(delay: float, now: float, deadline: float, min_attempt: float = 0.05) -> bool:
    """Whether waiting `delay` still leaves `min_attempt` seconds for another attempt before `deadline`."""
    return now + delay + min_attempt < deadline


def next_fetch_delay(interval: float, failures: int, cap_factor: float = CAP_FACTOR) -> float:
    """Wait before the next fetch after `failures` failed fetches in a row (0: the plain interval)."""
    if failures <= 0:
        return interval
    return min(interval * 2.0 ** min(failures - 1, 30), interval * cap_factor)
