"""RAPL energy per socket and zone from powercap, as wraparound-corrected deltas.

Zones (reference power-telemetry-kepler-wao.md §1): `intel-rapl:N` is a socket's package (or the platform's
`psys`), `intel-rapl:N:M` its subzones (`core`, `uncore`, `dram`). AMD exposes the same tree under the same
control type. `intel-rapl-mmio:*` repeats the package counter and is never read (observe/rapl.py skips it).

Overlap, which is why zones are reported side by side and never summed blindly: `package` contains `core`
and `uncore`; `dram` is outside the package on the parts RAPL covers; `psys` covers the whole platform.
`host_zone_kinds` picks a set that does not overlap (psys, else package + dram) for a node total.

Wraparound: `energy_uj` counts modulo `max_energy_range_uj`; one wrap between two reads is corrected. The
counter wraps in minutes at high power (about 22 min at 200 W for the common 262 kJ range), so any sampling
interval under a minute is safe.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rmd_agent.errors import Unsupported
from rmd_agent.hostfs import HostFS, read_small
from rmd_agent.observe.rapl import POWERCAP, read_rapl_zones
from rmd_agent.power.attribution import ZoneKey

ZONE_KINDS = ("package", "core", "uncore", "dram", "psys")
# zone kind -> the kinds whose energy it already includes
CONTAINS: Mapping[str, frozenset[str]] = {
    "package": frozenset({"core", "uncore"}),
    "psys": frozenset({"package", "core", "uncore", "dram"}),
}
# Older kernels and Kepler name the power planes PP0/PP1.
_ALIASES = {"pp0": "core", "pp1": "uncore"}
PLATFORM = ""  # the socket label of psys, which belongs to no socket


def zone_kind(name: str) -> str:
    """The zone kind from a powercap `name`: "package-1" -> "package", "PP0" -> "core"."""
    kind = re.sub(r"-\d+$", "", name.strip().lower())
    return _ALIASES.get(kind, kind)


def overlaps(a: str, b: str) -> bool:
    """Whether one zone kind's energy includes the other's (or they are the same kind)."""
    return a == b or b in CONTAINS.get(a, frozenset()) or a in CONTAINS.get(b, frozenset())


def host_zone_kinds(kinds: Iterable[str]) -> tuple[str, ...]:
    """Zone kinds whose sum is the host's RAPL energy without double counting: psys when the platform has
    it, else package + dram, else whatever top-level kinds exist (never a zone inside a chosen one)."""
    present = set(kinds)
    if "psys" in present:
        return ("psys",)
    chosen: list[str] = []
    for kind in sorted(present, key=lambda k: (ZONE_KINDS.index(k) if k in ZONE_KINDS else 99, k)):
        if not any(overlaps(kind, other) for other in chosen):
            chosen.append(kind)
    return tuple(chosen)


def counter_delta(previous: int, current: int, max_range: int) -> int:
    """Energy (µJ) between two readings of a counter that wraps modulo `max_range`.

    One wrap is assumed when the counter went down. Without a usable range (0, or a reading beyond it) a
    decrease cannot be corrected and counts as nothing rather than as a huge bogus value.
    """
    if current >= previous:
        return current - previous
    if max_range <= 0 or previous >= max_range or current >= max_range:
        return 0
    return max_range - previous + current


@dataclass(frozen=True)
class RaplZoneSource:
    """A zone to read: its powercap id, the key it is reported under, the wrap range, the resolved file."""

    zone_id: str
    key: ZoneKey
    max_range_uj: int
    energy_path: str


@dataclass
class EnergyCounters:
    """Per-zone previous readings; turns successive readings into wrap-corrected deltas. Pure."""

    max_range_uj: dict[str, int] = field(default_factory=dict)
    previous_uj: dict[str, int] = field(default_factory=dict)

    def update(self, readings: Mapping[str, int]) -> dict[str, int]:
        """Deltas (µJ) of the zones read now and before. A zone read for the first time is a baseline
        (no delta); a zone missing from `readings` keeps its previous value, so its next delta spans both
        intervals instead of losing energy."""
        deltas: dict[str, int] = {}
        for zone_id, value in readings.items():
            previous = self.previous_uj.get(zone_id)
            if previous is not None:
                deltas[zone_id] = counter_delta(previous, value, self.max_range_uj.get(zone_id, 0))
            self.previous_uj[zone_id] = value
        return deltas


@dataclass(frozen=True)
class RaplReading:
    energy_uj: dict[str, int]  # zone id -> counter, for the zones that could be read
    errors: tuple[str, ...] = ()  # "<zone id>: <reason>" for those that could not


class RaplSampler:
    """Discovers the node's RAPL zones once and reads their counters on every `read()`.

    `status` is None when zones were found, else the reason (no powercap, a VM, permissions); the caller
    retries `discover()` now and then, since a module can be loaded or a mount fixed while the agent runs.
    """

    def __init__(self, fs: HostFS) -> None:
        self.fs = fs
        self.zones: tuple[RaplZoneSource, ...] = ()
        self.status: Unsupported | None = Unsupported("RAPL zones not discovered yet")
        self.counters = EnergyCounters()

    def discover(self) -> Unsupported | None:
        found = read_rapl_zones(self.fs)
        if isinstance(found, Unsupported):
            self.zones, self.status = (), found
            return found
        zones: list[RaplZoneSource] = []
        seen: set[ZoneKey] = set()
        for zone in found:
            kind = zone_kind(zone.name)
            key = ZoneKey(kind, PLATFORM if kind == "psys" else str(zone.socket))
            if key in seen:  # a second counter for the same socket and zone would double count it
                continue
            seen.add(key)
            path = os.path.realpath(self.fs.path(f"{POWERCAP}/{zone.zone_id}/energy_uj"))
            zones.append(RaplZoneSource(zone.zone_id, key, zone.max_energy_range_uj, path))
        self.zones = tuple(zones)
        self.counters = EnergyCounters(max_range_uj={z.zone_id: z.max_range_uj for z in zones})
        self.status = None
        return None

    def read(self) -> RaplReading:
        values: dict[str, int] = {}
        errors: list[str] = []
        for zone in self.zones:
            try:
                values[zone.zone_id] = int(read_small(zone.energy_path))
            except (OSError, ValueError) as exc:
                errors.append(f"{zone.zone_id}: {exc}")
        return RaplReading(values, tuple(errors))

    def sample(self) -> tuple[dict[ZoneKey, int], RaplReading]:
        """Read every zone; the wrap-corrected µJ since the previous sample per zone key, and the reading."""
        reading = self.read()
        by_id = {z.zone_id: z.key for z in self.zones}
        deltas = self.counters.update(reading.energy_uj)
        return {by_id[zone_id]: delta for zone_id, delta in deltas.items()}, reading
