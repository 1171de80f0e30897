"""Process-wide logging setup for the agent's long-running commands: text for people, JSON lines for
containers (one object per record, so a log pipeline needs no multi-line parsing of tracebacks)."""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any, TextIO

# LogRecord attributes that are not caller-supplied `extra` fields.
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED})
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


_CHATTY = ("hpack", "h2")


def configure_logging(log_format: str, level: str, stream: TextIO | None = None) -> None:
    """Replace the root logger's handlers with one writing `log_format` ("text" or "json") to stderr."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The HTTP/2 stack under grpclib logs every frame and header at debug: a flood, and no help to a user.
    for name in _CHATTY:
        logging.getLogger(name).setLevel(max(root.level, logging.INFO))
