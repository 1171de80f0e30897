"""RmdWorkload spec -> the agent's normalised WorkloadSpec. Pure: no I/O.

rmd-operator had two spec layouts, and manifests of both are still around:

    v0.1   spec.cache {max, min}       spec.pstate {ratio, monitoring}
    v0.3   spec.rdt.cache {max, min}   spec.plugins.pstate {ratio, monitoring}   (+ spec.rdt.mba)

They mean the same, so both become one WorkloadSpec. A cache object counts unset max/min as 0 (as the CRD
says); no cache object at all is "no cache request" (the agent treats it as the shared pool, as RMD did).
Cpu lists are canonicalised ("0-3", "8" -> "0-3,8") so equal requests compare equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rmd_api.agent.v1 import agent_pb2
from rmd_api.cpuset import CpuListError, format_cpu_list, parse_cpu_list_entries
from rmd_operator.errors import SpecError

_MONITORING = {"on": True, "off": False}


@dataclass(frozen=True)
class Requirements:
    """What a node must support for the workload to mean anything there."""

    rdt_l3_cat: bool  # cache ways (max > 0) or a policy: needs L3 cache allocation
    mba: bool  # memory bandwidth allocation


def _section(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any] | None:
    value = parent.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError(f"{path} must be an object, not {value!r}")
    return value


def _cpu_list(value: Any, path: str) -> list[str]:
    """Cpu-list entries as one canonical entry ([] for none)."""
    try:
        cpus = parse_cpu_list_entries(value, path)
    except CpuListError as exc:
        raise SpecError(str(exc)) from None
    return [format_cpu_list(cpus)] if cpus else []


def _count(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{path} must be a non-negative integer, not {value!r}")
    return value


def _cache(spec: Mapping[str, Any], rdt: Mapping[str, Any]) -> agent_pb2.CacheRequest | None:
    v03 = _section(rdt, "cache", "spec.rdt.cache")
    v01 = _section(spec, "cache", "spec.cache")
    if v03 is not None and v01 is not None:
        raise SpecError("spec.cache (v0.1 layout) and spec.rdt.cache (v0.3 layout) are mutually exclusive")
    cache, path = (v03, "spec.rdt.cache") if v03 is not None else (v01, "spec.cache")
    if cache is None:
        return None
    return agent_pb2.CacheRequest(
        max=_count(cache.get("max", 0), f"{path}.max"), min=_count(cache.get("min", 0), f"{path}.min")
    )


def _mba(rdt: Mapping[str, Any]) -> agent_pb2.MbaRequest | None:
    mba = _section(rdt, "mba", "spec.rdt.mba")
    if mba is None:
        return None
    given = [unit for unit in ("percentage", "mbps") if mba.get(unit) is not None]
    if len(given) != 1:
        raise SpecError("spec.rdt.mba: set exactly one of percentage or mbps")
    unit = given[0]
    value = _count(mba[unit], f"spec.rdt.mba.{unit}")
    return (
        agent_pb2.MbaRequest(percentage=value) if unit == "percentage" else agent_pb2.MbaRequest(mbps=value)
    )


def _positive_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number > 0 and number != float("inf") else None  # NaN fails "> 0"


def _pstate(spec: Mapping[str, Any], plugins: Mapping[str, Any]) -> agent_pb2.PstateRequest | None:
    v03 = _section(plugins, "pstate", "spec.plugins.pstate")
    v01 = _section(spec, "pstate", "spec.pstate")
    if v03 is not None and v01 is not None:
        raise SpecError(
            "spec.pstate (v0.1 layout) and spec.plugins.pstate (v0.3 layout) are mutually exclusive"
        )
    pstate, path = (v03, "spec.plugins.pstate") if v03 is not None else (v01, "spec.pstate")
    if pstate is None:
        return None
    request = agent_pb2.PstateRequest()
    ratio = pstate.get("ratio")
    if ratio is not None:
        # A string in the CRD, for compatibility with rmd-operator ("3.0"); numbers are accepted too.
        value = _positive_float(ratio)
        if value is None:
            raise SpecError(f'{path}.ratio must be a positive decimal number such as "3.0", not {ratio!r}')
        request.ratio = value
    monitoring = pstate.get("monitoring")
    if monitoring is not None:
        if monitoring not in _MONITORING:
            raise SpecError(f'{path}.monitoring must be "on" or "off", not {monitoring!r}')
        request.monitoring = _MONITORING[monitoring]
    return request


def workload_spec(spec: Mapping[str, Any]) -> agent_pb2.WorkloadSpec:
    """The normalised request for an RmdWorkload's spec (either layout). SpecError if malformed."""
    if not isinstance(spec, Mapping):
        raise SpecError(f"spec must be an object, not {spec!r}")
    rdt = _section(spec, "rdt", "spec.rdt") or {}
    plugins = _section(spec, "plugins", "spec.plugins") or {}
    all_cores = spec.get("allCores", False)
    if not isinstance(all_cores, bool):
        raise SpecError(f"spec.allCores must be true or false, not {all_cores!r}")
    policy = spec.get("policy") or ""
    if not isinstance(policy, str):
        raise SpecError(f"spec.policy must be a string, not {policy!r}")
    out = agent_pb2.WorkloadSpec(
        core_ids=_cpu_list(spec.get("coreIds"), "spec.coreIds"),
        all_cores=all_cores,
        reserved_core_ids=_cpu_list(spec.get("reservedCoreIds"), "spec.reservedCoreIds"),
        policy=policy,
    )
    if not out.all_cores and not out.core_ids:
        raise SpecError("spec.coreIds or spec.allCores: true is required: a workload needs cpus")
    cache = _cache(spec, rdt)
    if cache is not None:
        out.cache.CopyFrom(cache)
    mba = _mba(rdt)
    if mba is not None:
        out.mba.CopyFrom(mba)
    pstate = _pstate(spec, plugins)
    if pstate is not None:
        out.pstate.CopyFrom(pstate)
    return out


def requirements(spec: agent_pb2.WorkloadSpec) -> Requirements:
    """What the request needs from a node. A request for no cache ways and no policy (a P-state only, or an
    explicit max=0 shared-pool request) restricts nothing in resctrl, so it does not need RDT: the agent
    accepts it on a node without cache allocation and says in its answer whether it could set the P-state."""
    wants_ways = spec.HasField("cache") and spec.cache.max > 0
    return Requirements(
        rdt_l3_cat=wants_ways or bool(spec.policy),
        mba=spec.HasField("mba") and spec.mba.WhichOneof("value") is not None,
    )


def workload_ref(namespace: str, name: str, uid: str) -> agent_pb2.WorkloadRef:
    """How agents know the workload: namespace/name plus the object's uid, so a re-created object of the same
    name is a different workload (rmd-operator matched by name only)."""
    return agent_pb2.WorkloadRef(namespace=namespace, name=name, uid=uid)
