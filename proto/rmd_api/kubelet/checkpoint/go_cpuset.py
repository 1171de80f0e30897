"""Cpusets as the kubelet's `k8s.io/utils/cpuset` has them: its strict `Parse`, and `CPUSet` as go-spew sees
it for the checksum."""

from __future__ import annotations

from typing import Final

from rmd_api.kubelet.checkpoint.gojson import go_atoi
from rmd_api.kubelet.checkpoint.gospew import GoStruct, GoValue

# Kernel builds top out at 8192 CPUs; the bound keeps "0-999999999" from building a huge set to hash.
_MAX_CPU_ID: Final = 1 << 16


def parse_kubelet_cpuset(text: str) -> frozenset[int]:
    """Parse a cpuset exactly as the kubelet does (`k8s.io/utils/cpuset.Parse`). ValueError if invalid.

    Differences from a lenient parser: no whitespace, no empty items, and `A-B` needs A <= B.
    """
    if text == "":
        return frozenset()
    cpus: set[int] = set()
    for item in text.split(","):
        first, sep, last = item.partition("-")
        start = go_atoi(first)
        end = go_atoi(last) if sep else start
        if start is None or end is None:
            raise ValueError(f"invalid cpuset {text!r}: {item!r} is not N or A-B")
        if start > end:
            raise ValueError(f"invalid cpuset {text!r}: range {item!r} has start > end")
        if end > _MAX_CPU_ID:
            raise ValueError(f"invalid cpuset {text!r}: cpu {end} is beyond any Linux CPU number")
        cpus.update(range(start, end + 1))
    return frozenset(cpus)


def cpuset_go_value(cpus: frozenset[int]) -> GoStruct:
    """cpuset.CPUSet as go-spew prints it: its unexported `elems map[int]struct{}` (never nil)."""
    elems: dict[int, GoValue] = dict.fromkeys(cpus, GoStruct())
    return GoStruct((("elems", "map[int]struct {}", elems),))
