"""Kubernetes resource quantities written the way the API machinery writes them.

`resource.NewQuantity(v, DecimalSI)` serialises integers in canonical form: trailing zeros are folded into
the largest decimal SI suffix (powers of 1000) that keeps the mantissa an integer. Writing the same form
means our objects read exactly like RTE's, and equal values are always equal strings.
"""

from __future__ import annotations

# (exponent of 1000, suffix), largest first; int64 quantities never need more than E.
_SUFFIXES = ((6, "E"), (5, "P"), (4, "T"), (3, "G"), (2, "M"), (1, "k"))


def decimal_si(value: int) -> str:
    """Canonical DecimalSI form of an integer: 12 -> "12", 1000 -> "1k", 33554432000 -> "33554432k"."""
    if value == 0:
        return "0"
    sign, magnitude = ("-", -value) if value < 0 else ("", value)
    for exponent, suffix in _SUFFIXES:
        scale = 1000**exponent
        if magnitude % scale == 0:
            return f"{sign}{magnitude // scale}{suffix}"
    return f"{sign}{magnitude}"


_PARSE = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def parse_integer_quantity(text: str | int) -> int:
    """An integer quantity as the API returns it ("12", "1k", "4Gi", or a bare int); ValueError otherwise.

    Only what this module writes (and whole binary multiples) is accepted: zones hold counts and bytes.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    raw = str(text).strip()
    for table in (_BINARY, _PARSE):
        for suffix, scale in table.items():
            if suffix and raw.endswith(suffix):
                number = raw[: -len(suffix)]
                if number.lstrip("+-").isdigit():
                    return int(number) * scale
    if raw.lstrip("+-").isdigit():
        return int(raw)
    raise ValueError(f"not an integer quantity: {text!r}")
