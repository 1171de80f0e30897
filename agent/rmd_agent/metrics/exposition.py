"""/metrics text: the registry through prometheus_client, plus pre-rendered text from collectors that can
write their own.

prometheus_client formats every sample with label validation and escaping, which at 500 pods is most of a
scrape (issue #14: 40-70 ms CPU for 8,000 power series). A collector whose series are many and whose label
sets repeat scrape after scrape (the power collector) renders its text itself, with cached label strings:
inside `generate()` its `collect()` hands text to `add_text()` and yields no families. Everywhere else
(`generate_latest`, tests, other exporters) it yields its families as usual.
"""

from __future__ import annotations

from contextvars import ContextVar

from prometheus_client import CollectorRegistry, generate_latest

_TEXT: ContextVar[list[bytes] | None] = ContextVar("rmd_metrics_text", default=None)


def generate(registry: CollectorRegistry) -> bytes:
    """The text exposition of `registry`, taking pre-rendered text where a collector offers it."""
    parts: list[bytes] = []
    token = _TEXT.set(parts)
    try:
        body = generate_latest(registry)
    finally:
        _TEXT.reset(token)
    return body + b"".join(parts)


def text_wanted() -> bool:
    """Whether the current collection is a `generate()` that takes pre-rendered text."""
    return _TEXT.get() is not None


def add_text(text: bytes) -> None:
    parts = _TEXT.get()
    if parts is None:
        raise RuntimeError("add_text() outside generate()")
    parts.append(text)
