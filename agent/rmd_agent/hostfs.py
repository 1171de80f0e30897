"""Read-only access to a host filesystem tree rooted anywhere.

Production reads `/`, the chart mounts the host at `/host`, tests point at a simulated tree. No code in the
agent opens `/sys` or `/var/lib/kubelet` by absolute path; it asks a HostFS for a path relative to the root.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from rmd_agent.errors import HostReadError


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "does not exist"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (the agent needs root or the file's capability)"
    if exc.errno == errno.ENOTDIR:
        return "a parent is not a directory"
    return exc.strerror or type(exc).__name__


class HostFS:
    """A host tree. Paths given to its methods are relative to the root ("sys/devices/system/cpu")."""

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"HostFS({str(self.root)!r})"

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def exists(self, rel: str) -> bool:
        return self.path(rel).exists()

    def is_dir(self, rel: str) -> bool:
        return self.path(rel).is_dir()

    def read_text(self, rel: str) -> str:
        """The file's text; HostReadError (with the reason) if it is missing or unreadable."""
        try:
            return self.path(rel).read_text()
        except OSError as exc:
            raise HostReadError(rel, _reason(exc)) from exc
        except UnicodeDecodeError as exc:
            raise HostReadError(rel, "not text") from exc

    def read_str(self, rel: str) -> str:
        """The file's text stripped of surrounding whitespace (sysfs values end in a newline)."""
        return self.read_text(rel).strip()

    def read_int(self, rel: str, base: int = 10) -> int:
        text = self.read_str(rel)
        try:
            return int(text, base)
        except ValueError:
            raise HostReadError(rel, f"expected an integer, found {text[:40]!r}") from None

    def listdir(self, rel: str) -> list[str]:
        """Sorted entry names of a directory; HostReadError if it cannot be listed."""
        try:
            return sorted(os.listdir(self.path(rel)))
        except OSError as exc:
            raise HostReadError(rel, _reason(exc)) from exc


def read_small(path: str) -> bytes:
    """A small kernel file in one read(2): cheaper than a buffered file object, which matters at
    hundreds of files per sample."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)
