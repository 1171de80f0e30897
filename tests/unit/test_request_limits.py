"""The numeric limits of a workload request (rmd_api.limits) are the ones the CRD enforces and its
descriptions state, so the API server, the operator's reader, the pod annotations and the agent cannot
drift apart. Literals here are the independent check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rmd_api.limits import CACHE_WAYS, MBA_MBPS, MBA_PERCENTAGE, PSTATE_RATIO, Error, IntRange

ROOT = Path(__file__).resolve().parents[2]


def _spec() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "rmdworkloads.intel.com.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    properties: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return properties


def _integer_fields() -> list[Any]:
    spec = _spec()
    rdt = spec["rdt"]["properties"]
    fields = [
        pytest.param(layout["properties"][f], CACHE_WAYS, id=f"{name}.{f}")
        for name, layout in (("cache", spec["cache"]), ("rdt.cache", rdt["cache"]))
        for f in ("max", "min")
    ]
    mba = rdt["mba"]["properties"]
    fields.append(pytest.param(mba["percentage"], MBA_PERCENTAGE, id="rdt.mba.percentage"))
    fields.append(pytest.param(mba["mbps"], MBA_MBPS, id="rdt.mba.mbps"))
    return fields


def test_the_limits_themselves() -> None:
    assert (CACHE_WAYS.low, CACHE_WAYS.high) == (0, 32)  # resctrl keeps a cache bit mask in a u32
    assert (MBA_PERCENTAGE.low, MBA_PERCENTAGE.high) == (1, 100)
    assert (MBA_MBPS.low, MBA_MBPS.high) == (1, 4294967290)  # RMD's bound
    assert (PSTATE_RATIO.above, PSTATE_RATIO.below) == (0.0, 100.0)  # per cent, strictly exceeded


@pytest.mark.parametrize(("node", "limit"), _integer_fields())
def test_the_crd_bounds_integers_by_the_same_limits(node: dict[str, Any], limit: IntRange) -> None:
    assert (node["type"], node["minimum"], node["maximum"]) == ("integer", limit.low, limit.high)
    assert f"{limit.low} to {limit.high}" in node["description"]  # what `kubectl explain` shows


@pytest.mark.parametrize("layout", ["pstate", "plugins.pstate"])
def test_the_crd_bounds_the_pstate_ratio_by_the_same_limits(layout: str) -> None:
    spec = _spec()
    node = (spec["pstate"] if layout == "pstate" else spec["plugins"]["properties"]["pstate"])["properties"]
    ratio = node["ratio"]
    (rule,) = ratio["x-kubernetes-validations"]
    assert rule["rule"] == (
        f"self.matches('^{PSTATE_RATIO.pattern}$') "
        f"&& double(self) > {PSTATE_RATIO.above!r} && double(self) < {PSTATE_RATIO.below!r}"
    )
    assert rule["message"] == f"pstate ratio must be {PSTATE_RATIO.rule}"
    assert "greater than 0 and less than 100" in " ".join(ratio["description"].split())


def _refusal(require: Callable[[str, object, Error], object], value: object) -> str | None:
    try:
        require("the field", value, ValueError)
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    ("value", "refusal"),
    [
        (32, None),
        (0, None),
        (33, "the field must be an integer within 0..32, not 33"),
        (-1, "the field must be an integer within 0..32, not -1"),
        (True, "the field must be an integer within 0..32, not True"),
        ("2", "the field must be an integer within 0..32, not '2'"),
    ],
)
def test_integers_are_refused_with_the_range(value: object, refusal: str | None) -> None:
    assert _refusal(CACHE_WAYS.require, value) == refusal


@pytest.mark.parametrize(
    ("value", "number"),
    [("3", 3.0), ("99.9999", 99.9999), ("0.0001", 0.0001), (1.5, 1.5), (3, 3.0)]
    + [(v, None) for v in ("0", "-1", "100", "9999.9999", "nan", "inf", "fast", 0.0, 100.0, True, None)],
)
def test_ratios_are_numbers_strictly_between_0_and_100(value: object, number: float | None) -> None:
    assert PSTATE_RATIO.parse(value) == number
    refusal = _refusal(PSTATE_RATIO.require, value)
    assert refusal == (
        None if number is not None else f"the field must be {PSTATE_RATIO.rule}, not {value!r}"
    )


def test_ratio_rule_text() -> None:
    assert PSTATE_RATIO.rule == (
        "a decimal number greater than 0 and less than 100 (a branch-miss threshold in per cent), "
        'such as "3.0"'
    )
