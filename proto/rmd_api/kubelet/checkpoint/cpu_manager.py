"""The CPU manager's `cpu_manager_state`: decoding any format (v1..v4) with its checksum verified, and
encoding v2, v3 and v4 exactly as the kubelet writes them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from rmd_api.cpuset import MAX_CPU_ID, format_cpu_list
from rmd_api.kubelet.checkpoint.checksum import (
    read_envelope,
    string_checksum,
    struct_checksum,
    verify_checksum,
)
from rmd_api.kubelet.checkpoint.go_cpuset import cpuset_go_value, kubelet_cpuset_ranges, parse_kubelet_cpuset
from rmd_api.kubelet.checkpoint.gojson import Decoder, JsonObject, json_map, json_object, json_string
from rmd_api.kubelet.checkpoint.gospew import GoStruct, GoValue


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
# A node has at most MAX_CPU_ID + 1 CPUs and pods' exclusive CPUs never overlap, so the pod entries of a file
# the kubelet wrote name at most that many; a file naming more (a few kB can name millions) is refused before
# its sets are built and hashed.
_MAX_POD_ENTRY_CPUS: Final = MAX_CPU_ID + 1
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
                uid: GoStruct((("CPUSet", "cpuset.CPUSet", cpuset_go_value(entry.cpus)),))
                for uid, entry in pod_entries.items()
            }
        members.append(("PodEntries", "state.PodCPUAssignments", pods))
    members.append(("Checksum", "checksum.Checksum", 0))
    return GoStruct(tuple(members))


class _CpuReader:
    """Field-level parsing shared by the top-level layout and the v4 `data` payload."""

    def __init__(self, decoder: Decoder) -> None:
        self.d = decoder

    def container_entries(self, value: object, where: str) -> dict[str, dict[str, str] | None] | None:
        def containers(member: object, inner: str) -> dict[str, str] | None:
            return self.d.mapping(member, inner, self.d.string_key, self.d.string)

        return self.d.mapping(value, where, self.d.string_key, containers)

    def id_entries(self, value: object, where: str) -> dict[str, str] | None:
        return self.d.mapping(value, where, self.d.string_key, self.d.string)

    def pod_entries(self, value: object, where: str) -> dict[str, _CpuPodEntry] | None:
        total = 0  # CPUs of the entries so far: each is hashed one by one, before the checksum can be checked

        def entry(member: object, inner: str) -> _CpuPodEntry:
            nonlocal total
            # PodEntry has its own UnmarshalJSON: a null entry parses "" into the empty set.
            text = (
                ""
                if member is None
                else self.d.string(self.d.fields(member, inner, ("cpuSet",)).get("cpuSet"), inner)
            )
            cpus = _cpuset(self.d, text, f"{inner}.cpuSet")
            total += len(cpus)
            if total > _MAX_POD_ENTRY_CPUS:
                raise self.d.fail(
                    f"{where}: the pods' CPUs add up to more CPUs than a node can have "
                    f"({_MAX_POD_ENTRY_CPUS}), and pods' exclusive CPUs never overlap"
                )
            return _CpuPodEntry(text, cpus)

        return self.d.mapping(value, where, self.d.string_key, entry)


def _entries_shape(value: object) -> str:
    """The entries layout: "v1" (containerID -> cpuset), "v2" (podUID -> {container: cpuset}) or "any"."""
    if not isinstance(value, JsonObject) or not value.pairs:
        return "any"
    if all(isinstance(member, str) for _, member in value.pairs):
        return "v1"
    return "v2"


def decode_cpu_manager_state(text: str, source: str) -> CpuManagerState:
    """Decode a `cpu_manager_state` in any format (v1..v4) and verify its checksum.

    CheckpointFormatError (naming `source`) for bad JSON, an unexpected shape, an invalid cpuset or a
    checksum mismatch. A checksum of 0 is accepted as "none" for v1 and v2 only, as the kubelet does.
    """
    d = Decoder(source)
    r = _CpuReader(d)
    top, checksum, data, data_checksum = read_envelope(d, text, _CPU_TOP_FIELDS)

    if data or data_checksum:
        # v4: `data` is authoritative. An earlier 1.37 development layout (still in the kubelet's test
        # fixtures) kept the data checksum in `checksum`, so use that when `dataChecksum` is absent.
        stored = data_checksum if "dataChecksum" in top else checksum
        verify_checksum(source, stored, [("v4", string_checksum(data, source))])
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
        return version, struct_checksum(struct, name, source)

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
        version = verify_checksum(source, checksum, candidates)
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
    d: Decoder,
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
    _check(d, default, "defaultCpuSet")
    containers = {uid: dict(per_pod or {}) for uid, per_pod in (entries or {}).items()}
    for uid, per_pod in containers.items():
        for name, cpus in per_pod.items():
            _check(d, cpus, f"entries[{uid!r}][{name!r}]")
    id_entries = dict(by_id or {})
    for container_id, cpus in id_entries.items():
        _check(d, cpus, f"entries[{container_id!r}]")
    return CpuManagerState(
        policy_name=policy,
        default_cpu_set=default,
        entries=containers,
        pod_entries={uid: entry.text for uid, entry in (pods or {}).items()},
        format_version=version,
        container_id_entries=id_entries,
        verified=verified,
    )


def _cpuset(d: Decoder, text: str, where: str) -> frozenset[int]:
    """The cpuset as the kubelet parses it; the decoder's error naming `where` if it is invalid."""
    try:
        return parse_kubelet_cpuset(text)
    except ValueError as exc:
        raise d.fail(f"{where}: {exc}") from None


