"""RAPL energy counters through powercap (sys/class/powercap/intel-rapl:N[:M]); AMD uses the same tree."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rmd_agent.errors import HostReadError, Unsupported
from rmd_agent.hostfs import HostFS

POWERCAP = "sys/class/powercap"
# intel-rapl:0 is a package (socket) zone, intel-rapl:0:1 one of its subzones. intel-rapl-mmio:* repeats the
# package counter through another interface on newer parts and would double count, so it never matches.
_ZONE = re.compile(r"intel-rapl:(\d+(?::\d+)*)$")


@dataclass(frozen=True)
class RaplZone:
    zone_id: str  # directory name, e.g. "intel-rapl:0:1"
    name: str  # "package-0", "core", "uncore", "dram", "psys"
    socket: int  # first index of the zone id; psys has its own index
    parent: str | None  # zone_id of the containing zone, None for top-level zones
    energy_uj: int
    max_energy_range_uj: int

    @property
    def kind(self) -> str:
        """The zone kind without a socket suffix: package-0 -> package."""
        return re.sub(r"-\d+$", "", self.name)


def read_energy_uj(fs: HostFS, zone_id: str) -> int:
    return fs.read_int(f"{POWERCAP}/{zone_id}/energy_uj")


def read_rapl_zones(fs: HostFS) -> list[RaplZone] | Unsupported:
    """Every RAPL zone with a readable counter, parents first; Unsupported says why there are none."""
    if not fs.is_dir(POWERCAP):
        return Unsupported(f"no powercap in sysfs (/{POWERCAP} is absent: kernel without powercap, or a VM)")
    ids = [e for e in fs.listdir(POWERCAP) if _ZONE.match(e)]
    if not ids:
        return Unsupported(
            "no intel-rapl powercap zones (no RAPL on this CPU, a VM, or the driver is not loaded)"
        )
    zones = []
    try:
        for zone_id in sorted(ids, key=lambda z: [int(x) for x in z.split(":")[1:]]):
            base = f"{POWERCAP}/{zone_id}"
            indices = zone_id.split(":")[1:]
            zones.append(
                RaplZone(
                    zone_id=zone_id,
                    name=fs.read_str(f"{base}/name"),
                    socket=int(indices[0]),
                    parent="intel-rapl:" + ":".join(indices[:-1]) if len(indices) > 1 else None,
                    energy_uj=fs.read_int(f"{base}/energy_uj"),
                    max_energy_range_uj=fs.read_int(f"{base}/max_energy_range_uj"),
                )
            )
    except HostReadError as exc:
        # energy_uj has been root-only since the PLATYPUS fix; say so rather than "file not found".
        return Unsupported(f"RAPL counters are not readable: {exc}")
    return zones
