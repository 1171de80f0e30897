"""rmd_api.workload_spec: what it writes in the v0.3 layout reads back as the same request.

Reading both layouts and its messages are tested through the operator's use of it (test_operator_spec.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rmd_api.agent.v1 import agent_pb2
from rmd_api.limits import MBA_MBPS, MBA_PERCENTAGE, PSTATE_RATIO
from rmd_api.workload_spec import parse_spec, resource_fields


@st.composite
def _specs(draw: st.DrawFn) -> agent_pb2.WorkloadSpec:
    """WorkloadSpecs as parse_spec makes them: canonical cpu lists, and CPUs one way or the other."""
    all_cores = draw(st.booleans())
    spec = agent_pb2.WorkloadSpec(
        core_ids=[] if all_cores else [draw(st.sampled_from(["0", "2-3", "0-3,8"]))],
        all_cores=all_cores,
        reserved_core_ids=draw(st.sampled_from([[], ["1"], ["0-1,6"]])) if all_cores else [],
        policy=draw(st.sampled_from(["", "gold", "bronze"])),
    )
    if draw(st.booleans()):
        spec.cache.max, spec.cache.min = draw(st.sampled_from([(0, 0), (2, 2), (4, 1), (3, 0)]))
    unit = draw(st.sampled_from([None, "percentage", "mbps"]))
    if unit is not None:
        limit = MBA_PERCENTAGE if unit == "percentage" else MBA_MBPS
        setattr(spec.mba, unit, draw(st.integers(limit.low, limit.high)))
    if draw(st.booleans()):
        ratios = st.floats(PSTATE_RATIO.above, PSTATE_RATIO.below, exclude_min=True, exclude_max=True)
        spec.pstate.ratio = draw(st.one_of(st.just(0.0), ratios))  # 0.0: no ratio
        spec.pstate.monitoring = draw(st.booleans())
    return spec


def _layout(spec: agent_pb2.WorkloadSpec) -> dict[str, Any]:
    cpus = {"coreIds": list(spec.core_ids), "allCores": spec.all_cores}
    return {**cpus, "reservedCoreIds": list(spec.reserved_core_ids), **resource_fields(spec)}


@given(_specs())
def test_written_fields_read_back_as_the_same_request(spec: agent_pb2.WorkloadSpec) -> None:
    assert parse_spec(_layout(spec)) == spec


def test_fields_in_the_v03_layout() -> None:
    spec = parse_spec(
        {
            "coreIds": ["1"],
            "policy": "gold",
            "cache": {"max": 2},  # v0.1: written back as v0.3
            "rdt": {"mba": {"mbps": 2000}},
            "pstate": {"ratio": "1.50", "monitoring": "on"},
        }
    )
    assert resource_fields(spec) == {
        "policy": "gold",
        "rdt": {"cache": {"max": 2, "min": 0}, "mba": {"mbps": 2000}},
        "plugins": {"pstate": {"monitoring": "on", "ratio": "1.5"}},
    }
    assert resource_fields(parse_spec({"coreIds": ["1"]})) == {}
