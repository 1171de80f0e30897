"""The memory manager's `memory_manager_state`: decoding any format (v1..v3) with its checksum verified, and
encoding the classic (v1) layout and v3 exactly as the kubelet writes them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from rmd_api.kubelet.checkpoint.checksum import (
    read_envelope,
    string_checksum,
    struct_checksum,
    verify_checksum,
)
from rmd_api.kubelet.checkpoint.gojson import (
    UINT64_MAX,
    Decoder,
    json_ints,
    json_map,
    json_object,
    json_string,
)
from rmd_api.kubelet.checkpoint.gospew import GoPtr, GoStruct, GoValue


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
    def __init__(self, decoder: Decoder) -> None:
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
    d = Decoder(source)
    r = _MemoryReader(d)
    top, checksum, data, data_checksum = read_envelope(d, text, _MEMORY_TOP_FIELDS)

    if data or data_checksum:
        # v3: only `data` counts; its top-level copy is for older kubelets.
        verify_checksum(source, data_checksum, [("v3", string_checksum(data, source))])
        payload = d.fields(d.parse(data, "data"), "data", _MEMORY_DATA_FIELDS)
        return _memory_state(d, r.body(payload, "data."), "v3", verified=True)

    body = r.body(top, "")
    v1 = (
        "v1",
        struct_checksum(
            _memory_checkpoint_struct(body, with_pod_entries=False), "MemoryManagerCheckpoint", source
        ),
    )
    v2 = (
        "v2",
        struct_checksum(
            _memory_checkpoint_struct(body, with_pod_entries=True), "MemoryManagerCheckpoint", source
        ),
    )
    if checksum == 0:
        return _memory_state(d, body, "v1", verified=False)
    version = verify_checksum(source, checksum, [v2, v1] if "podEntries" in top else [v1, v2])
    return _memory_state(d, body, version, verified=True)


def _public_blocks(blocks: Sequence[_Block] | None) -> tuple[MemoryBlock, ...]:
    return tuple(MemoryBlock(tuple(b.numa_affinity or ()), b.type, b.size) for b in blocks or ())


def _memory_state(d: Decoder, body: _MemoryBody, version: str, *, verified: bool) -> MemoryManagerState:
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
    if not 0 <= value <= UINT64_MAX:
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
            json_object(
                [
                    ("numaAffinity", "null" if b.numa_affinity is None else json_ints(b.numa_affinity)),
                    ("type", json_string(b.type)),
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
    return json_object(zip(_TABLE_FIELDS, (str(v) for v in values), strict=True))


def _node_json(node: _Node | None) -> str:
    if node is None:
        return "null"
    memory_map = "null"
    if node.memory_map is not None:
        memory_map = json_map({name: _table_json(t) for name, t in node.memory_map.items()})
    return json_object(
        [
            ("numberOfAssignments", str(node.number_of_assignments)),
            ("memoryMap", memory_map),
            ("cells", "null" if node.cells is None else json_ints(node.cells)),
        ]
    )


def _memory_json_members(body: _MemoryBody, *, with_pod_entries: bool) -> list[tuple[str, str]]:
    machine = "null"
    if body.machine_state is not None:
        machine = json_map({numa: _node_json(node) for numa, node in body.machine_state.items()})
    members = [("policyName", json_string(body.policy_name)), ("machineState", machine)]
    if body.entries:  # omitempty
        members.append(
            (
                "entries",
                json_map(
                    {
                        uid: "null"
                        if per_pod is None
                        else json_map({c: _blocks_json(b) for c, b in per_pod.items()})
                        for uid, per_pod in body.entries.items()
                    }
                ),
            )
        )
    if with_pod_entries and body.pod_entries:  # omitempty, and memoryBlocks is omitempty too
        members.append(
            (
                "podEntries",
                json_map(
                    {
                        uid: json_object([("memoryBlocks", _blocks_json(blocks))] if blocks else [])
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
    checksum = struct_checksum(struct, "MemoryManagerCheckpoint", "encode_memory_manager_state")
    members = _memory_json_members(body, with_pod_entries=False)
    return json_object([*members, ("checksum", str(checksum))])


def encode_memory_manager_state_v3(
    policy_name: str,
    machine_state: Mapping[int, NumaNodeMemoryState],
    entries: Mapping[str, Mapping[str, Sequence[MemoryBlock]]],
    pod_entries: Mapping[str, Sequence[MemoryBlock]],
) -> str:
    """The v3 text (1.37): a classic top level with its own checksum, plus `data` and `dataChecksum`."""
    body = _memory_body(policy_name, machine_state, entries, pod_entries)
    data = json_object(_memory_json_members(body, with_pod_entries=True))
    data_checksum = string_checksum(data, "encode_memory_manager_state_v3")
    classic = _memory_checkpoint_struct(body, with_pod_entries=False)
    checksum = struct_checksum(classic, "MemoryManagerCheckpoint", "encode_memory_manager_state_v3")
    return json_object(
        [
            *_memory_json_members(body, with_pod_entries=False),
            ("checksum", str(checksum)),
            ("data", json_string(data)),
            ("dataChecksum", str(data_checksum)),
        ]
    )
