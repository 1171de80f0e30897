"""configure_logging: the agent's own debug lines are written, the HTTP/2 stack's frame-by-frame ones not."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from rmd_agent.logsetup import configure_logging


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    chatty = {name: logging.getLogger(name).level for name in ("hpack", "h2")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, was in chatty.items():
        logging.getLogger(name).setLevel(was)


@pytest.mark.usefixtures("restored_logging")
def test_debug_level_leaves_out_every_http2_header_and_frame() -> None:
    out = io.StringIO()
    configure_logging("text", "DEBUG", out)
    logging.getLogger("rmd_agent.nrt.exporter").debug("refresh (pods): unchanged")
    logging.getLogger("hpack.hpack").debug("Decoded (b'authorization', b'Bearer secret')")
    logging.getLogger("h2.connection").debug("Process received frame")
    logging.getLogger("hpack.hpack").info("kept at info")
    lines = out.getvalue().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "DEBUG rmd_agent.nrt.exporter: refresh (pods): unchanged",
        "INFO hpack.hpack: kept at info",
    ]
