"""The mount table (/proc/self/mountinfo), read the same way wherever the simulator needs it."""

from __future__ import annotations

import re
from pathlib import Path


def _unescape(field: str) -> str:
    """/proc mount tables escape space, tab, newline and backslash as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def mount_points() -> list[str]:
    """Every mount point now, in table order (a path mounted twice appears twice); OSError if unreadable."""
    table = Path("/proc/self/mountinfo").read_text()
    return [
        _unescape(fields[4]) for fields in (line.split() for line in table.splitlines()) if len(fields) > 4
    ]
