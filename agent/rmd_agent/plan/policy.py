"""RMD policies: named bundles of resource values (gold, silver, bronze) with values per CPU platform.

A workload may name a policy instead of cache ways; the node's platform picks the values, so "gold" means
4 guaranteed ways on Skylake and 2 on Broadwell (RMD's shipped values). Unlike RMD, an unknown platform is not
an error: it gets the "default" section, so policies work on any CPU that has RDT.

The policy file is YAML, one section per platform plus "default":

    default:
      gold:   {cache: {max: 2, min: 2}}
      silver: {cache: {max: 2, min: 1}}
      bronze: {cache: {max: 0, min: 0}}
    skylake:
      gold:   {cache: {max: 4, min: 4}, mba: {percentage: 80}, pstate: {ratio: 3.0}}

RMD's own policy.yaml shape (each platform a list of one-key maps, keys in any case) is accepted too. A file
overrides the built-in values policy by policy: sections and policies it does not name keep their defaults,
and a platform section the built-ins lack starts from the default section.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rmd_agent.errors import ConfigError
from rmd_api.limits import CACHE_WAYS, MBA_MBPS, MBA_PERCENTAGE, PSTATE_RATIO

DEFAULT_PLATFORM = "default"


@dataclass(frozen=True)
class Policy:
    """The values a policy gives a workload. Cache ways are required; the rest only apply when set."""

    name: str
    cache_max: int
    cache_min: int
    mba_percentage: int | None = None
    mba_mbps: int | None = None
    pstate_ratio: float | None = None
    pstate_monitoring: str | None = None  # "on" or "off"


# RMD's etc/rmd/policy.yaml values. "default" uses the smallest (Broadwell) values: they fit the default pools
# of any cache with at least 8 ways, which is every CPU with L3 CAT.
BUILTIN_POLICIES: Mapping[str, Mapping[str, Policy]] = {
    DEFAULT_PLATFORM: {
        "gold": Policy("gold", 2, 2),
        "silver": Policy("silver", 2, 1),
        "bronze": Policy("bronze", 0, 0),
    },
    "broadwell": {
        "gold": Policy("gold", 2, 2),
        "silver": Policy("silver", 2, 1),
        "bronze": Policy("bronze", 0, 0),
    },
    "skylake": {
        "gold": Policy("gold", 4, 4),
        "silver": Policy("silver", 3, 1),
        "bronze": Policy("bronze", 0, 0),
    },
}


@dataclass(frozen=True)
class PolicyBook:
    """Policies per platform. `for_platform` falls back to the "default" section for unknown platforms."""

    platforms: Mapping[str, Mapping[str, Policy]] = field(default_factory=lambda: BUILTIN_POLICIES)

    def for_platform(self, platform: str | None) -> Mapping[str, Policy]:
        if platform and platform in self.platforms:
            return self.platforms[platform]
        return self.platforms.get(DEFAULT_PLATFORM, {})


# Intel family 6 models, after RMD's utils/cpu/microarch.go signatures (Cascade Lake shares Skylake-SP's 85).
_INTEL_MODELS = {
    **dict.fromkeys((61, 71, 79, 86), "broadwell"),
    **dict.fromkeys((78, 85, 94), "skylake"),
    **dict.fromkeys((142, 158), "kabylake"),
}


def platform_for_cpu(vendor: str, family: int, model: int) -> str | None:
    """The policy platform of a CPU model; None when RMD does not name it (the default section applies)."""
    if vendor == "GenuineIntel" and family == 6:
        return _INTEL_MODELS.get(model)
    return None


def platform_from_cpuinfo(cpuinfo: str) -> str | None:
    """The platform of the first processor listed in /proc/cpuinfo text."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    try:
        return platform_for_cpu(fields.get("vendor_id", ""), int(fields["cpu family"]), int(fields["model"]))
    except (KeyError, ValueError):
        return None


# -- parsing -------------------------------------------------------------------------------------------------


def _lower_keys(value: Any, source: str, done: dict[int, Any] | None = None) -> Any:
    """viper (RMD's config library) lower-cases keys, and RMD's shipped file relies on it ("Min:").

    YAML aliases make the document a graph: each node is converted once (`done`, by identity), so a file of a
    few hundred bytes whose aliases stand for millions of nodes stays as small as its text, and a node that
    contains itself is refused."""
    if not isinstance(value, Mapping | list):
        return value
    done = {} if done is None else done
    if id(value) in done:
        if done[id(value)] is None:
            raise ConfigError(f"{source}: a YAML alias refers to itself (from inside its own anchor)")
        return done[id(value)]
    done[id(value)] = None  # in progress
    if isinstance(value, Mapping):
        lowered: Any = {str(k).lower(): _lower_keys(v, source, done) for k, v in value.items()}
    else:
        lowered = [_lower_keys(v, source, done) for v in value]
    done[id(value)] = lowered
    return lowered


