"""RmdWorkload spec <-> rmd.agent.v1.WorkloadSpec: the one reading and the one writing of the spec layouts.

rmd-operator had two spec layouts, and manifests of both are still around:

    v0.1   spec.cache {max, min}       spec.pstate {ratio, monitoring}
    v0.3   spec.rdt.cache {max, min}   spec.plugins.pstate {ratio, monitoring}   (+ spec.rdt.mba)

They mean the same, so `parse_spec` turns either into one WorkloadSpec: the operator reads an RmdWorkload
with it and sends the result to the agents, which build their workload from the message and never see a spec
layout (so the v0.1 layout ends here). `resource_fields` writes a WorkloadSpec's policy, cache, MBA and
P-state back in the v0.3 layout, as an RmdWorkload's status shows what a node enforces.

A cache object counts unset max/min as 0 (as the CRD says); no cache object at all is "no cache request" (the
agent treats it as the shared pool, as RMD did). Cpu lists are canonicalised ("0-3", "8" -> "0-3,8") so equal
requests compare equal. The P-state ratio is a decimal string in the CRD (rmd-operator's), a double on the
wire, where 0 means "no ratio". Numbers outside rmd_api.limits are refused, as the CRD refuses them (an object
stored before the CRD had its ranges still gets a clear InvalidSpec). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rmd_api.agent.v1 import agent_pb2
from rmd_api.cpuset import CpuListError, format_cpu_list, parse_cpu_list_entries
from rmd_api.limits import CACHE_WAYS, MBA_MBPS, MBA_PERCENTAGE, PSTATE_RATIO

_MONITORING = {"on": True, "off": False}
_MBA_UNITS = {"percentage": MBA_PERCENTAGE, "mbps": MBA_MBPS}


class InvalidSpec(ValueError):
    """A spec that is not a workload request; the message names the field."""


def _section(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any] | None:
    value = parent.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"{path} must be an object, not {value!r}")
    return value


def _cpu_list(value: Any, path: str) -> list[str]:
    """Cpu-list entries as one canonical entry ([] for none)."""
    try:
        cpus = parse_cpu_list_entries(value, path)
    except CpuListError as exc:
        raise InvalidSpec(str(exc)) from None
    return [format_cpu_list(cpus)] if cpus else []


def _cache(spec: Mapping[str, Any], rdt: Mapping[str, Any]) -> agent_pb2.CacheRequest | None:
    v03 = _section(rdt, "cache", "spec.rdt.cache")
    v01 = _section(spec, "cache", "spec.cache")
    if v03 is not None and v01 is not None:
        raise InvalidSpec("spec.cache (v0.1 layout) and spec.rdt.cache (v0.3 layout) are mutually exclusive")
    cache, path = (v03, "spec.rdt.cache") if v03 is not None else (v01, "spec.cache")
    if cache is None:
        return None
    return agent_pb2.CacheRequest(
        max=CACHE_WAYS.require(f"{path}.max", cache.get("max", 0), InvalidSpec),
        min=CACHE_WAYS.require(f"{path}.min", cache.get("min", 0), InvalidSpec),
    )


def _mba(rdt: Mapping[str, Any]) -> agent_pb2.MbaRequest | None:
    mba = _section(rdt, "mba", "spec.rdt.mba")
    if mba is None:
        return None
    given = [unit for unit in ("percentage", "mbps") if mba.get(unit) is not None]
    if len(given) != 1:
        raise InvalidSpec("spec.rdt.mba: set exactly one of percentage or mbps")
    unit = given[0]
    value = _MBA_UNITS[unit].require(f"spec.rdt.mba.{unit}", mba[unit], InvalidSpec)
    return (
        agent_pb2.MbaRequest(percentage=value) if unit == "percentage" else agent_pb2.MbaRequest(mbps=value)
    )


def _pstate(spec: Mapping[str, Any], plugins: Mapping[str, Any]) -> agent_pb2.PstateRequest | None:
    v03 = _section(plugins, "pstate", "spec.plugins.pstate")
    v01 = _section(spec, "pstate", "spec.pstate")
    if v03 is not None and v01 is not None:
        raise InvalidSpec(
            "spec.pstate (v0.1 layout) and spec.plugins.pstate (v0.3 layout) are mutually exclusive"
        )
    pstate, path = (v03, "spec.plugins.pstate") if v03 is not None else (v01, "spec.pstate")
    if pstate is None:
        return None
    request = agent_pb2.PstateRequest()
    if pstate.get("ratio") is not None:
        # A string in the CRD, for compatibility with rmd-operator ("3.0"); numbers are accepted too.
        request.ratio = PSTATE_RATIO.require(f"{path}.ratio", pstate["ratio"], InvalidSpec)
    monitoring = pstate.get("monitoring")
    if monitoring is not None:
        if not isinstance(monitoring, str) or monitoring not in _MONITORING:  # a list is not even hashable
            raise InvalidSpec(f'{path}.monitoring must be "on" or "off", not {monitoring!r}')
        request.monitoring = _MONITORING[monitoring]
    return request


def parse_spec(spec: Mapping[str, Any]) -> agent_pb2.WorkloadSpec:
    """The request of an RmdWorkload's spec (either layout; fields that are not the request, such as nodes,
    are ignored). InvalidSpec if malformed."""
    if not isinstance(spec, Mapping):
        raise InvalidSpec(f"spec must be an object, not {spec!r}")
    rdt = _section(spec, "rdt", "spec.rdt") or {}
    plugins = _section(spec, "plugins", "spec.plugins") or {}
    all_cores = spec.get("allCores", False)
    if not isinstance(all_cores, bool):
        raise InvalidSpec(f"spec.allCores must be true or false, not {all_cores!r}")
    policy = spec.get("policy") or ""
    if not isinstance(policy, str):
        raise InvalidSpec(f"spec.policy must be a string, not {policy!r}")
    out = agent_pb2.WorkloadSpec(
        core_ids=_cpu_list(spec.get("coreIds"), "spec.coreIds"),
        all_cores=all_cores,
        reserved_core_ids=_cpu_list(spec.get("reservedCoreIds"), "spec.reservedCoreIds"),
        policy=policy,
    )
    if not out.all_cores and not out.core_ids:
        raise InvalidSpec("spec.coreIds or spec.allCores: true is required: a workload needs cpus")
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


def resource_fields(spec: agent_pb2.WorkloadSpec) -> dict[str, Any]:
    """The spec's policy, rdt and plugins in the v0.3 layout; parts absent from the message are left out."""
    out: dict[str, Any] = {}
    if spec.policy:
        out["policy"] = spec.policy
    rdt: dict[str, Any] = {}
    if spec.HasField("cache"):
        rdt["cache"] = {"max": spec.cache.max, "min": spec.cache.min}
    unit = spec.mba.WhichOneof("value") if spec.HasField("mba") else None
    if unit is not None:
        rdt["mba"] = {unit: getattr(spec.mba, unit)}
    if rdt:
        out["rdt"] = rdt
    if spec.HasField("pstate"):
        # rmd-operator wrote the monitoring value into ratio; each goes in its own field here.
        monitoring = spec.pstate.monitoring if spec.pstate.HasField("monitoring") else True  # unset: on
        pstate: dict[str, Any] = {"monitoring": "on" if monitoring else "off"}
        if spec.pstate.ratio:
            pstate["ratio"] = repr(spec.pstate.ratio)  # shortest exact form: 3.0 -> "3.0", 1.5 -> "1.5"
        out["plugins"] = {"pstate": pstate}
    return out
