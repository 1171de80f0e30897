"""The subset of go-spew `%#v` that `k8s.io/utils/dump.ForHash` prints for the checkpoint structs: Go values
as Python data (`GoValue`) and their dump, byte for byte."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True)
class GoPtr:
    """A non-nil Go pointer. A nil pointer, like a nil map or slice, is None."""

    target: GoValue


@dataclass(frozen=True)
class GoStruct:
    """A Go struct value: fields in declaration order as (name, type as reflect prints it, value)."""

    fields: tuple[tuple[str, str, GoValue], ...] = ()


# A Go value as go-spew sees it: strings and integers (any width), pointers, structs, maps (keys str or
# int), slices (tuples), and None for nil maps, slices and pointers.
GoValue: TypeAlias = (
    str
    | int
    | GoPtr
    | GoStruct
    | Mapping[str, "GoValue"]
    | Mapping[int, "GoValue"]
    | tuple["GoValue", ...]
    | None
)


def go_dump_for_hash(value: GoValue, go_type: str) -> str:
    """What `dump.ForHash` prints for `value` whose static Go type is `go_type` (e.g. "*state.X").

    go-spew `%#v` with SortKeys and DisableMethods prints the type in parentheses for top-level values
    and struct fields, but not for map keys, map values or slice elements. In those positions a
    non-nil pointer prints as `<*>`. Strings print unquoted, nil prints as `<nil>` and maps print sorted.
    """
    out: list[str] = []
    _dump(value, go_type, out)
    return "".join(out)


def _dump(value: GoValue, go_type: str | None, out: list[str]) -> None:
    if isinstance(value, GoPtr):
        out.append(f"({go_type})" if go_type is not None else "<*>")
        _dump(value.target, None, out)
        return
    if go_type is not None:
        out.append(f"({go_type})")
    if value is None:
        out.append("<nil>")
    elif isinstance(value, bool):
        raise TypeError("Go booleans are not part of any checkpoint struct")
    elif isinstance(value, str | int):
        out.append(str(value))
    elif isinstance(value, GoStruct):
        out.append("{")
        for i, (name, field_type, field_value) in enumerate(value.fields):
            out.append(f" {name}:" if i else f"{name}:")
            _dump(field_value, field_type, out)
        out.append("}")
    elif isinstance(value, tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(" ")
            _dump(item, None, out)
        out.append("]")
    else:
        # Python orders str by code point, which is the UTF-8 byte order Go's string comparison uses.
        out.append("map[")
        for i, key in enumerate(sorted(value)):
            if i:
                out.append(" ")
            out.append(str(key))
            out.append(":")
            _dump(value[key], None, out)  # type: ignore[index]
        out.append("]")
