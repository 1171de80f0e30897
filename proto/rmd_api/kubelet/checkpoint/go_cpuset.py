"""Cpusets as the kubelet's `k8s.io/utils/cpuset` has them: its strict `Parse`, and `CPUSet` as go-spew sees
it for the checksum."""

from __future__ import annotations

from rmd_api.cpuset import MAX_CPU_ID, cpus_of_ranges
from rmd_api.kubelet.checkpoint.gojson import go_atoi
from rmd_api.kubelet.checkpoint.gospew import GoStruct, GoValue


def parse_kubelet_cpuset(text: str) -> frozenset[int]:
    """Parse a cpuset exactly as the kubelet does (`k8s.io/utils/cpuset.Parse`). ValueError if invalid.

    Differences from a lenient parser: no whitespace, no empty items, and `A-B` needs A <= B.
    """
    return cpus_of_ranges(kubelet_cpuset_ranges(text))


def kubelet_cpuset_ranges(text: str) -> list[tuple[int, int]]:
    """The (first, last) ranges of a cpuset, checked as `parse_kubelet_cpuset` checks them but not expanded:
    linear in the text, for cpusets that are only validated. ValueError if invalid."""
    if text == "":
        return []
    ranges: list[tuple[int, int]] = []
    for item in text.split(","):
        first, sep, last = item.partition("-")
        start = go_atoi(first)
        end = go_atoi(last) if sep else start
        if start is None or end is None:
            raise ValueError(f"invalid cpuset {_shown(text)}: {item[:80]!r} is not N or A-B")
        if start > end:
            raise ValueError(f"invalid cpuset {_shown(text)}: range {item!r} has start > end")
        # Kernel builds top out at 8192 CPUs; the bound keeps "0-999999999" from building a huge set to hash.
        if end > MAX_CPU_ID:
            raise ValueError(f"invalid cpuset {_shown(text)}: cpu {end} is beyond any Linux CPU number")
        ranges.append((start, end))
    return ranges


def _shown(text: str) -> str:
    """The cpuset for a message: a file's megabyte-long one is not repeated whole."""
    return repr(text) if len(text) <= 80 else f"{text[:80]!r}... ({len(text)} characters)"


def cpuset_go_value(cpus: frozenset[int]) -> GoStruct:
    """cpuset.CPUSet as go-spew prints it: its unexported `elems map[int]struct{}` (never nil)."""
    elems: dict[int, GoValue] = dict.fromkeys(cpus, GoStruct())
    return GoStruct((("elems", "map[int]struct {}", elems),))
