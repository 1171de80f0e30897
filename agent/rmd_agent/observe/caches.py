"""L3 caches: one entry per cache domain, with the CPUs sharing it (sys/devices/system/cpu/cpuN/cache)."""

from __future__ import annotations

from dataclasses import dataclass

from rmd_agent.errors import HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.observe.cpus import CPU_DIR, read_online_cpus
from rmd_api.cpuset import CpuListError, parse_cpu_list


@dataclass(frozen=True)
class L3Cache:
    id: int  # the domain id resctrl uses in schemata ("L3:<id>=<mask>")
    cpus: frozenset[int]
    ways: int  # ways of associativity as sysfs reports it
    size_bytes: int


def _size_bytes(text: str) -> int:
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    text = text.strip()
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def read_l3_caches(fs: HostFS) -> list[L3Cache] | Unsupported:
    """Distinct L3 caches sorted by id. Each is found through the first online CPU that reports it; the CPUs
    it lists as sharing it are not read again (on 256 CPUs, 2 directories read instead of 256)."""
    online = read_online_cpus(fs)
    if isinstance(online, Unsupported):
        return online
    caches: dict[int, L3Cache] = {}
    covered: set[int] = set()
    try:
        for cpu in sorted(online):
            if cpu in covered:
                continue
            base = f"{CPU_DIR}/cpu{cpu}/cache"
            if not fs.is_dir(base):
                continue
            for index in fs.listdir(base):
                path = f"{base}/{index}"
                if not index.startswith("index") or fs.read_int(f"{path}/level") != 3:
                    continue
                cache_id = fs.read_int(f"{path}/id")
                if cache_id not in caches:
                    caches[cache_id] = L3Cache(
                        id=cache_id,
                        cpus=parse_cpu_list(fs.read_text(f"{path}/shared_cpu_list")),
                        ways=fs.read_int(f"{path}/ways_of_associativity"),
                        size_bytes=_size_bytes(fs.read_text(f"{path}/size")),
                    )
                covered |= caches[cache_id].cpus
    except (HostReadError, CpuListError, ValueError) as exc:
        return Unsupported(f"cannot read L3 cache information: {exc}")
    if not caches:
        return Unsupported("no L3 cache is described in sysfs (cpuN/cache/index*/level == 3)")
    return [caches[i] for i in sorted(caches)]