def _merge_list(value: Any, where: str) -> Mapping[str, Any]:
    """RMD writes mappings as lists of one-key maps ("- gold:"); fold those into one mapping."""
    if isinstance(value, Mapping):
        return value
    if isinstance(value, list) and all(isinstance(item, Mapping) for item in value):
        merged: dict[str, Any] = {}
        for item in value:
            for key, sub in item.items():
                if key in merged:
                    raise ConfigError(f"{where}: {key!r} is given twice")
                merged[key] = sub
        return merged
    raise ConfigError(f"{where} must be a mapping, not {type(value).__name__}")


def _check_keys(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(allowed)})")


def _parse_policy(name: str, raw: Any, where: str) -> Policy:
    data = _merge_list(raw, where)
    _check_keys(data, ("cache", "mba", "pstate"), where)
    if "cache" not in data:
        raise ConfigError(f"{where}: a policy needs cache: {{max: N, min: N}} (max: 0, min: 0 for shared)")
    cache = _merge_list(data["cache"], f"{where}.cache")
    _check_keys(cache, ("max", "min"), f"{where}.cache")
    if "max" not in cache or "min" not in cache:
        raise ConfigError(f"{where}.cache needs both max and min")
    cache_max = CACHE_WAYS.require(f"{where}.cache.max", cache["max"], ConfigError)
    cache_min = CACHE_WAYS.require(f"{where}.cache.min", cache["min"], ConfigError)
    if cache_min > cache_max or (cache_max > 0 and cache_min == 0):
        raise ConfigError(
            f"{where}.cache max={cache_max} min={cache_min} is not a pool: use max == min > 0 (guaranteed), "
            "max > min > 0 (best effort) or max == min == 0 (shared)"
        )
    percentage = mbps = None
    if "mba" in data:
        mba = _merge_list(data["mba"], f"{where}.mba")
        _check_keys(mba, ("percentage", "mbps"), f"{where}.mba")
        if len(mba) != 1:
            raise ConfigError(f"{where}.mba needs exactly one of percentage or mbps")
        if "percentage" in mba:
            percentage = MBA_PERCENTAGE.require(f"{where}.mba.percentage", mba["percentage"], ConfigError)
        else:
            mbps = MBA_MBPS.require(f"{where}.mba.mbps", mba["mbps"], ConfigError)
        if not cache_max == cache_min > 0:
            raise ConfigError(
                f"{where}: mba needs guaranteed cache (max == min > 0), not max={cache_max} min={cache_min}"
            )
    ratio = monitoring = None
    if "pstate" in data:
        pstate = _merge_list(data["pstate"], f"{where}.pstate")
        _check_keys(pstate, ("ratio", "monitoring"), f"{where}.pstate")
        if "ratio" in pstate:
            ratio = PSTATE_RATIO.require(f"{where}.pstate.ratio", pstate["ratio"], ConfigError)
        if "monitoring" in pstate:
            # YAML 1.1 reads a bare on/off as a boolean
            raw_mon = pstate["monitoring"]
            if isinstance(raw_mon, bool):
                raw_mon = "on" if raw_mon else "off"
            if raw_mon not in ("on", "off"):
                raise ConfigError(f'{where}.pstate.monitoring must be "on" or "off", not {raw_mon!r}')
            monitoring = str(raw_mon)
    return Policy(name, cache_max, cache_min, percentage, mbps, ratio, monitoring)


def parse_policies(
    data: Any, source: str = "policy file", base: Mapping[str, Mapping[str, Policy]] = BUILTIN_POLICIES
) -> PolicyBook:
    """Policies from a parsed YAML document, merged over `base` policy by policy. ConfigError names the
    offending path ("policy.yaml: skylake.gold.cache.max must be ...")."""
    if data is None:
        return PolicyBook(base)
    platforms = _merge_list(_lower_keys(data, source), source)
    merged: dict[str, dict[str, Policy]] = {name: dict(table) for name, table in base.items()}
    # The default section first: a platform new to `base` starts from it.
    for platform in sorted(platforms, key=lambda p: p != DEFAULT_PLATFORM):
        raw_table = platforms[platform]
        if raw_table is None:
            raise ConfigError(f"{source}: platform {platform!r} has no policies")
        table = _merge_list(raw_table, f"{source}: {platform}")
        target = merged.setdefault(platform, dict(merged.get(DEFAULT_PLATFORM, {})))
        for name, raw in table.items():
            target[name] = _parse_policy(name, raw, f"{source}: {platform}.{name}")
    return PolicyBook(merged)
