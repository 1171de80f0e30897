"""The agent's durable record of what it enforces on its node: a small JSON file (docs/durability.md).

It holds the workload registry (each request as given, the resolved workload last enforced, a stable id, in
the order workloads were accepted), the names of the resctrl groups this agent created (the only groups it
ever changes or removes), the original cpufreq limits of CPUs under a P-state monitor, and a format version.

Every save replaces the file atomically: the new content goes to a temporary file in the same directory,
which is fsynced, renamed over the old file, and the directory is fsynced; a crash leaves either the old or
the new file, never a mix. A file that cannot be parsed is refused (StateError) instead of guessed at: an
agent that started from a wrong registry would remove groups it should keep, or forget groups it owns. No
backup copy is kept, since the atomic replace never leaves a torn file behind; a broken file means outside
damage, and the error says how to recover.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmd_agent.errors import AgentError
from rmd_agent.plan.workload import Workload
from rmd_agent.pstate.policy import FreqLimits
from rmd_api.cpuset import CpuListError, format_cpu_list, parse_cpu_list

STATE_FORMAT = "rmd-agent-state"
STATE_VERSION = 1

_CPU_SET_FIELDS = frozenset({"core_ids", "reserved_core_ids"})
_WORKLOAD_FIELDS = {f.name: f for f in dataclasses.fields(Workload)}
# JSON types each Workload field may hold (None where the field is optional)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "namespace": (str,),
    "name": (str,),
    "uid": (str,),
    "all_cores": (bool,),
    "resolved": (bool,),
    "cache_max": (int, type(None)),
    "cache_min": (int, type(None)),
    "mba_percentage": (int, type(None)),
    "mba_mbps": (int, type(None)),
    "policy": (str, type(None)),
    "pstate_ratio": (float, int, type(None)),
    "pstate_monitoring": (str, type(None)),
}


class StateError(AgentError):
    """The state file exists but cannot be trusted (not JSON, another format or version, malformed)."""


@dataclass(frozen=True)
class WorkloadRecord:
    """One workload in the registry. `resolved` is the workload as last enforced (None while it is not)."""

    id: str
    request: Workload
    resolved: Workload | None = None

    @property
    def key(self) -> str:
        return self.request.key


@dataclass(frozen=True)
class AgentState:
    workloads: tuple[WorkloadRecord, ...] = ()  # in the order they were first accepted
    owned_groups: frozenset[str] = frozenset()  # resctrl groups this agent created
    pstate_originals: Mapping[int, FreqLimits] = field(default_factory=dict)  # CPU -> limits before us
    next_id: int = 1

    def find(self, key: str) -> WorkloadRecord | None:
        return next((r for r in self.workloads if r.key == key), None)

    def with_record(self, record: WorkloadRecord) -> AgentState:
        """The registry with `record` added at the end, or in place of the record with the same key."""
        if self.find(record.key) is None:
            return dataclasses.replace(self, workloads=(*self.workloads, record))
        return dataclasses.replace(
            self, workloads=tuple(record if r.key == record.key else r for r in self.workloads)
        )

    def with_request(self, request: Workload) -> AgentState:
        """The registry asking for `request`: a changed request of the same object (uid) keeps its record id
        and last resolution, a new object of that name gets the next id; an unchanged one, this registry."""
        old = self.find(request.key)
        if old is not None and old.request == request:
            return self
        if old is not None and old.request.uid == request.uid:
            return self.with_record(WorkloadRecord(old.id, request, old.resolved))
        renewed = self.with_record(WorkloadRecord(str(self.next_id), request, None))
        return dataclasses.replace(renewed, next_id=self.next_id + 1)

    def without(self, key: str) -> AgentState:
        return dataclasses.replace(self, workloads=tuple(r for r in self.workloads if r.key != key))


# -- encoding ------------------------------------------------------------------------------------------------


def workload_to_json(w: Workload) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _WORKLOAD_FIELDS:
        value = getattr(w, name)
        out[name] = format_cpu_list(value) if name in _CPU_SET_FIELDS else value
    return out


def workload_from_json(data: Any, where: str) -> Workload:
    if not isinstance(data, dict):
        raise StateError(f"{where} must be an object, not {type(data).__name__}")
    unknown = sorted(set(data) - set(_WORKLOAD_FIELDS))
    if unknown:
        raise StateError(f"{where} has unknown field(s) {', '.join(unknown)}")
    for required in ("namespace", "name"):
        if not isinstance(data.get(required), str):
            raise StateError(f"{where}.{required} must be a string")
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name in _CPU_SET_FIELDS:
            if not isinstance(value, str):
                raise StateError(f"{where}.{name} must be a cpu list string, not {value!r}")
            try:
                values[name] = parse_cpu_list(value)
            except CpuListError as exc:
                raise StateError(f"{where}.{name}: {exc}") from None
            continue
        allowed = _FIELD_TYPES.get(name, ())
        wrong_bool = isinstance(value, bool) and bool not in allowed
        if not isinstance(value, allowed) or wrong_bool:
            raise StateError(f"{where}.{name} has the wrong type: {value!r}")
        if name == "pstate_ratio" and isinstance(value, int):
            value = float(value)  # json writes 3.0 as 3.0, but a hand-edited 3 means the same
        values[name] = value
    return Workload(**values)


def state_to_json(state: AgentState) -> dict[str, Any]:
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "next_id": state.next_id,
        "workloads": [
            {
                "id": r.id,
                "request": workload_to_json(r.request),
                "resolved": None if r.resolved is None else workload_to_json(r.resolved),
            }
            for r in state.workloads
        ],
        "owned_groups": sorted(state.owned_groups),
        "pstate_originals": {
            str(cpu): {"min_khz": lim.min_khz, "max_khz": lim.max_khz}
            for cpu, lim in sorted(state.pstate_originals.items())
        },
    }


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StateError(f"{where} must be an integer, not {value!r}")
    return value


def state_from_json(data: Any) -> AgentState:
    """Parse a decoded state document. StateError naming the offending field if it is not one we wrote."""
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        raise StateError(f'not an rmd-agent state file (no "format": "{STATE_FORMAT}")')
    version = data.get("version")
    if version != STATE_VERSION:
        raise StateError(
            f"state format version {version!r} is not {STATE_VERSION}, the only one this agent reads "
            "(written by another agent version?)"
        )
    raw_workloads = data.get("workloads", [])
    if not isinstance(raw_workloads, list):
        raise StateError("workloads must be a list")
    records = []
    for i, item in enumerate(raw_workloads):
        where = f"workloads[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise StateError(f"{where} must be an object with a string id")
        request = workload_from_json(item.get("request"), f"{where}.request")
        raw_resolved = item.get("resolved")
        resolved = None if raw_resolved is None else workload_from_json(raw_resolved, f"{where}.resolved")
        records.append(WorkloadRecord(item["id"], request, resolved))
    keys = [r.key for r in records]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise StateError(f"workload(s) listed twice: {', '.join(repeated)}")
    owned = data.get("owned_groups", [])
    if not isinstance(owned, list) or not all(isinstance(n, str) and n for n in owned):
        raise StateError("owned_groups must be a list of group names")
    raw_originals = data.get("pstate_originals", {})
    if not isinstance(raw_originals, dict):
        raise StateError("pstate_originals must be an object")
    originals = {}
    for cpu, limits in raw_originals.items():
        where = f"pstate_originals[{cpu!r}]"
        if not str(cpu).isdigit() or not isinstance(limits, dict):
            raise StateError(f"{where} must map a CPU number to {{min_khz, max_khz}}")
        originals[int(cpu)] = FreqLimits(
            _int(limits.get("min_khz"), f"{where}.min_khz"), _int(limits.get("max_khz"), f"{where}.max_khz")
        )
    return AgentState(
        workloads=tuple(records),
        owned_groups=frozenset(owned),
        pstate_originals=originals,
        next_id=_int(data.get("next_id", 1), "next_id"),
    )


# -- the file ------------------------------------------------------------------------------------------------


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StateStore:
    """The state file at `path`. Not thread-safe: the engine serialises its mutations."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.saves = 0  # files written by this store (tests count them)
        self._last: AgentState | None = None

    def load(self) -> AgentState:
        """The saved state; an empty state if there is no file yet. StateError if the file is unusable."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            self._last = AgentState()
            return self._last
        except (OSError, UnicodeDecodeError) as exc:
            raise StateError(f"cannot read the state file {self.path}: {exc}") from None
        try:
            state = state_from_json(json.loads(text))
        except (json.JSONDecodeError, StateError) as exc:
            raise StateError(
                f"the state file {self.path} is unusable ({exc}); the agent will not guess what it owns. "
                "To start over, delete the file and the rmd- groups under /sys/fs/resctrl (they are "
                "recreated as workloads are applied again)"
            ) from None
        self._last = state
        return state

    def save(self, state: AgentState) -> bool:
        """Replace the file with `state` atomically and durably; False (and no write) if it is unchanged."""
        if state == self._last:
            return False
        text = json.dumps(state_to_json(state), indent=1, sort_keys=True) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = text.encode()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)
        self._last = state
        self.saves += 1
        return True
