"""Fuzz campaign (docs/security.md, "Hostile input"): what the operator reads from users' objects. Any
RmdWorkload spec gives a request or SpecError/InvalidSpec; any pod (annotations, quantities the API server
stores) gives a PodRequest whose values are within the limits, within the deadline."""

from __future__ import annotations

import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rmd_api import limits
from rmd_api.agent.v1 import agent_pb2
from rmd_api.cpuset import MAX_CPU_ID, parse_cpu_list
from rmd_api.workload_spec import InvalidSpec, parse_spec, resource_fields
from rmd_operator import pod_annotations, pods
from rmd_operator.errors import SpecError
from rmd_operator.spec import requirements, workload_spec

FUZZ = settings.get_profile("fuzz")

# -- RmdWorkload specs ---------------------------------------------------------------------------------------

_CPU_LISTS = st.one_of(
    st.sampled_from(["0", "0-3", "0-3,8", "4294967295", "0-4294967295", f"0-{MAX_CPU_ID}", "3-1", "x", ""]),
    st.text("0123456789,-", max_size=12),
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.sampled_from(["on", "off", "3.0", "gold", "nan", "1e3", "0", "100", "-1"]),
    st.text(max_size=8),
    _CPU_LISTS,
)
_KEYS = st.sampled_from(
    [*("coreIds", "allCores", "reservedCoreIds", "policy", "cache", "rdt", "mba", "plugins", "pstate"), "x"]
)
_VALUES = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_KEYS, children, max_size=4),
    max_leaves=12,
)


_PATHS = [
    ("coreIds",),
    ("allCores",),
    ("reservedCoreIds",),
    ("policy",),
    ("cache",),
    ("cache", "max"),
    ("cache", "min"),
    ("rdt", "cache"),
    ("rdt", "cache", "max"),
    ("rdt", "cache", "min"),
    ("rdt", "mba"),
    ("rdt", "mba", "percentage"),
    ("rdt", "mba", "mbps"),
    ("pstate", "ratio"),
    ("pstate", "monitoring"),
    ("plugins", "pstate"),
    ("plugins", "pstate", "ratio"),
    ("plugins", "pstate", "monitoring"),
]


