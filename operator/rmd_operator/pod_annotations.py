"""A pod's cache annotations read into each container's settings, with every problem found, not only the
first (pure: pods.py turns them into requests and one Event).

Two key forms, which may be mixed:

* `<container>_<setting>`, rmd-operator's. Container names are DNS labels and never contain "_", so a key
  splits at its first "_", and the container part must equal the name (rmd-operator matched prefixes, so
  `c1_policy` also configured `c10`). The whole key is an annotation key's name part, at most 63 characters:
  the API server refuses it for a container name longer than 62 - len(setting) (48 for mba_percentage).
* `<container>.rmd.intel.com/<setting>`, for any container name. The prefix is a DNS subdomain (labels of up
  to 63 characters, 253 in all) and a container name is a DNS label; the setting keeps its spelling, since
  the name part, unlike a prefix, may hold "_".

A setting given in both forms with different values is a conflict: neither wins, the container's request is
invalid.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rmd_api import limits
from rmd_api.names import CACHE_WAYS_RESOURCE as CACHE_WAYS

DOMAIN = "rmd.intel.com"
_SUFFIX = f".{DOMAIN}"

POLICY = "policy"
CACHE_MIN = "cache_min"
MBA_PERCENTAGE = "mba_percentage"
MBA_MBPS = "mba_mbps"
PSTATE_RATIO = "pstate_ratio"
PSTATE_MONITORING = "pstate_monitoring"
SETTINGS = (POLICY, CACHE_MIN, MBA_PERCENTAGE, MBA_MBPS, PSTATE_RATIO, PSTATE_MONITORING)
POLICIES = ("gold", "silver", "bronze")

_RATIO = re.compile(limits.PSTATE_RATIO.pattern)  # the CRD's syntax for spec.plugins.pstate.ratio
_DIGITS = re.compile(r"[0-9]{1,10}")
_SHOWN = 40  # characters of a value quoted in a message: an annotation value may be 256 KiB


@dataclass(frozen=True)
class Given:
    """One annotation giving a setting."""

    key: str
    value: str

    def __str__(self) -> str:
        shown = self.value if len(self.value) <= _SHOWN else self.value[:_SHOWN]
        return f"{self.key}={shown!r}" + ("..." if len(self.value) > _SHOWN else "")


@dataclass(frozen=True)
class ContainerSettings:
    """One container's settings as RmdWorkload values (ContainerRequest's field names), or its problems."""

    values: Mapping[str, Any]
    problems: tuple[str, ...] = ()


def split_key(key: str) -> tuple[str, str] | None:
    """(container, setting) of a key in either form; None for keys that are not ours (another prefix). A key
    directly under rmd.intel.com has container ""."""
    prefix, slash, name = key.rpartition("/")
    if slash:
        if prefix == DOMAIN:
            return ("", name)
        return (prefix.removesuffix(_SUFFIX), name) if prefix.endswith(_SUFFIX) else None
    container, sep, setting = key.partition("_")
    return (container, setting) if sep else None


def gather(
    annotations: Mapping[str, Any], asking: Collection[str], names: Collection[str]
) -> tuple[dict[str, dict[str, list[Given]]], list[str]]:
    """(container -> setting -> the annotations giving it, the keys that look like ours but configure nothing
    and why). `asking`: the containers with the cache ways limit; `names`: all the pod's containers."""
    found: dict[str, dict[str, list[Given]]] = {}
    ignored = []
    for key, value in sorted((str(k), str(v)) for k, v in annotations.items()):
        split = split_key(key)
        if split is None:
            continue
        owner, setting = split
        if not owner:
            if setting in SETTINGS:
                ignored.append(f"{key}: names no container (the form is <container>.{DOMAIN}/{setting})")
        elif owner in asking and setting in SETTINGS:
            found.setdefault(owner, {}).setdefault(setting, []).append(Given(key, value))
        elif owner in asking:
            ignored.append(f"{key}: unknown setting {setting!r} (known: {', '.join(SETTINGS)})")
        elif setting in SETTINGS:
            why = f"does not request {CACHE_WAYS}" if owner in names else "is not a container of this pod"
            ignored.append(f"{key}: {owner!r} {why}")
    return found, ignored


