"""RmdWorkload spec -> the agent's WorkloadSpec: both rmd-operator layouts mean the same request."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from rmd_api.agent.v1 import agent_pb2
from rmd_operator.errors import SpecError
from rmd_operator.spec import Requirements, requirements, workload_ref, workload_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_v01_and_v03_layouts_give_the_same_request() -> None:
    v01 = {
        "coreIds": ["14-15"],
        "cache": {"max": 2, "min": 2},
        "pstate": {"ratio": "2.0", "monitoring": "on"},
        "nodes": ["n1"],
    }
    v03 = {
        "coreIds": ["14-15"],
        "rdt": {"cache": {"max": 2, "min": 2}},
        "plugins": {"pstate": {"ratio": "2.0", "monitoring": "on"}},
        "nodes": ["n1"],
    }
    assert workload_spec(v01) == workload_spec(v03)
    spec = workload_spec(v01)
    assert (spec.cache.max, spec.cache.min) == (2, 2)
    assert spec.pstate.ratio == 2.0
    assert spec.pstate.monitoring is True


def test_cpu_lists_are_canonical() -> None:
    spec = workload_spec({"coreIds": ["8", "0-3", "2", 9], "nodes": ["n"]})
    assert list(spec.core_ids) == ["0-3,8-9"]
    assert workload_spec({"coreIds": ["0-3,8-9"], "nodes": ["n"]}) == spec


def test_all_cores_with_reserved_cpus() -> None:
    spec = workload_spec({"allCores": True, "reservedCoreIds": ["1,2", "4-7"], "policy": "gold"})
    assert spec.all_cores
    assert list(spec.core_ids) == []
    assert list(spec.reserved_core_ids) == ["1-2,4-7"]
    assert spec.policy == "gold"
    assert not spec.HasField("cache")


def test_unset_cache_ways_count_as_zero_but_no_cache_is_no_request() -> None:
    assert workload_spec({"coreIds": ["1"], "rdt": {"cache": {"max": 3}}}).cache == agent_pb2.CacheRequest(
        max=3, min=0
    )
    shared = workload_spec({"coreIds": ["1"], "cache": {}})
    assert shared.HasField("cache")
    assert (shared.cache.max, shared.cache.min) == (0, 0)
    assert not workload_spec({"coreIds": ["1"]}).HasField("cache")


@pytest.mark.parametrize(("unit", "value"), [("percentage", 50), ("mbps", 2000)])
def test_memory_bandwidth_in_either_unit(unit: str, value: int) -> None:
    spec = workload_spec({"coreIds": ["1"], "rdt": {"cache": {"max": 2, "min": 2}, "mba": {unit: value}}})
    assert spec.mba.WhichOneof("value") == unit
    assert getattr(spec.mba, unit) == value


def test_pstate_ratio_alone_leaves_monitoring_unset() -> None:
    # Unset, not off: the agent then monitors, as RMD does (docs/pstate.md).
    spec = workload_spec({"coreIds": ["1"], "plugins": {"pstate": {"ratio": "1.5"}}})
    assert spec.pstate.ratio == 1.5
    assert not spec.pstate.HasField("monitoring")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"nodes": ["n"]}, "coreIds or spec.allCores"),
        ({"coreIds": ["3-1"]}, r"spec.coreIds\[0\]"),
        ({"coreIds": "0-3"}, "must be a list"),
        (
            {"coreIds": ["1"], "cache": {"max": 1, "min": 1}, "rdt": {"cache": {"max": 1, "min": 1}}},
            "exclusive",
        ),
        ({"coreIds": ["1"], "pstate": {"ratio": "1"}, "plugins": {"pstate": {"ratio": "1"}}}, "exclusive"),
        ({"coreIds": ["1"], "cache": {"max": -1}}, "within 0..32"),
        ({"coreIds": ["1"], "rdt": {"mba": {"percentage": 10, "mbps": 10}}}, "exactly one"),
        ({"coreIds": ["1"], "pstate": {"ratio": "fast"}}, "greater than 0 and less than 100"),
        ({"coreIds": ["1"], "pstate": {"ratio": "0"}}, "greater than 0 and less than 100"),
        ({"coreIds": ["1"], "pstate": {"monitoring": "yes"}}, '"on" or "off"'),
        ({"coreIds": ["1"], "allCores": "true"}, "true or false"),
    ],
)
def test_malformed_specs_are_refused_with_the_field_named(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        workload_spec(spec)


_RATIO_RANGE = (
    "must be a decimal number greater than 0 and less than 100 (a branch-miss threshold in per cent), "
    'such as "3.0"'
)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        # issue #13: an object that predates the CRD's ranges gets InvalidSpec, not a silently applied value
        ({"pstate": {"ratio": "9999.9999"}}, f"spec.pstate.ratio {_RATIO_RANGE}, not '9999.9999'"),
        ({"plugins": {"pstate": {"ratio": "100"}}}, f"spec.plugins.pstate.ratio {_RATIO_RANGE}, not '100'"),
        ({"plugins": {"pstate": {"ratio": -2.5}}}, f"spec.plugins.pstate.ratio {_RATIO_RANGE}, not -2.5"),
        (
            {"rdt": {"cache": {"max": 33, "min": 33}}},
            "spec.rdt.cache.max must be an integer within 0..32, not 33",
        ),
        ({"cache": {"max": 2, "min": 33}}, "spec.cache.min must be an integer within 0..32, not 33"),
        (
            {"rdt": {"mba": {"percentage": 0}}},
            "spec.rdt.mba.percentage must be an integer within 1..100, not 0",
        ),
        (
            {"rdt": {"mba": {"percentage": 101}}},
            "spec.rdt.mba.percentage must be an integer within 1..100, not 101",
        ),
        ({"rdt": {"mba": {"mbps": 0}}}, "spec.rdt.mba.mbps must be an integer within 1..4294967290, not 0"),
        (
            {"rdt": {"mba": {"mbps": 4294967291}}},
            "spec.rdt.mba.mbps must be an integer within 1..4294967290, not 4294967291",
        ),
    ],
)
def test_out_of_range_values_are_refused_with_the_range(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        workload_spec({"coreIds": ["1"], **spec})
    assert str(err.value) == message


def test_the_edges_of_each_range_are_accepted() -> None:
    low = workload_spec(
        {"coreIds": ["1"], "cache": {"max": 0}, "pstate": {"ratio": "0.0001"}, "rdt": {"mba": {"mbps": 1}}}
    )
    assert (low.cache.max, low.pstate.ratio, low.mba.mbps) == (0, 0.0001, 1)
    high = workload_spec(
        {
            "coreIds": ["1"],
            "rdt": {"cache": {"max": 32, "min": 32}, "mba": {"mbps": 4294967290}},
            "plugins": {"pstate": {"ratio": "99.9999"}},
        }
    )
    assert (high.cache.max, high.cache.min, high.pstate.ratio, high.mba.mbps) == (32, 32, 99.9999, 4294967290)
    for percentage in (1, 100):
        spec = workload_spec({"coreIds": ["1"], "rdt": {"mba": {"percentage": percentage}}})
        assert spec.mba.percentage == percentage
    assert workload_spec({"coreIds": ["1"], "pstate": {"ratio": "3"}}).pstate.ratio == 3.0


@pytest.mark.parametrize(
    ("spec", "needs"),
    [
        ({"coreIds": ["1"], "rdt": {"cache": {"max": 2, "min": 2}}}, Requirements(True, False)),
        ({"coreIds": ["1"], "cache": {"max": 2, "min": 1}}, Requirements(True, False)),
        ({"allCores": True, "policy": "bronze"}, Requirements(True, False)),
        (
            {"coreIds": ["1"], "rdt": {"cache": {"max": 2, "min": 2}, "mba": {"percentage": 50}}},
            Requirements(True, True),
        ),
        # Asking for no ways restricts nothing in resctrl: fine on nodes without RDT.
        ({"coreIds": ["1"], "plugins": {"pstate": {"ratio": "2.0"}}}, Requirements(False, False)),
        ({"coreIds": ["1"], "rdt": {"cache": {"max": 0, "min": 0}}}, Requirements(False, False)),
    ],
)
def test_requirements(spec: dict[str, Any], needs: Requirements) -> None:
    assert requirements(workload_spec(spec)) == needs


def test_spec_is_not_modified() -> None:
    spec = {"coreIds": ["3", "1-2"], "rdt": {"cache": {"max": 2}}, "nodes": ["n"]}
    before = copy.deepcopy(spec)
    workload_spec(spec)
    assert spec == before


def test_every_example_workload_converts() -> None:
    docs = [
        doc
        for path in sorted(EXAMPLES.glob("rmdworkload-*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "RmdWorkload"
    ]
    assert docs, f"no RmdWorkload examples in {EXAMPLES}"
    for doc in docs:
        spec = workload_spec(doc["spec"])
        assert spec.all_cores or list(spec.core_ids), doc["metadata"]["name"]


def test_ref_carries_the_uid() -> None:
    ref = workload_ref("ns", "w", "uid-1")
    assert (ref.namespace, ref.name, ref.uid) == ("ns", "w", "uid-1")