@st.composite
def _specs(draw: st.DrawFn) -> Any:
    """A valid spec with a few fields set to fuzzed values (so that later checks are reached too), sometimes
    anything at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_VALUES)
    spec: dict[str, Any] = {"coreIds": ["0-3"], "rdt": {"cache": {"max": 2, "min": 2}}}
    for path in draw(st.lists(st.sampled_from(_PATHS), min_size=1, max_size=3)):
        parent = spec
        for key in path[:-1]:
            child = parent.setdefault(key, {})
            if not isinstance(child, dict):
                break
            parent = child
        else:
            parent[path[-1]] = draw(_SCALARS | _VALUES)
    return spec


@FUZZ
@given(_specs())
def test_any_spec_is_a_request_or_invalid_spec(spec: Any) -> None:
    try:
        request = parse_spec(spec)
    except InvalidSpec as exc:
        assert str(exc).startswith("spec")
        return
    assert isinstance(request, agent_pb2.WorkloadSpec)
    for entries in (request.core_ids, request.reserved_core_ids):
        assert all(0 <= cpu <= MAX_CPU_ID for entry in entries for cpu in parse_cpu_list(entry))
    resource_fields(request)  # what a status shows of it


@FUZZ
@given(_specs())
def test_the_operator_answers_any_spec_with_a_request_or_spec_error(spec: Any) -> None:
    try:
        request = workload_spec(spec)
    except SpecError:
        return
    requirements(request)


def test_a_monitoring_value_that_is_a_list_is_invalid_spec_not_a_type_error() -> None:
    for spec in (
        {"coreIds": ["0"], "pstate": {"monitoring": []}},
        {"coreIds": ["0"], "plugins": {"pstate": {"monitoring": {"on": True}}}},
    ):
        try:
            parse_spec(spec)
        except InvalidSpec as exc:
            assert 'monitoring must be "on" or "off"' in str(exc)
        else:
            raise AssertionError(f"{spec} was accepted")


# -- pods: annotations and quantities ------------------------------------------------------------------------

CONTAINERS = ("app", "side")
# What the API server stores: it keeps "1e100000" as "10e99999" and "1e-100" as "1e-3" (kube-apiserver 1.36).
_QUANTITIES = st.one_of(
    st.sampled_from(["2", "1", "0", "500m", "1Gi", "2k", "1e3", "33", "10e18", "10e99999", "1e-3", "0.5"]),
    st.sampled_from(
        ["NaN", "Infinity", "-1", "", "x", "1e", "1_0", "٣", "1Ki1"]
    ),  # refused by the API server
    st.integers(0, 2**70).map(str),
    st.text("0123456789.eEkmMGi-+", max_size=8),
    st.none(),
)
_SETTINGS = st.sampled_from([*pod_annotations.SETTINGS, "typo", ""])
_ANNOTATION_VALUES = st.one_of(
    st.sampled_from(
        ["gold", "silver", "bronze", "on", "off", "1", "2", "3.0", "100", "0", " 2 ", "99999999999"]
    ),
    st.text(max_size=10),
)


@st.composite
def _pods(draw: st.DrawFn) -> dict[str, Any]:
    containers = []
    for name in CONTAINERS[: draw(st.integers(1, 2))]:
        limits_ = {k: v for k in ("cpu", "memory", pods.CACHE_WAYS) if (v := draw(_QUANTITIES)) is not None}
        requests = draw(
            st.one_of(st.just(limits_), st.dictionaries(st.sampled_from(["cpu", "memory"]), _QUANTITIES))
        )
        containers.append({"name": name, "resources": {"limits": limits_, "requests": requests}})
    owners = st.sampled_from([*CONTAINERS, "other", ""])
    keys = st.one_of(
        st.tuples(owners, _SETTINGS).map("_".join),  # the seed's form
        st.tuples(owners, _SETTINGS).map(lambda k: f"{k[0]}.{pod_annotations.DOMAIN}/{k[1]}"),  # any name
        st.text(max_size=12),
    )
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "annotations": draw(st.dictionaries(keys, _ANNOTATION_VALUES, max_size=5)),
        },
        "spec": {"nodeName": "n1", "containers": containers},
        "status": draw(
            st.sampled_from([{}, {"qosClass": "Guaranteed"}, {"phase": "Failed", "reason": "OutOfcpu"}])
        ),
    }


@FUZZ
@given(_pods())
def test_any_pod_is_a_request_within_the_limits(pod: dict[str, Any]) -> None:
    request = pods.pod_request(pod)
    for container in request.containers:
        if container.policy is None:
            assert limits.CACHE_WAYS.contains(container.ways)
        for value, limit in (
            (container.mba_percentage, limits.MBA_PERCENTAGE),
            (container.mba_mbps, limits.MBA_MBPS),
        ):
            assert value is None or limit.contains(value)
        body = pods.workload_body(request, container, {2, 3})
        workload_spec(body["spec"])  # what the operator sends is a valid spec
    for refusal in request.refusals:
        assert refusal.reason in (pods.NOT_GUARANTEED, pods.FRACTIONAL_CPUS, pods.INVALID_REQUEST)


def test_a_cache_ways_limit_beyond_any_integer_is_refused_in_bounded_time() -> None:
    # kube-apiserver stores `intel.com/l3_cache_ways: 1e1000000` as "10e999999": making an int of it took 27 s
    # of the operator's event loop, and then a ValueError (printing the int needs 4300+ digits).
    container = {
        "name": "app",
        "resources": {"limits": {"cpu": "2", "memory": "1Gi", pods.CACHE_WAYS: "10e999999"}},
    }
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"nodeName": "n1", "containers": [container]},
    }
    started = time.perf_counter()
    request = pods.pod_request(pod)
    assert time.perf_counter() - started < 1.0
    assert not request.containers
    [invalid] = request.invalid
    assert invalid.container == "app"
    assert any(f"must be an integer within 0..{limits.CACHE_WAYS.high}" in p for p in invalid.problems)
    event = pods.annotation_event(request)
    assert event is not None and event.reason == pods.INVALID_REQUEST
