"""The error every checkpoint decoder raises for a file it cannot trust."""

from __future__ import annotations


class CheckpointFormatError(ValueError):
    """A checkpoint that cannot be trusted: bad JSON, an unexpected shape, a checksum mismatch."""

    def __init__(self, source: str, detail: str) -> None:
        super().__init__(f"{source}: {detail}")
        self.source = source
        self.detail = detail
