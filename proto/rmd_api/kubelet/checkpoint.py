"""The kubelet's CPU and memory manager checkpoint files: JSON layouts and checksum.

The kubelet keeps `cpu_manager_state` and `memory_manager_state` in its root directory as JSON with a
checksum. The checksum is FNV-1a 32 over what go-spew prints for the Go struct with `%#v`
(`k8s.io/utils/dump.ForHash`), with the checksum field set to zero. To verify a checksum in Python we
must print exactly what go-spew would. That output depends on Go-side facts the JSON does not carry: Go
type names, whether a map is nil or empty, and which fields the writing version's struct has. This module
reproduces those rules for the few structs involved. The agent uses it to read the files and the simulated
kubelet uses it to write them (facts: reference/numa-topology-podresources.md §2).

CPU manager formats (`format_version`):
  v1  entries keyed by container runtime ID (kubelets up to 1.17)
  v2  entries podUID -> container -> cpuset (1.18 to 1.35; still the common case)
  v3  v2 plus podEntries podUID -> {"cpuSet"} (1.36 with PodLevelResourceManagers)
  v4  a `data` JSON string with its own checksum, plus a top-level v3 copy with checksum 0 (1.37)
Memory manager formats: v1 (the classic layout), v2 (adds podEntries), v3 (`data` + `dataChecksum`).

Decoding follows Go's encoding/json: keys match struct fields exactly or case-insensitively, unknown keys
are ignored, and JSON null leaves a scalar unchanged but makes a map or slice nil. Decoding is stricter
than Go in two ways: a top-level value that is not an object is refused, and so are duplicate keys (Go
keeps the last one, which would let a file carry two values).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias, TypeVar

from rmd_api.cpuset import format_cpu_list

_K = TypeVar("_K", str, int)
_V = TypeVar("_V")


class CheckpointFormatError(ValueError):
    """A checkpoint that cannot be trusted: bad JSON, an unexpected shape, a checksum mismatch."""

    def __init__(self, source: str, detail: str) -> None:
        super().__init__(f"{source}: {detail}")
        self.source = source
        self.detail = detail


# --- FNV-1a 32 (Go's hash/fnv New32a) ---

_FNV32_OFFSET: Final = 0x811C9DC5
_FNV32_PRIME: Final = 0x01000193


def fnv1a_32(data: bytes) -> int:
    """FNV-1a with 32-bit state, as Go's `hash/fnv.New32a`."""
    state = _FNV32_OFFSET
    for byte in data:
        state = ((state ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return state


# --- the subset of go-spew `%#v` that ForHash needs ---


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


def _utf8(text: str, source: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise CheckpointFormatError(source, "contains a lone UTF-16 surrogate (not valid UTF-8)") from None


def _struct_checksum(struct: GoStruct, type_name: str, source: str) -> int:
    return fnv1a_32(_utf8(go_dump_for_hash(GoPtr(struct), f"*state.{type_name}"), source))


def _string_checksum(data: str, source: str) -> int:
    """`checksum.New(s)` for a Go string, as used for the `data` payload of CPU v4 and memory v3."""
    return fnv1a_32(_utf8(go_dump_for_hash(data, "string"), source))


# --- k8s.io/utils/cpuset.Parse ---

_ATOI = re.compile(r"[+-]?[0-9]+", re.ASCII)
_INT64_MAX: Final = (1 << 63) - 1
_UINT64_MAX: Final = (1 << 64) - 1
# Kernel builds top out at 8192 CPUs; the bound keeps "0-999999999" from building a huge set to hash.
_MAX_CPU_ID: Final = 1 << 16


def _go_atoi(text: str) -> int | None:
    if not _ATOI.fullmatch(text):
        return None
    value = int(text)
    return value if -_INT64_MAX - 1 <= value <= _INT64_MAX else None


def parse_kubelet_cpuset(text: str) -> frozenset[int]:
    """Parse a cpuset exactly as the kubelet does (`k8s.io/utils/cpuset.Parse`). ValueError if invalid.

    Differences from a lenient parser: no whitespace, no empty items, and `A-B` needs A <= B.
    """
    if text == "":
        return frozenset()
    cpus: set[int] = set()
    for item in text.split(","):
        first, sep, last = item.partition("-")
        start = _go_atoi(first)
        end = _go_atoi(last) if sep else start
        if start is None or end is None:
            raise ValueError(f"invalid cpuset {text!r}: {item!r} is not N or A-B")
        if start > end:
            raise ValueError(f"invalid cpuset {text!r}: range {item!r} has start > end")
        if end > _MAX_CPU_ID:
            raise ValueError(f"invalid cpuset {text!r}: cpu {end} is beyond any Linux CPU number")
        cpus.update(range(start, end + 1))
    return frozenset(cpus)


def _cpuset_go_value(cpus: frozenset[int]) -> GoStruct:
    """cpuset.CPUSet as go-spew prints it: its unexported `elems map[int]struct{}` (never nil)."""
    elems: dict[int, GoValue] = dict.fromkeys(cpus, GoStruct())
    return GoStruct((("elems", "map[int]struct {}", elems),))


# --- reading JSON the way Go's encoding/json fills these structs ---


class _JsonObject:
    """A JSON object kept as its key/value pairs in file order, so duplicates can be refused."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, object]]) -> None:
        self.pairs = pairs


def _json_kind(value: object) -> str:
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


class _Decoder:
    """Typed access to parsed JSON with Go's rules. Every failure is a CheckpointFormatError."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, detail: str) -> CheckpointFormatError:
        return CheckpointFormatError(self.source, detail)

    def parse(self, text: str, what: str) -> object:
        try:
            return json.loads(text, object_pairs_hook=_JsonObject, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise self.fail(f"{what} is not valid JSON: {exc}") from None

    def fields(self, value: object, where: str, names: Sequence[str]) -> dict[str, object]:
        """The JSON object's members that fill the struct fields `names` (exact match first, then a
        case-insensitive one, as Go does). Unknown members are ignored."""
        if not isinstance(value, _JsonObject):
            raise self.fail(f"{where}: expected a JSON object, found {_json_kind(value)}")
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
            raise self.fail(f"{where}: expected a string, found {_json_kind(value)}")
        return value

    def integer(self, value: object, where: str, *, unsigned: bool) -> int:
        if value is None:
            return 0
        # Go refuses 1.0 and 1e3 for integer fields; json.loads gives floats for those, so they fail here.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(f"{where}: expected an integer, found {_json_kind(value)}")
        low, high = (0, _UINT64_MAX) if unsigned else (-_INT64_MAX - 1, _INT64_MAX)
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
        if not isinstance(value, _JsonObject):
            raise self.fail(f"{where}: expected a JSON object, found {_json_kind(value)}")
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
        parsed = _go_atoi(key)  # Go parses integer map keys with strconv.ParseInt(key, 10, 64)
        if parsed is None:
            raise self.fail(f"{where}: map key is not an integer")
        return parsed

    def array(self, value: object, where: str, elem: Callable[[object, str], _V]) -> tuple[_V, ...] | None:
        """A Go slice: None for JSON null (a nil slice)."""
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.fail(f"{where}: expected an array, found {_json_kind(value)}")
        return tuple(elem(item, f"{where}[{i}]") for i, item in enumerate(value))

    def cpuset(self, text: str, where: str) -> frozenset[int]:
        try:
            return parse_kubelet_cpuset(text)
        except ValueError as exc:
            raise self.fail(f"{where}: {exc}") from None


def _verify(decoder: _Decoder, stored: int, candidates: Sequence[tuple[str, int]]) -> str:
    """The format version whose hash equals the stored checksum. The first candidate is the most likely
    format and is the one named in the error."""
    for version, computed in candidates:
        if computed == stored:
            return version
    raise decoder.fail(f"checksum mismatch: file says {stored}, content hashes to {candidates[0][1]}")


# --- writing JSON the way Go's encoding/json does ---


def _json_string(text: str) -> str:
    # Go escapes <, > and & (HTML safety) and U+2028/U+2029; otherwise it matches Python's compact output.
    encoded = json.dumps(text, ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        encoded = encoded.replace(char, escape)
    return encoded.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _json_object(members: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{_json_string(name)}:{value}" for name, value in members) + "}"


def _json_map(items: Mapping[str, str] | Mapping[int, str]) -> str:
    # Go writes map keys sorted by their string form, so NUMA node "10" comes before "2".
    pairs = sorted((str(key), value) for key, value in items.items())
    return _json_object(pairs)


def _json_ints(values: Iterable[int]) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


def _check_cpuset(text: str, what: str) -> None:
    try:
        parse_kubelet_cpuset(text)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


# === CPU manager ===


@dataclass(frozen=True)
class CpuManagerState:
    """A decoded `cpu_manager_state`. Cpusets are kept as the strings the file holds.

    `default_cpu_set` is the shared pool and includes the reserved CPUs. `verified` is False only for a
    v1/v2 file whose checksum is 0, which the kubelet accepts as "no checksum". `container_id_entries`
    holds a v1 file's entries, which are keyed by container runtime ID; only the kubelet can map those
    IDs to pods, so `entries` is empty for v1.
    """

    policy_name: str
    default_cpu_set: str
    entries: dict[str, dict[str, str]]
    pod_entries: dict[str, str]
    format_version: str
    container_id_entries: dict[str, str] = field(default_factory=dict)
    verified: bool = True


_CPU_TOP_FIELDS: Final = (
    "policyName",
    "defaultCpuSet",
    "entries",
    "podEntries",
    "checksum",
    "data",
    "dataChecksum",
)
_CPU_DATA_FIELDS: Final = ("policyName", "defaultCpuSet", "entries", "podEntries")
_ENTRIES_V2_TYPE: Final = "map[string]map[string]string"
_ENTRIES_V1_TYPE: Final = "map[string]string"


@dataclass(frozen=True)
class _CpuPodEntry:
    text: str
    cpus: frozenset[int]


def _cpu_checkpoint_struct(
    policy_name: str,
    default_cpu_set: str,
    entries: GoValue,
    entries_type: str,
    pod_entries: Mapping[str, _CpuPodEntry] | bool | None,
) -> GoStruct:
    """The checkpoint struct with a zero checksum. `pod_entries` False means the struct has no such field
    (v1, v2); None is a nil map."""
    members: list[tuple[str, str, GoValue]] = [
        ("PolicyName", "string", policy_name),
        ("DefaultCPUSet", "string", default_cpu_set),
        ("Entries", entries_type, entries),
    ]
    if pod_entries is not False:
        pods: GoValue = None
        if isinstance(pod_entries, Mapping):
            pods = {
                uid: GoStruct((("CPUSet", "cpuset.CPUSet", _cpuset_go_value(entry.cpus)),))
                for uid, entry in pod_entries.items()
            }
        members.append(("PodEntries", "state.PodCPUAssignments", pods))
    members.append(("Checksum", "checksum.Checksum", 0))
    return GoStruct(tuple(members))


class _CpuReader:
    """Field-level parsing shared by the top-level layout and the v4 `data` payload."""

    def __init__(self, decoder: _Decoder) -> None:
        self.d = decoder

    def container_entries(self, value: object, where: str) -> dict[str, dict[str, str] | None] | None:
        def containers(member: object, inner: str) -> dict[str, str] | None:
            return self.d.mapping(member, inner, self.d.string_key, self.d.string)

        return self.d.mapping(value, where, self.d.string_key, containers)

    def id_entries(self, value: object, where: str) -> dict[str, str] | None:
        return self.d.mapping(value, where, self.d.string_key, self.d.string)

    def pod_entries(self, value: object, where: str) -> dict[str, _CpuPodEntry] | None:
        def entry(member: object, inner: str) -> _CpuPodEntry:
            # PodEntry has its own UnmarshalJSON: a null entry parses "" into the empty set.
            text = (
                ""
                if member is None
                else self.d.string(self.d.fields(member, inner, ("cpuSet",)).get("cpuSet"), inner)
            )
            return _CpuPodEntry(text, self.d.cpuset(text, f"{inner}.cpuSet"))

        return self.d.mapping(value, where, self.d.string_key, entry)


def _entries_shape(value: object) -> str:
    """The entries layout: "v1" (containerID -> cpuset), "v2" (podUID -> {container: cpuset}) or "any"."""
    if not isinstance(value, _JsonObject) or not value.pairs:
        return "any"
    if all(isinstance(member, str) for _, member in value.pairs):
        return "v1"
    return "v2"


def decode_cpu_manager_state(text: str, source: str) -> CpuManagerState:
    """Decode a `cpu_manager_state` in any format (v1..v4) and verify its checksum.

    CheckpointFormatError (naming `source`) for bad JSON, an unexpected shape, an invalid cpuset or a
    checksum mismatch. A checksum of 0 is accepted as "none" for v1 and v2 only, as the kubelet does.
    """
    d = _Decoder(source)
    r = _CpuReader(d)
    top = d.fields(d.parse(text, "checkpoint"), "checkpoint", _CPU_TOP_FIELDS)
    checksum = d.uint64(top.get("checksum"), "checksum")
    data = d.string(top.get("data"), "data")
    data_checksum = d.uint64(top.get("dataChecksum"), "dataChecksum")

    if data or data_checksum:
        # v4: `data` is authoritative. An earlier 1.37 development layout (still in the kubelet's test
        # fixtures) kept the data checksum in `checksum`, so use that when `dataChecksum` is absent.
        stored = data_checksum if "dataChecksum" in top else checksum
        _verify(d, stored, [("v4", _string_checksum(data, source))])
        body = d.fields(d.parse(data, "data"), "data", _CPU_DATA_FIELDS)
        entries = r.container_entries(body.get("entries"), "data.entries")
        pods = r.pod_entries(body.get("podEntries"), "data.podEntries")
        return _cpu_state(
            d,
            d.string(body.get("policyName"), "data.policyName"),
            d.string(body.get("defaultCpuSet"), "data.defaultCpuSet"),
            entries=entries,
            pods=pods,
            version="v4",
            verified=True,
        )

    policy = d.string(top.get("policyName"), "policyName")
    default = d.string(top.get("defaultCpuSet"), "defaultCpuSet")
    raw_entries = top.get("entries")
    shape = _entries_shape(raw_entries)
    has_pods = "podEntries" in top
    # The kubelet's constructors pre-fill Entries and PodEntries with empty maps, so an absent key hashes
    # as `map[]`; an explicit null makes the map nil (`<nil>`).
    v2_entries: dict[str, dict[str, str] | None] | None = {}
    v1_entries: dict[str, str] | None = {}
    if shape != "v1" and "entries" in top:
        v2_entries = r.container_entries(raw_entries, "entries")
    if shape != "v2":
        v1_entries = r.id_entries(raw_entries, "entries") if "entries" in top else {}
    pods = r.pod_entries(top.get("podEntries"), "podEntries") if has_pods else {}

    def hashed(version: str, name: str) -> tuple[str, int]:
        if version == "v1":
            struct = _cpu_checkpoint_struct(policy, default, v1_entries, _ENTRIES_V1_TYPE, False)
        else:
            struct = _cpu_checkpoint_struct(
                policy, default, v2_entries, _ENTRIES_V2_TYPE, pods if version == "v3" else False
            )
        return version, _struct_checksum(struct, name, source)

    # v1 and v2 are hashed under the legacy type name "CPUManagerCheckpoint" (the kubelet rewrites the
    # name before hashing); newer kubelets also accept v2 and v3 hashed under their own names.
    candidates: list[tuple[str, int]] = []
    if shape != "v1":
        v2 = [hashed("v2", "CPUManagerCheckpoint"), hashed("v2", "CPUManagerCheckpointV2")]
        v3 = [hashed("v3", "CPUManagerCheckpointV3"), hashed("v3", "CPUManagerCheckpoint")]
        candidates += v3 + v2 if has_pods else v2 + v3
    if shape != "v2":
        candidates.append(hashed("v1", "CPUManagerCheckpoint"))

    if checksum == 0:
        version = "v1" if shape == "v1" else "v2"
        verified = False
    else:
        version = _verify(d, checksum, candidates)
        verified = True
    if version == "v1":
        return _cpu_state(
            d, policy, default, entries={}, pods={}, version="v1", verified=verified, by_id=v1_entries
        )
    return _cpu_state(
        d,
        policy,
        default,
        entries=v2_entries,
        pods=pods if version == "v3" else {},
        version=version,
        verified=verified,
    )


def _cpu_state(
    d: _Decoder,
    policy: str,
    default: str,
    *,
    entries: Mapping[str, Mapping[str, str] | None] | None,
    pods: Mapping[str, _CpuPodEntry] | None,
    version: str,
    verified: bool,
    by_id: Mapping[str, str] | None = None,
) -> CpuManagerState:
    """The public state, after checking every cpuset parses as the kubelet would parse it."""
    d.cpuset(default, "defaultCpuSet")
    containers = {uid: dict(per_pod or {}) for uid, per_pod in (entries or {}).items()}
    for uid, per_pod in containers.items():
        for name, cpus in per_pod.items():
            d.cpuset(cpus, f"entries[{uid!r}][{name!r}]")
    id_entries = dict(by_id or {})
    for container_id, cpus in id_entries.items():
        d.cpuset(cpus, f"entries[{container_id!r}]")
    return CpuManagerState(
        policy_name=policy,
        default_cpu_set=default,
        entries=containers,
        pod_entries={uid: entry.text for uid, entry in (pods or {}).items()},
        format_version=version,
        container_id_entries=id_entries,
        verified=verified,
    )


def _checked_entries(entries: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    checked = {uid: dict(per_pod) for uid, per_pod in entries.items()}
    for uid, per_pod in checked.items():
        for name, cpus in per_pod.items():
            _check_cpuset(cpus, f"entries[{uid!r}][{name!r}]")
    return checked


def _checked_pod_entries(pod_entries: Mapping[str, str]) -> dict[str, _CpuPodEntry]:
    checked: dict[str, _CpuPodEntry] = {}
    for uid, text in pod_entries.items():
        _check_cpuset(text, f"pod_entries[{uid!r}]")
        cpus = parse_kubelet_cpuset(text)
        # The kubelet keeps pod entries as sets and writes them back in canonical form.
        checked[uid] = _CpuPodEntry(format_cpu_list(cpus), cpus)
    return checked


def _cpu_json_members(
    policy_name: str,
    default_cpu_set: str,
    entries: Mapping[str, Mapping[str, str]],
    pod_entries: Mapping[str, _CpuPodEntry] | None,
) -> list[tuple[str, str]]:
    members = [("policyName", _json_string(policy_name)), ("defaultCpuSet", _json_string(default_cpu_set))]
    if entries:  # omitempty
        members.append(
            (
                "entries",
                _json_map(
                    {
                        uid: _json_map({c: _json_string(s) for c, s in per_pod.items()})
                        for uid, per_pod in entries.items()
                    }
                ),
            )
        )
    if pod_entries:  # omitempty; an empty set drops its cpuSet (omitempty on the string)
        members.append(
            (
                "podEntries",
                _json_map(
                    {
                        uid: _json_object([("cpuSet", _json_string(e.text))] if e.text else [])
                        for uid, e in pod_entries.items()
                    }
                ),
            )
        )
    return members


def encode_cpu_manager_state_v2(
    policy_name: str, default_cpu_set: str, entries: Mapping[str, Mapping[str, str]]
) -> str:
    """The v2 `cpu_manager_state` text exactly as kubelets 1.18 to 1.35 write it, checksum included.

    `entries` maps podUID -> container name -> cpuset; it is omitted from the JSON when empty. ValueError
    if a cpuset is not valid kubelet syntax.
    """
    _check_cpuset(default_cpu_set, "default_cpu_set")
    checked = _checked_entries(entries)
    struct = _cpu_checkpoint_struct(policy_name, default_cpu_set, checked, _ENTRIES_V2_TYPE, False)
    checksum = _struct_checksum(struct, "CPUManagerCheckpoint", "encode_cpu_manager_state_v2")
    members = _cpu_json_members(policy_name, default_cpu_set, checked, None)
    return _json_object([*members, ("checksum", str(checksum))])


def encode_cpu_manager_state_v3(
    policy_name: str,
    default_cpu_set: str,
    entries: Mapping[str, Mapping[str, str]],
    pod_entries: Mapping[str, str],
) -> str:
    """The v3 text (1.36 with PodLevelResourceManagers): v2 plus `podEntries` podUID -> cpuset.

    Hashed under the legacy type name, as the newest kubelets write it for rollback compatibility.
    """
    _check_cpuset(default_cpu_set, "default_cpu_set")
    checked = _checked_entries(entries)
    pods = _checked_pod_entries(pod_entries)
    struct = _cpu_checkpoint_struct(policy_name, default_cpu_set, checked, _ENTRIES_V2_TYPE, pods)
    checksum = _struct_checksum(struct, "CPUManagerCheckpoint", "encode_cpu_manager_state_v3")
    members = _cpu_json_members(policy_name, default_cpu_set, checked, pods)
    return _json_object([*members, ("checksum", str(checksum))])


def encode_cpu_manager_state_v4(
    policy_name: str,
    default_cpu_set: str,
    entries: Mapping[str, Mapping[str, str]],
    pod_entries: Mapping[str, str],
) -> str:
    """The v4 text (1.37): a v3-shaped top level with checksum 0 plus `data` and `dataChecksum`."""
    _check_cpuset(default_cpu_set, "default_cpu_set")
    checked = _checked_entries(entries)
    pods = _checked_pod_entries(pod_entries)
    members = _cpu_json_members(policy_name, default_cpu_set, checked, pods)
    data = _json_object(members)
    data_checksum = _string_checksum(data, "encode_cpu_manager_state_v4")
    return _json_object(
        [
            *members,
            ("checksum", "0"),
            ("data", _json_string(data)),
            ("dataChecksum", str(data_checksum)),
        ]
    )


# === memory manager ===


@dataclass(frozen=True)
class MemoryTable:
    """One resource's memory on one NUMA node, in bytes (or pages' bytes for hugepages)."""

    total: int
    system_reserved: int
    allocatable: int
    reserved: int
    free: int


@dataclass(frozen=True)
class NumaNodeMemoryState:
    """The memory manager's view of one NUMA node. `cells` lists the nodes grouped with it for
    multi-NUMA allocations (empty or just itself when it is used alone)."""

    number_of_assignments: int
    memory_map: dict[str, MemoryTable]
    cells: tuple[int, ...]


@dataclass(frozen=True)
class MemoryBlock:
    """Memory of one resource type ("memory", "hugepages-2Mi", ...) assigned on a set of NUMA nodes."""

    numa_affinity: tuple[int, ...]
    type: str
    size: int


@dataclass(frozen=True)
class MemoryManagerState:
    """A decoded `memory_manager_state`. Policy names are as written ("Static"/"None" by the kubelet).

    `verified` is False only for a v1 file whose checksum is 0, which the kubelet accepts as "none".
    """

    policy_name: str
    machine_state: dict[int, NumaNodeMemoryState]
    entries: dict[str, dict[str, tuple[MemoryBlock, ...]]]
    pod_entries: dict[str, tuple[MemoryBlock, ...]]
    format_version: str
    verified: bool = True


_MEMORY_TOP_FIELDS: Final = (
    "policyName",
    "machineState",
    "entries",
    "podEntries",
    "checksum",
    "data",
    "dataChecksum",
)
_MEMORY_DATA_FIELDS: Final = ("policyName", "machineState", "entries", "podEntries")
_TABLE_FIELDS: Final = ("total", "systemReserved", "allocatable", "reserved", "free")


# Parsed memory state that still tells nil from empty, because the hash does.
@dataclass(frozen=True)
class _Block:
    numa_affinity: tuple[int, ...] | None
    type: str
    size: int


@dataclass(frozen=True)
class _Node:
    number_of_assignments: int
    memory_map: dict[str, MemoryTable | None] | None
    cells: tuple[int, ...] | None


_Containers = dict[str, dict[str, tuple[_Block, ...] | None] | None]


@dataclass(frozen=True)
class _MemoryBody:
    policy_name: str
    machine_state: dict[int, _Node | None] | None
    entries: _Containers | None
    pod_entries: dict[str, tuple[_Block, ...] | None] | None


class _MemoryReader:
    def __init__(self, decoder: _Decoder) -> None:
        self.d = decoder

    def body(self, fields: Mapping[str, object], prefix: str) -> _MemoryBody:
        d = self.d
        # Absent maps stay the empty maps the kubelet's constructors create; null makes them nil.
        return _MemoryBody(
            policy_name=d.string(fields.get("policyName"), f"{prefix}policyName"),
            machine_state=self.machine_state(fields["machineState"], f"{prefix}machineState")
            if "machineState" in fields
            else {},
            entries=self.entries(fields["entries"], f"{prefix}entries") if "entries" in fields else {},
            pod_entries=self.pod_entries(fields["podEntries"], f"{prefix}podEntries")
            if "podEntries" in fields
            else {},
        )

    def table(self, value: object, where: str) -> MemoryTable | None:
        if value is None:
            return None
        f = self.d.fields(value, where, _TABLE_FIELDS)
        total, system_reserved, allocatable, reserved, free = (
            self.d.uint64(f.get(name), f"{where}.{name}") for name in _TABLE_FIELDS
        )
        return MemoryTable(total, system_reserved, allocatable, reserved, free)

    def node(self, value: object, where: str) -> _Node | None:
        if value is None:
            return None
        d = self.d
        f = d.fields(value, where, ("numberOfAssignments", "memoryMap", "cells"))
        return _Node(
            number_of_assignments=d.int64(f.get("numberOfAssignments"), f"{where}.numberOfAssignments"),
            memory_map=d.mapping(f.get("memoryMap"), f"{where}.memoryMap", d.string_key, self.table),
            cells=d.array(f.get("cells"), f"{where}.cells", d.int64),
        )

    def machine_state(self, value: object, where: str) -> dict[int, _Node | None] | None:
        return self.d.mapping(value, where, self.d.int_key, self.node)

    def block(self, value: object, where: str) -> _Block:
        d = self.d
        # A null array element decodes to the zero Block.
        f = {} if value is None else d.fields(value, where, ("numaAffinity", "type", "size"))
        return _Block(
            numa_affinity=d.array(f.get("numaAffinity"), f"{where}.numaAffinity", d.int64),
            type=d.string(f.get("type"), f"{where}.type"),
            size=d.uint64(f.get("size"), f"{where}.size"),
        )

    def blocks(self, value: object, where: str) -> tuple[_Block, ...] | None:
        return self.d.array(value, where, self.block)

    def entries(self, value: object, where: str) -> _Containers | None:
        def containers(member: object, inner: str) -> dict[str, tuple[_Block, ...] | None] | None:
            return self.d.mapping(member, inner, self.d.string_key, self.blocks)

        return self.d.mapping(value, where, self.d.string_key, containers)

    def pod_entries(self, value: object, where: str) -> dict[str, tuple[_Block, ...] | None] | None:
        def entry(member: object, inner: str) -> tuple[_Block, ...] | None:
            if member is None:  # a null struct element stays the zero PodEntry
                return None
            return self.blocks(self.d.fields(member, inner, ("memoryBlocks",)).get("memoryBlocks"), inner)

        return self.d.mapping(value, where, self.d.string_key, entry)


def _blocks_go_value(blocks: Sequence[_Block] | None) -> GoValue:
    if blocks is None:
        return None
    return tuple(
        GoStruct(
            (
                ("NUMAAffinity", "[]int", None if b.numa_affinity is None else tuple(b.numa_affinity)),
                ("Type", "v1.ResourceName", b.type),
                ("Size", "uint64", b.size),
            )
        )
        for b in blocks
    )


def _table_go_value(table: MemoryTable | None) -> GoValue:
    if table is None:
        return None
    return GoPtr(
        GoStruct(
            (
                ("TotalMemSize", "uint64", table.total),
                ("SystemReserved", "uint64", table.system_reserved),
                ("Allocatable", "uint64", table.allocatable),
                ("Reserved", "uint64", table.reserved),
                ("Free", "uint64", table.free),
            )
        )
    )


def _node_go_value(node: _Node | None) -> GoValue:
    if node is None:
        return None
    memory_map: GoValue = None
    if node.memory_map is not None:
        memory_map = {name: _table_go_value(table) for name, table in node.memory_map.items()}
    return GoPtr(
        GoStruct(
            (
                ("NumberOfAssignments", "int", node.number_of_assignments),
                ("MemoryMap", "map[v1.ResourceName]*state.MemoryTable", memory_map),
                ("Cells", "[]int", node.cells),
            )
        )
    )


def _memory_checkpoint_struct(body: _MemoryBody, *, with_pod_entries: bool) -> GoStruct:
    machine: GoValue = None
    if body.machine_state is not None:
        machine = {numa: _node_go_value(node) for numa, node in body.machine_state.items()}
    entries: GoValue = None
    if body.entries is not None:
        entries = {
            uid: None if per_pod is None else {c: _blocks_go_value(b) for c, b in per_pod.items()}
            for uid, per_pod in body.entries.items()
        }
    members: list[tuple[str, str, GoValue]] = [
        ("PolicyName", "string", body.policy_name),
        ("MachineState", "state.NUMANodeMap", machine),
        ("Entries", "state.ContainerMemoryAssignments", entries),
    ]
    if with_pod_entries:
        pods: GoValue = None
        if body.pod_entries is not None:
            pods = {
                uid: GoStruct((("MemoryBlocks", "[]state.Block", _blocks_go_value(blocks)),))
                for uid, blocks in body.pod_entries.items()
            }
        members.append(("PodEntries", "state.PodMemoryAssignments", pods))
    members.append(("Checksum", "checksum.Checksum", 0))
    return GoStruct(tuple(members))


def decode_memory_manager_state(text: str, source: str) -> MemoryManagerState:
    """Decode a `memory_manager_state` in any format (v1..v3) and verify its checksum.

    CheckpointFormatError (naming `source`) for bad JSON, an unexpected shape, a null NUMA node or
    memory table, or a checksum mismatch. A checksum of 0 is accepted as "none" for v1 only.
    """
    d = _Decoder(source)
    r = _MemoryReader(d)
    top = d.fields(d.parse(text, "checkpoint"), "checkpoint", _MEMORY_TOP_FIELDS)
    checksum = d.uint64(top.get("checksum"), "checksum")
    data = d.string(top.get("data"), "data")
    data_checksum = d.uint64(top.get("dataChecksum"), "dataChecksum")

    if data or data_checksum:
        # v3: only `data` counts; its top-level copy is for older kubelets.
        _verify(d, data_checksum, [("v3", _string_checksum(data, source))])
        payload = d.fields(d.parse(data, "data"), "data", _MEMORY_DATA_FIELDS)
        return _memory_state(d, r.body(payload, "data."), "v3", verified=True)

    body = r.body(top, "")
    v1 = (
        "v1",
        _struct_checksum(
            _memory_checkpoint_struct(body, with_pod_entries=False), "MemoryManagerCheckpoint", source
        ),
    )
    v2 = (
        "v2",
        _struct_checksum(
            _memory_checkpoint_struct(body, with_pod_entries=True), "MemoryManagerCheckpoint", source
        ),
    )
    if checksum == 0:
        return _memory_state(d, body, "v1", verified=False)
    version = _verify(d, checksum, [v2, v1] if "podEntries" in top else [v1, v2])
    return _memory_state(d, body, version, verified=True)


def _public_blocks(blocks: Sequence[_Block] | None) -> tuple[MemoryBlock, ...]:
    return tuple(MemoryBlock(tuple(b.numa_affinity or ()), b.type, b.size) for b in blocks or ())


def _memory_state(d: _Decoder, body: _MemoryBody, version: str, *, verified: bool) -> MemoryManagerState:
    machine: dict[int, NumaNodeMemoryState] = {}
    for numa, node in (body.machine_state or {}).items():
        if node is None:
            raise d.fail(f"machineState[{numa}] is null")
        tables: dict[str, MemoryTable] = {}
        for name, table in (node.memory_map or {}).items():
            if table is None:
                raise d.fail(f"machineState[{numa}].memoryMap[{name!r}] is null")
            tables[name] = table
        machine[numa] = NumaNodeMemoryState(node.number_of_assignments, tables, tuple(node.cells or ()))
    entries = {
        uid: {name: _public_blocks(blocks) for name, blocks in (per_pod or {}).items()}
        for uid, per_pod in (body.entries or {}).items()
    }
    pods: dict[str, tuple[MemoryBlock, ...]] = {}
    if version != "v1":  # the v1 struct has no podEntries; a v1 file's stray key is not part of it
        pods = {uid: _public_blocks(blocks) for uid, blocks in (body.pod_entries or {}).items()}
    return MemoryManagerState(body.policy_name, machine, entries, pods, version, verified)


def _uint64(value: int, what: str) -> int:
    if not 0 <= value <= _UINT64_MAX:
        raise ValueError(f"{what} is {value}, which does not fit a Go uint64")
    return value


def _private_blocks(blocks: Sequence[MemoryBlock]) -> tuple[_Block, ...]:
    return tuple(_Block(tuple(b.numa_affinity), b.type, _uint64(b.size, "block size")) for b in blocks)


def _private_table(table: MemoryTable) -> MemoryTable:
    for name in ("total", "system_reserved", "allocatable", "reserved", "free"):
        _uint64(getattr(table, name), f"memory table {name}")
    return table


def _memory_body(
    policy_name: str,
    machine_state: Mapping[int, NumaNodeMemoryState],
    entries: Mapping[str, Mapping[str, Sequence[MemoryBlock]]],
    pod_entries: Mapping[str, Sequence[MemoryBlock]],
) -> _MemoryBody:
    return _MemoryBody(
        policy_name=policy_name,
        machine_state={
            numa: _Node(
                node.number_of_assignments,
                {name: _private_table(t) for name, t in node.memory_map.items()},
                tuple(node.cells),
            )
            for numa, node in machine_state.items()
        },
        entries={
            uid: {name: _private_blocks(blocks) for name, blocks in per_pod.items()}
            for uid, per_pod in entries.items()
        },
        pod_entries={uid: _private_blocks(blocks) for uid, blocks in pod_entries.items()},
    )


def _blocks_json(blocks: Sequence[_Block] | None) -> str:
    if blocks is None:
        return "null"
    return (
        "["
        + ",".join(
            _json_object(
                [
                    ("numaAffinity", "null" if b.numa_affinity is None else _json_ints(b.numa_affinity)),
                    ("type", _json_string(b.type)),
                    ("size", str(b.size)),
                ]
            )
            for b in blocks
        )
        + "]"
    )


def _table_json(table: MemoryTable | None) -> str:
    if table is None:
        return "null"
    values = (table.total, table.system_reserved, table.allocatable, table.reserved, table.free)
    return _json_object(zip(_TABLE_FIELDS, (str(v) for v in values), strict=True))


def _node_json(node: _Node | None) -> str:
    if node is None:
        return "null"
    memory_map = "null"
    if node.memory_map is not None:
        memory_map = _json_map({name: _table_json(t) for name, t in node.memory_map.items()})
    return _json_object(
        [
            ("numberOfAssignments", str(node.number_of_assignments)),
            ("memoryMap", memory_map),
            ("cells", "null" if node.cells is None else _json_ints(node.cells)),
        ]
    )


def _memory_json_members(body: _MemoryBody, *, with_pod_entries: bool) -> list[tuple[str, str]]:
    machine = "null"
    if body.machine_state is not None:
        machine = _json_map({numa: _node_json(node) for numa, node in body.machine_state.items()})
    members = [("policyName", _json_string(body.policy_name)), ("machineState", machine)]
    if body.entries:  # omitempty
        members.append(
            (
                "entries",
                _json_map(
                    {
                        uid: "null"
                        if per_pod is None
                        else _json_map({c: _blocks_json(b) for c, b in per_pod.items()})
                        for uid, per_pod in body.entries.items()
                    }
                ),
            )
        )
    if with_pod_entries and body.pod_entries:  # omitempty, and memoryBlocks is omitempty too
        members.append(
            (
                "podEntries",
                _json_map(
                    {
                        uid: _json_object([("memoryBlocks", _blocks_json(blocks))] if blocks else [])
                        for uid, blocks in body.pod_entries.items()
                    }
                ),
            )
        )
    return members


def encode_memory_manager_state(
    policy_name: str,
    machine_state: Mapping[int, NumaNodeMemoryState],
    entries: Mapping[str, Mapping[str, Sequence[MemoryBlock]]],
) -> str:
    """The classic (v1) `memory_manager_state` text as kubelets up to 1.36 write it, checksum included.

    The kubelet's policy names are "Static" and "None". `entries` (podUID -> container -> blocks) is
    omitted from the JSON when empty.
    """
    body = _memory_body(policy_name, machine_state, entries, {})
    struct = _memory_checkpoint_struct(body, with_pod_entries=False)
    checksum = _struct_checksum(struct, "MemoryManagerCheckpoint", "encode_memory_manager_state")
    members = _memory_json_members(body, with_pod_entries=False)
    return _json_object([*members, ("checksum", str(checksum))])


def encode_memory_manager_state_v3(
    policy_name: str,
    machine_state: Mapping[int, NumaNodeMemoryState],
    entries: Mapping[str, Mapping[str, Sequence[MemoryBlock]]],
    pod_entries: Mapping[str, Sequence[MemoryBlock]],
) -> str:
    """The v3 text (1.37): a classic top level with its own checksum, plus `data` and `dataChecksum`."""
    body = _memory_body(policy_name, machine_state, entries, pod_entries)
    data = _json_object(_memory_json_members(body, with_pod_entries=True))
    data_checksum = _string_checksum(data, "encode_memory_manager_state_v3")
    classic = _memory_checkpoint_struct(body, with_pod_entries=False)
    checksum = _struct_checksum(classic, "MemoryManagerCheckpoint", "encode_memory_manager_state_v3")
    return _json_object(
        [
            *_memory_json_members(body, with_pod_entries=False),
            ("checksum", str(checksum)),
            ("data", _json_string(data)),
            ("dataChecksum", str(data_checksum)),
        ]
    )
