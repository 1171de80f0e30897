"""Linux cpu-list syntax ("0-3,8,10-11"), as sysfs, resctrl's cpus_list and the kubelet use it, and the
kernel's hex cpumask ("ff,00000001") of sysfs and resctrl's cpus files."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

# Linux builds top out at 8192 CPUs (NR_CPUS). A larger id is refused rather than expanded, so a cpu list
# such as "0-4294967295" (from a manifest, a request or a corrupt file) costs nothing.
MAX_CPU_ID: Final = 1 << 16
_BEYOND = f"is beyond any Linux CPU number (at most {MAX_CPU_ID})"
_SHOWN = 80  # characters of a bad cpu list an error message repeats


class CpuListError(ValueError):
    """A cpu list that does not follow the `N` / `A-B` comma syntax, or names a CPU beyond MAX_CPU_ID."""


def _shown(text: str) -> str:
    return repr(text) if len(text) <= _SHOWN else f"{text[:_SHOWN]!r}... ({len(text)} characters)"


def parse_cpu_list(text: str) -> frozenset[int]:
    """Parse "0-3,8" into {0, 1, 2, 3, 8}. Empty (or whitespace/newline only) gives the empty set."""
    text = text.strip()
    if not text:
        return frozenset()
    ranges: list[tuple[int, int]] = []
    for item in text.split(","):
        first, sep, last = item.partition("-")
        try:
            lo = int(first)
            hi = int(last) if sep else lo
        except ValueError:
            raise CpuListError(f"invalid cpu list {_shown(text)}: {_shown(item)} is not N or A-B") from None
        if lo < 0 or hi < lo:
            raise CpuListError(f"invalid cpu list {_shown(text)}: range {_shown(item)} is empty or negative")
        if hi > MAX_CPU_ID:
            raise CpuListError(f"invalid cpu list {_shown(text)}: cpu {hi} {_BEYOND}")
        ranges.append((lo, hi))
    return cpus_of_ranges(ranges)


def cpus_of_ranges(ranges: Iterable[tuple[int, int]]) -> frozenset[int]:
    """The CPUs of inclusive (first, last) ranges. Each CPU is added once however often the ranges repeat or
    overlap, so the cost is that of the result (at most MAX_CPU_ID + 1 CPUs), not of the text."""
    cpus: set[int] = set()
    covered = 0  # with the ranges sorted, every CPU below this is in already
    for lo, hi in sorted(ranges):
        start = max(lo, covered)
        if start <= hi:
            cpus.update(range(start, hi + 1))
            covered = hi + 1
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Format {0, 1, 2, 3, 8, 10, 11} as "0-3,8,10-11" (sorted, runs collapsed), like the kernel."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


def parse_cpu_mask(text: str) -> frozenset[int]:
    """Parse a sysfs hex cpumask ("ff,00000001", comma-separated 32-bit words) into cpu numbers. ValueError
    (CpuListError for a CPU beyond MAX_CPU_ID) if it is not one."""
    value = int(text.strip().replace(",", "") or "0", 16)
    if value.bit_length() > MAX_CPU_ID + 1:
        raise CpuListError(f"cpu mask {_shown(text)} names a CPU that {_BEYOND}")
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def format_cpu_mask(cpus: Iterable[int], nbits: int) -> str:
    """The kernel's `%*pb` cpumask of an `nbits`-CPU bitmap ("ff,00000001"): comma-separated 32-bit hex words,
    highest first, the first only as wide as its bits need."""
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    words = max(1, (nbits + 31) // 32)
    first_bits = nbits - 32 * (words - 1) if nbits else 32
    chunks = []
    for i in range(words - 1, -1, -1):
        width = (first_bits + 3) // 4 if i == words - 1 else 8
        chunks.append(f"{(value >> (32 * i)) & 0xFFFFFFFF:0{width}x}")
    return ",".join(chunks)


def parse_cpu_list_entries(value: object, path: str) -> frozenset[int]:
    """The CPUs of a manifest field holding cpu-list strings or plain CPU numbers (["0-3", "8"], [4]); None is
    none. CpuListError names `path` and the bad entry."""
    if value is None:
        return frozenset()
    if not isinstance(value, list):
        raise CpuListError(f'{path} must be a list of cpu lists such as ["0-3", "8"], not {value!r}')
    cpus: set[int] = set()
    for i, item in enumerate(value):
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            if item > MAX_CPU_ID:
                raise CpuListError(f"{path}[{i}]: cpu {item} {_BEYOND}")
            cpus.add(item)
        elif isinstance(item, str):
            try:
                cpus |= parse_cpu_list(item)
            except CpuListError as exc:
                raise CpuListError(f"{path}[{i}]: {exc}") from None
        else:
            raise CpuListError(f"{path}[{i}] must be a cpu list string, not {item!r}")
    return frozenset(cpus)