class _Reader:
    """Reads one container's settings, noting every problem instead of stopping at the first."""

    def __init__(self, given: Mapping[str, Sequence[Given]]) -> None:
        self.problems: list[str] = []
        self.given: dict[str, Given] = {}
        for setting, each in given.items():
            values = {g.value.strip() for g in each}
            if len(values) > 1:
                both = " and ".join(str(g) for g in each)
                self.problems.append(f"annotations {both} disagree: give {setting} once")
            else:
                self.given[setting] = each[0]

    def count(self, setting: str, limit: limits.IntRange) -> int | None:
        given = self.given[setting]
        text = given.value.strip()
        if _DIGITS.fullmatch(text) and limit.contains(int(text)):
            return int(text)
        self.problems.append(f"annotation {given} must be a whole number from {limit.low} to {limit.high}")
        return None

    def choice(self, setting: str, choices: Sequence[str], rule: str) -> str | None:
        given = self.given[setting]
        if given.value.strip() in choices:
            return given.value.strip()
        self.problems.append(f"annotation {given} must be {rule}")
        return None

    def exclusive(self, one: str, other: str, why: str) -> None:
        if one in self.given and other in self.given:
            keys = sorted((self.given[one].key, self.given[other].key))
            self.problems.append(f"annotations {keys[0]} and {keys[1]} are mutually exclusive: {why}")


def container_settings(ways: int, given: Mapping[str, Sequence[Given]]) -> ContainerSettings:
    """The settings of a container with `ways` cache ways from the annotations giving them (gather())."""
    read = _Reader(given)
    values: dict[str, Any] = {}
    # False once the cache part is unknown (a conflict, a bad value): then MBA's need of it is not judged.
    cache_known = not any(s in given and s not in read.given for s in (POLICY, CACHE_MIN))
    policy_given = POLICY in read.given and bool(read.given[POLICY].value.strip())
    if policy_given:  # an empty policy is none, as in rmd-operator
        values[POLICY] = read.choice(POLICY, POLICIES, f"one of {', '.join(POLICIES)}")
        cache_known = cache_known and values[POLICY] is not None
    elif (POLICY in read.given or POLICY not in given) and not limits.CACHE_WAYS.contains(ways):
        # No policy (not a conflicting one): the limit becomes rdt.cache.max, which the CRD bounds.
        read.problems.append(
            f"the {CACHE_WAYS} limit (rdt.cache.max) must be an integer within {limits.CACHE_WAYS.low}.."
            f"{limits.CACHE_WAYS.high}, not {ways}"
        )
    if CACHE_MIN in read.given:
        if policy_given:
            read.exclusive(CACHE_MIN, POLICY, "the policy sets the cache ways")
            cache_known = False
        else:
            values[CACHE_MIN] = read.count(CACHE_MIN, limits.IntRange(1, ways))
            cache_known = cache_known and values[CACHE_MIN] is not None
    for setting, limit in ((MBA_PERCENTAGE, limits.MBA_PERCENTAGE), (MBA_MBPS, limits.MBA_MBPS)):
        if setting in read.given:
            values[setting] = read.count(setting, limit)
    read.exclusive(MBA_MBPS, MBA_PERCENTAGE, "give the memory bandwidth in one unit")
    if PSTATE_RATIO in read.given:
        values[PSTATE_RATIO] = _ratio(read)
    if PSTATE_MONITORING in read.given:
        values[PSTATE_MONITORING] = read.choice(PSTATE_MONITORING, ("on", "off"), '"on" or "off"')
    mba = next((s for s in (MBA_PERCENTAGE, MBA_MBPS) if values.get(s) is not None), None)
    if mba is not None and cache_known and not _guaranteed(values, ways):
        read.problems.append(
            f"memory bandwidth (annotation {read.given[mba].key}) needs guaranteed cache: {CACHE_MIN} "
            f"unset or equal to the {CACHE_WAYS} limit ({ways}), or policy gold"
        )
    if read.problems:
        return ContainerSettings({}, tuple(read.problems))
    return ContainerSettings({k: v for k, v in values.items() if v is not None})


def _ratio(read: _Reader) -> str | None:
    given = read.given[PSTATE_RATIO]
    text = given.value.strip()
    if _RATIO.fullmatch(text) and limits.PSTATE_RATIO.parse(text) is not None:
        return text
    read.problems.append(f"annotation {given} must be {limits.PSTATE_RATIO.rule}")
    return None


def _guaranteed(values: Mapping[str, Any], ways: int) -> bool:
    if values.get(POLICY) is not None:
        return bool(values[POLICY] == "gold")
    return values.get(CACHE_MIN) is None or values[CACHE_MIN] == ways
