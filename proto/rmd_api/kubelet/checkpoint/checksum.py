"""The kubelet's checkpoint checksum (`checksum.New`): FNV-1a 32 over the go-spew dump of a value; the
checksum fields every checkpoint file has; telling a file's format version by which candidate hash matches
the stored one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

from rmd_api.kubelet.checkpoint.errors import CheckpointFormatError
from rmd_api.kubelet.checkpoint.gojson import Decoder
from rmd_api.kubelet.checkpoint.gospew import GoPtr, GoStruct, go_dump_for_hash

_FNV32_OFFSET: Final = 0x811C9DC5
_FNV32_PRIME: Final = 0x01000193


def fnv1a_32(data: bytes) -> int:
    """FNV-1a with 32-bit state, as Go's `hash/fnv.New32a`."""
    state = _FNV32_OFFSET
    for byte in data:
        state = ((state ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return state


def _utf8(text: str, source: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise CheckpointFormatError(source, "contains a lone UTF-16 surrogate (not valid UTF-8)") from None


def struct_checksum(struct: GoStruct, type_name: str, source: str) -> int:
    """`checksum.New(&s)` for a checkpoint struct of Go type `state.<type_name>`."""
    return fnv1a_32(_utf8(go_dump_for_hash(GoPtr(struct), f"*state.{type_name}"), source))


def string_checksum(data: str, source: str) -> int:
    """`checksum.New(s)` for a Go string, as used for the `data` payload of CPU v4 and memory v3."""
    return fnv1a_32(_utf8(go_dump_for_hash(data, "string"), source))


def verify_checksum(source: str, stored: int, candidates: Sequence[tuple[str, int]]) -> str:
    """The format version whose hash equals the stored checksum. The first candidate is the most likely
    format and is the one named in the error (CheckpointFormatError naming `source`)."""
    for version, computed in candidates:
        if computed == stored:
            return version
    raise CheckpointFormatError(
        source, f"checksum mismatch: file says {stored}, content hashes to {candidates[0][1]}"
    )


class Envelope(NamedTuple):
    """A checkpoint's top level: its members (by struct field name), the struct checksum and, in the newest
    formats, `data` (the payload as a JSON string) with its own checksum."""

    fields: dict[str, object]
    checksum: int
    data: str
    data_checksum: int


def read_envelope(d: Decoder, text: str, names: Sequence[str]) -> Envelope:
    """The top-level object of a checkpoint whose struct has the fields `names`."""
    top = d.fields(d.parse(text, "checkpoint"), "checkpoint", names)
    return Envelope(
        top,
        d.uint64(top.get("checksum"), "checksum"),
        d.string(top.get("data"), "data"),
        d.uint64(top.get("dataChecksum"), "dataChecksum"),
    )