def _check(d: Decoder, text: str, where: str) -> None:
    """`_cpuset` for a cpuset that is only checked: the ranges are not expanded, so the cost is the text's
    (a file's thousands of entries may each name every CPU)."""
    try:
        kubelet_cpuset_ranges(text)
    except ValueError as exc:
        raise d.fail(f"{where}: {exc}") from None


def _check_cpuset(text: str, what: str) -> None:
    try:
        kubelet_cpuset_ranges(text)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


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


def _checked_v3(
    default_cpu_set: str, entries: Mapping[str, Mapping[str, str]], pod_entries: Mapping[str, str]
) -> tuple[dict[str, dict[str, str]], dict[str, _CpuPodEntry]]:
    """The entries and pod entries of a v3-shaped file, every cpuset checked (ValueError naming a bad one)."""
    _check_cpuset(default_cpu_set, "default_cpu_set")
    return _checked_entries(entries), _checked_pod_entries(pod_entries)


def _cpu_json_members(
    policy_name: str,
    default_cpu_set: str,
    entries: Mapping[str, Mapping[str, str]],
    pod_entries: Mapping[str, _CpuPodEntry] | None,
) -> list[tuple[str, str]]:
    members = [("policyName", json_string(policy_name)), ("defaultCpuSet", json_string(default_cpu_set))]
    if entries:  # omitempty
        members.append(
            (
                "entries",
                json_map(
                    {
                        uid: json_map({c: json_string(s) for c, s in per_pod.items()})
                        for uid, per_pod in entries.items()
                    }
                ),
            )
        )
    if pod_entries:  # omitempty; an empty set drops its cpuSet (omitempty on the string)
        members.append(
            (
                "podEntries",
                json_map(
                    {
                        uid: json_object([("cpuSet", json_string(e.text))] if e.text else [])
                        for uid, e in pod_entries.items()
                    }
                ),
            )
        )
    return members


def _struct_checksummed(
    policy_name: str,
    default_cpu_set: str,
    entries: dict[str, dict[str, str]],
    pods: dict[str, _CpuPodEntry] | None,
    source: str,
) -> str:
    """A v2 (`pods` None: the struct has no PodEntries) or v3 file: its members and the checksum of its
    struct, hashed under the legacy type name."""
    pod_field = False if pods is None else pods
    struct = _cpu_checkpoint_struct(policy_name, default_cpu_set, entries, _ENTRIES_V2_TYPE, pod_field)
    checksum = struct_checksum(struct, "CPUManagerCheckpoint", source)
    members = _cpu_json_members(policy_name, default_cpu_set, entries, pods)
    return json_object([*members, ("checksum", str(checksum))])


def encode_cpu_manager_state_v2(
    policy_name: str, default_cpu_set: str, entries: Mapping[str, Mapping[str, str]]
) -> str:
    """The v2 `cpu_manager_state` text exactly as kubelets 1.18 to 1.35 write it, checksum included.

    `entries` maps podUID -> container name -> cpuset; it is omitted from the JSON when empty. ValueError
    if a cpuset is not valid kubelet syntax.
    """
    _check_cpuset(default_cpu_set, "default_cpu_set")
    checked = _checked_entries(entries)
    return _struct_checksummed(policy_name, default_cpu_set, checked, None, "encode_cpu_manager_state_v2")


def encode_cpu_manager_state_v3(
    policy_name: str,
    default_cpu_set: str,
    entries: Mapping[str, Mapping[str, str]],
    pod_entries: Mapping[str, str],
) -> str:
    """The v3 text (1.36 with PodLevelResourceManagers): v2 plus `podEntries` podUID -> cpuset.

    Hashed under the legacy type name, as the newest kubelets write it for rollback compatibility.
    """
    checked, pods = _checked_v3(default_cpu_set, entries, pod_entries)
    return _struct_checksummed(policy_name, default_cpu_set, checked, pods, "encode_cpu_manager_state_v3")


def encode_cpu_manager_state_v4(
    policy_name: str,
    default_cpu_set: str,
    entries: Mapping[str, Mapping[str, str]],
    pod_entries: Mapping[str, str],
) -> str:
    """The v4 text (1.37): a v3-shaped top level with checksum 0 plus `data` and `dataChecksum`."""
    checked, pods = _checked_v3(default_cpu_set, entries, pod_entries)
    members = _cpu_json_members(policy_name, default_cpu_set, checked, pods)
    data = json_object(members)
    data_checksum = string_checksum(data, "encode_cpu_manager_state_v4")
    return json_object(
        [
            *members,
            ("checksum", "0"),
            ("data", json_string(data)),
            ("dataChecksum", str(data_checksum)),
        ]
    )
