"""Fuzzing the node-telemetry parsers (issue #13's campaign, "NodeConfig endpoints when they exist"):
whatever a BMC, a pressure API or an inference server answers, and whatever a NodeConfig's spec holds, each
parser gives its value or its typed error (CollectError, DurationError, a problem in the spec), within the
"fuzz" profile's deadline per example (tests/conftest.py), as the other test_fuzz_* files."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rmd_operator.telemetry import parse
from rmd_operator.telemetry.errors import CollectError
from rmd_operator.telemetry.spec import DurationError, parse_duration, parse_node_config

# JSON as a server may send it, with the keys these parsers look for made likely.
KEYS = st.sampled_from(
    [
        "Temperatures",
        "TemperatureReadingsCelsius",
        "PhysicalContext",
        "ReadingCelsius",
        "Reading",
        "Name",
        "Status",
        "State",
        "DataSourceUri",
        "Members",
        "@odata.id",
        "sensor",
        "pressure",
        "outputs",
        "data",
        "PowerConsumptionModel",
        "InferenceEndpoint",
        "ModelName",
        "type",
        "endpoint",
        "fetchInterval",
        "basicAuthSecret",
        "caBundleSecret",
        "insecureSkipVerify",
        "metricsCollector",
        "inletTemp",
        "deltaP",
        "predictor",
        "powerConsumption",
        "powerConsumptionEndpointProvider",
        "nodeName",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        ["Intake", "Enabled", "Absent", "Redfish", "Fake", "V2InferenceProtocol", "https://bmc", "15s"]
    ),
    st.text(max_size=20),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(KEYS, st.text(max_size=8)), inner, max_size=5)
    ),
    max_leaves=30,
)
FUZZ = settings.get_profile("fuzz")
OBJECTS = st.dictionaries(st.one_of(KEYS, st.text(max_size=8)), JSON, max_size=6)


def _value_or_collect_error(call: Callable[[], Any]) -> None:
    try:
        value = call()
    except CollectError:
        return
    if isinstance(value, float):
        assert math.isfinite(value), value  # a reading that is no number is refused, not exported


@FUZZ
@given(doc=OBJECTS)
def test_any_redfish_document_gives_an_inlet_temperature_or_a_collect_error(doc: dict[str, Any]) -> None:
    _value_or_collect_error(lambda: parse.intake_from_thermal_metrics(doc))
    _value_or_collect_error(lambda: parse.intake_from_thermal(doc))
    for path in parse.VENDOR_PATHS:
        _value_or_collect_error(lambda path=path: parse.read_inlet(path, doc))  # type: ignore[misc]
    parse.members(doc)
    parse.link(doc, "Thermal")
    with contextlib.suppress(CollectError):
        parse.machine_learning_model(doc)


@FUZZ
@given(doc=JSON)
def test_any_pressure_or_inference_answer_gives_a_number_or_a_collect_error(doc: Any) -> None:
    _value_or_collect_error(lambda: parse.differential_pressure(doc))
    _value_or_collect_error(lambda: parse.inference_watts(doc))


@FUZZ
@given(
    url=st.one_of(
        st.text(max_size=40), st.sampled_from(["http://x/v2/models/m", "https://[::1]:8/v2/m", "ftp://x"])
    )
)
def test_any_inference_url_is_an_endpoint_or_a_collect_error(url: str) -> None:
    with contextlib.suppress(CollectError):
        parse.inference_endpoint(url)


@FUZZ
@given(
    text=st.one_of(
        st.text(max_size=30), st.from_regex(r"[0-9]{1,400}(\.[0-9]{0,5})?(h|m|s|ms|us|ns)", fullmatch=True)
    )
)
def test_any_duration_is_seconds_or_a_duration_error(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except DurationError:
        return
    assert seconds >= 0 and math.isfinite(seconds), (text, seconds)


@FUZZ
@given(spec=OBJECTS)
def test_any_node_config_spec_parses_into_sources_with_their_problems(spec: dict[str, Any]) -> None:
    config = parse_node_config("ns", "n", spec)
    for source in config.sources:
        assert source.term.fetch_interval > 0 and math.isfinite(source.term.fetch_interval)
