"""Go's encoding/json as the kubelet uses it for checkpoints: reading JSON into typed values with Go's rules
(`Decoder`), and writing JSON text exactly as Go writes it (`json_string`, `json_object`, ...)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final, TypeVar

from rmd_api.kubelet.checkpoint.errors import CheckpointFormatError

_K = TypeVar("_K", str, int)
_V = TypeVar("_V")

_ATOI = re.compile(r"[+-]?[0-9]+", re.ASCII)
_INT64_MAX: Final = (1 << 63) - 1
UINT64_MAX: Final = (1 << 64) - 1


def go_atoi(text: str) -> int | None:
    """A decimal int64 as Go's strconv parses it (optional sign, ASCII digits only); None if it is not one."""
    # An int64 has at most 19 digits after any leading zeros; checking first keeps int() from refusing a
    # 4300-digit key with its own ValueError.
    if not _ATOI.fullmatch(text) or len(text.lstrip("+-").lstrip("0")) > 19:
        return None
    value = int(text)
    return value if -_INT64_MAX - 1 <= value <= _INT64_MAX else None


class JsonObject:
    """A JSON object kept as its key/value pairs in file order, so duplicates can be refused."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, object]]) -> None:
        self.pairs = pairs


def json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


class Decoder:
    """Typed access to parsed JSON with Go's rules. Every failure is a CheckpointFormatError."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, detail: str) -> CheckpointFormatError:
        return CheckpointFormatError(self.source, detail)

    def parse(self, text: str, what: str) -> object:
        try:
            return json.loads(text, object_pairs_hook=JsonObject, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise self.fail(f"{what} is not valid JSON: {exc}") from None

    def fields(self, value: object, where: str, names: Sequence[str]) -> dict[str, object]:
        """The JSON object's members that fill the struct fields `names` (exact match first, then a
        case-insensitive one, as Go does). Unknown members are ignored."""
        if not isinstance(value, JsonObject):
            raise self.fail(f"{where}: expected a JSON object, found {json_kind(value)}")
        folded = {name.casefold(): name for name in names}
        found: dict[str, object] = {}
        for key, member in value.pairs:
            name = key if key in names else folded.get(key.casefold())
            if name is None:
                continue
            if name in found:
                raise self.fail(f"{where}: field {name!r} appears more than once")
            found[name] = member
        return found

    def string(self, value: object, where: str) -> str:
        if value is None:  # JSON null leaves a Go string at its zero value
            return ""
        if not isinstance(value, str):
            raise self.fail(f"{where}: expected a string, found {json_kind(value)}")
        return value

    def integer(self, value: object, where: str, *, unsigned: bool) -> int:
        if value is None:
            return 0
        # Go refuses 1.0 and 1e3 for integer fields; json.loads gives floats for those, so they fail here.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(f"{where}: expected an integer, found {json_kind(value)}")
        low, high = (0, UINT64_MAX) if unsigned else (-_INT64_MAX - 1, _INT64_MAX)
        if not low <= value <= high:
            kind = "uint64" if unsigned else "int"
            raise self.fail(f"{where}: {value} does not fit a Go {kind}")
        return value

    def int64(self, value: object, where: str) -> int:
        return self.integer(value, where, unsigned=False)

    def uint64(self, value: object, where: str) -> int:
        return self.integer(value, where, unsigned=True)

    def mapping(
        self, value: object, where: str, key: Callable[[str, str], _K], elem: Callable[[object, str], _V]
    ) -> dict[_K, _V] | None:
        """A Go map: None for JSON null (a nil map)."""
        if value is None:
            return None
        if not isinstance(value, JsonObject):
            raise self.fail(f"{where}: expected a JSON object, found {json_kind(value)}")
        result: dict[_K, _V] = {}
        for raw_key, member in value.pairs:
            inner = f"{where}[{raw_key!r}]"
            parsed_key = key(raw_key, inner)
            if parsed_key in result:
                raise self.fail(f"{inner}: key appears more than once")
            result[parsed_key] = elem(member, inner)
        return result

    def string_key(self, key: str, where: str) -> str:
        return key

    def int_key(self, key: str, where: str) -> int:
        parsed = go_atoi(key)  # Go parses integer map keys with strconv.ParseInt(key, 10, 64)
        if parsed is None:
            raise self.fail(f"{where}: map key is not an integer")
        return parsed

    def array(self, value: object, where: str, elem: Callable[[object, str], _V]) -> tuple[_V, ...] | None:
        """A Go slice: None for JSON null (a nil slice)."""
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.fail(f"{where}: expected an array, found {json_kind(value)}")
        return tuple(elem(item, f"{where}[{i}]") for i, item in enumerate(value))


def json_string(text: str) -> str:
    # Go escapes <, > and & (HTML safety) and U+2028/U+2029; otherwise it matches Python's compact output.
    encoded = json.dumps(text, ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        encoded = encoded.replace(char, escape)
    return encoded.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def json_object(members: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{json_string(name)}:{value}" for name, value in members) + "}"


def json_map(items: Mapping[str, str] | Mapping[int, str]) -> str:
    # Go writes map keys sorted by their string form, so NUMA node "10" comes before "2".
    pairs = sorted((str(key), value) for key, value in items.items())
    return json_object(pairs)


def json_ints(values: Iterable[int]) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"
