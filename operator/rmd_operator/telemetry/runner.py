"""The loop of one source: fetch every interval (longer while failing), retry transient failures inside the
fetch's deadline, record the outcome, report it. One asyncio task; `stop()` cancels it and closes the
fetcher, so a replaced or deleted NodeConfig leaves no task, thread or connection behind.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rmd_operator.telemetry import backoff
from rmd_operator.telemetry.errors import BAD_RESPONSE, INVALID_CONFIG, CollectError
from rmd_operator.telemetry.fetchers import Fetcher, Reading
from rmd_operator.telemetry.spec import Source
from rmd_operator.telemetry.state import SourceState, Transition

log = logging.getLogger(__name__)

FIRST_FETCH_SPREAD = (
    2.0  # the first fetch waits a random part of min(interval, this): runners started together spread
)


@dataclass(frozen=True)
class Outcome:
    """What one fetch did to a source, for the report callback."""

    key: str
    source: Source
    transition: Transition | None


Report = Callable[[Outcome], Awaitable[None] | None]


class SourceRunner:
    def __init__(
        self,
        key: str,
        source: Source,
        fetcher: Fetcher | None,
        state: SourceState,
        report: Report,
        *,
        wall: Callable[[], float] = time.time,
        draw: Callable[[], float],
    ) -> None:
        self.key, self.source, self.fetcher, self.state = key, source, fetcher, state
        self._report, self._wall, self._draw = report, wall, draw
        self._task: asyncio.Task[None] | None = None
        self.fetches = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"telemetry {self.key} {self.source.kind}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.fetcher is not None:
            try:
                await self.fetcher.close()
            except Exception:
                log.exception("closing the %s collector of %s", self.source.kind, self.key)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _emit(self, transition: Transition | None) -> None:
        try:
            result: Any = self._report(Outcome(self.key, self.source, transition))
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("telemetry report for %s %s failed", self.key, self.source.kind)

    async def _run(self) -> None:
        if self.fetcher is None:  # the spec cannot run: say so once, then wait to be replaced
            error = CollectError(INVALID_CONFIG, self.source.problem or "invalid source")
            await self._emit(self.state.failed(error, self._wall()))
            await asyncio.Event().wait()
        interval = self.source.interval
        await asyncio.sleep(self._draw() * min(interval, FIRST_FETCH_SPREAD))
        while True:
            started = time.monotonic()
            transition = await self.fetch_once(started + interval)
            stale = self.state.check_stale(self._wall())
            await self._emit(transition or stale)
            delay = backoff.next_fetch_delay(interval, self.state.failures)
            await asyncio.sleep(max(0.0, started + delay - time.monotonic()))

    async def fetch_once(self, deadline: float) -> Transition | None:
        """One fetch with retries of transient failures while the deadline allows; the state updated."""
        assert self.fetcher is not None
        self.fetches += 1
        delays = backoff.retry_delays()
        while True:
            try:
                reading: Reading = await self.fetcher.fetch(deadline)
                return self.state.succeeded(reading.value, self._wall(), reading.detail)
            except CollectError as exc:
                error = exc
            except Exception as exc:  # a bug or an unforeseen library error: reported, the loop goes on
                log.exception("telemetry fetch for %s %s", self.key, self.source.kind)
                error = CollectError(BAD_RESPONSE, f"unexpected {type(exc).__name__}: {exc}")
            delay = backoff.jittered(next(delays), self._draw())
            if not error.retryable or not backoff.fits(delay, time.monotonic(), deadline):
                log.debug("telemetry %s %s: %s", self.key, self.source.kind, error)
                return self.state.failed(error, self._wall())
            await asyncio.sleep(delay)
