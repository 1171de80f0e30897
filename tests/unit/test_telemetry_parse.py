"""Node telemetry: the pure parts — NodeConfig specs, durations, Redfish/pressure/V2 documents, backoff,
source state and conditions (operator/rmd_operator/telemetry)."""

from __future__ import annotations

import pytest

from rmd_operator.telemetry import backoff, parse
from rmd_operator.telemetry.errors import BAD_RESPONSE, INVALID_CONFIG, UNREACHABLE, CollectError
from rmd_operator.telemetry.parse import VENDOR_PATHS, InletPath
from rmd_operator.telemetry.spec import DEFAULT_FETCH_INTERVAL, parse_duration, parse_node_config
from rmd_operator.telemetry.state import SourceState

# wao-core README's examples (shared/samples/wao), as their specs.
SEED = {
    "nodeName": "worker-0",
    "metricsCollector": {
        "inletTemp": {
            "type": "Redfish",
            "endpoint": "https://10.0.0.100",
            "basicAuthSecret": {"name": "worker-0-redfish-basicauth"},
            "fetchInterval": "10s",
        },
        "deltaP": {
            "type": "DifferentialPressureAPI",
            "endpoint": "http://10.0.0.1:5000",
            "fetchInterval": "10s",
        },
    },
    "predictor": {
        "powerConsumption": {
            "type": "V2InferenceProtocol",
            "endpoint": "http://10.0.0.1:8080/v2/models/myModel/versions/v0.1.0/infer",
        }
    },
}
SEED_PROVIDER = {
    "nodeName": "worker-1",
    "metricsCollector": {"inletTemp": {"type": "Fake"}, "deltaP": {"type": "Fake"}},
    "predictor": {
        "powerConsumption": {"type": "", "endpoint": "", "basicAuthSecret": {"name": "predictor-basicauth"}},
        "powerConsumptionEndpointProvider": {
            "type": "Redfish",
            "endpoint": "https://10.0.0.1",
            "basicAuthSecret": {"name": "worker-0-redfish-basicauth"},
        },
    },
}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15), ("1m30s", 90), ("500ms", 0.5), ("1.5h", 5400), ("0", 0), ("2m", 120), ("-1s", -1)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "15", "s", "1x", "1m 30s", "ten seconds"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_seed_nodeconfig_parses_without_problems() -> None:
    spec = parse_node_config("wao-system", "worker-0", SEED)
    assert spec.node_name == "worker-0"
    assert [s.kind for s in spec.sources] == ["inletTemp", "deltaP", "powerConsumption"]
    inlet = spec.source("inletTemp")
    assert inlet is not None and inlet.problem is None
    assert inlet.term.basic_auth_secret == "worker-0-redfish-basicauth"
    assert inlet.interval == 10.0
    power = spec.source("powerConsumption")
    assert power is not None and power.problem is None and power.interval == DEFAULT_FETCH_INTERVAL
    assert not inlet.term.insecure_skip_verify  # verified unless asked


def test_seed_endpoint_provider_leaves_the_predictor_to_the_provider() -> None:
    spec = parse_node_config("wao-system", "worker-1", SEED_PROVIDER)
    power = spec.source("powerConsumption")
    assert power is not None and power.problem is None
    assert power.provider is not None and power.provider.type == "Redfish"
    assert power.term.basic_auth_secret == "predictor-basicauth"


@pytest.mark.parametrize(
    ("term", "message"),
    [
        (
            {"type": "DifferentialPressureAPI", "endpoint": "http://x"},
            "inletTemp.type must be one of Redfish, Fake",
        ),
        ({"type": "Redfish"}, "inletTemp.endpoint is required for type Redfish"),
        ({"type": "Redfish", "endpoint": "10.0.0.1"}, "must be an http:// or https:// URL"),
        (
            {"type": "Redfish", "endpoint": "https://b", "fetchInterval": "-5s"},
            "fetchInterval must be positive",
        ),
        ({"type": "Redfish", "endpoint": "https://b", "fetchInterval": "soon"}, "not a duration"),
    ],
)
def test_a_source_that_cannot_run_gets_a_problem_naming_the_field(
    term: dict[str, object], message: str
) -> None:
    spec = parse_node_config("ns", "n", {"nodeName": "w", "metricsCollector": {"inletTemp": term}})
    inlet = spec.source("inletTemp")
    assert inlet is not None and inlet.problem is not None and message in inlet.problem
    delta = spec.source("deltaP")
    assert delta is not None and "deltaP.type" in (delta.problem or "")  # absent: a problem of its own


def test_trust_fields_and_interval_floor() -> None:
    term = {
        "type": "Redfish",
        "endpoint": "https://bmc/",
        "fetchInterval": "100ms",
        "caBundleSecret": {"name": "bmc-ca"},
        "insecureSkipVerify": "yes",  # only a real true skips verification
    }
    inlet = parse_node_config("ns", "n", {"metricsCollector": {"inletTemp": term}}).source("inletTemp")
    assert inlet is not None
    assert inlet.term.endpoint == "https://bmc"
    assert inlet.interval == 1.0
    assert inlet.term.ca_secret is not None and inlet.term.ca_secret.key == "ca.crt"
    assert inlet.term.insecure_skip_verify is False


# -- Redfish documents ------------------------------------------------------------------------------------


def test_legacy_thermal_takes_the_enabled_intake_sensor() -> None:
    doc = {
        "Temperatures": [
            {"Name": "CPU Temp", "PhysicalContext": "CPU", "ReadingCelsius": 41},
            {"Name": "Old", "PhysicalContext": "Intake", "ReadingCelsius": 99, "Status": {"State": "Absent"}},
            {"Name": "Chassis Intake Temp", "PhysicalContext": "Intake", "ReadingCelsius": 25},
        ]
    }
    assert parse.intake_from_thermal(doc) == 25.0
    with pytest.raises(CollectError, match="PhysicalContext Intake") as info:
        parse.intake_from_thermal({"Temperatures": [{"PhysicalContext": "CPU", "ReadingCelsius": 40}]})
    assert info.value.reason == BAD_RESPONSE and not info.value.retryable


def test_thermal_metrics_summary_then_readings() -> None:
    assert (
        parse.intake_from_thermal_metrics({"TemperatureSummaryCelsius": {"Intake": {"Reading": 22.5}}})
        == 22.5
    )
    doc = {
        "TemperatureSummaryCelsius": {"Intake": {"Reading": None}},
        "TemperatureReadingsCelsius": [
            {"DeviceName": "CPU", "PhysicalContext": "CPU", "Reading": 50},
            {"DeviceName": "Inlet", "PhysicalContext": "Intake", "Reading": 23},
        ],
    }
    assert parse.intake_from_thermal_metrics(doc) == 23.0


def test_vendor_layouts() -> None:
    dell, lenovo, supermicro = VENDOR_PATHS
    assert dell.path.endswith("/Chassis/System.Embedded.1/Sensors/SystemBoardInletTemp")
    assert parse.read_inlet(dell, {"Name": "System Board Inlet Temp", "Reading": 21}) == 21.0
    assert parse.read_inlet(lenovo, {"Name": "Ambient Temp", "Reading": 24.0}) == 24.0
    with pytest.raises(CollectError, match="not 'Ambient Temp'"):
        parse.read_inlet(lenovo, {"Name": "CPU 1 Temp", "Reading": 60})
    doc = {
        "Temperatures": [
            {"Name": "CPU Temp", "ReadingCelsius": 50},
            {"Name": "System Temp", "ReadingCelsius": 27},
        ]
    }
    assert parse.read_inlet(supermicro, doc) == 27.0
    with pytest.raises(CollectError, match="no numeric Reading"):
        parse.read_inlet(InletPath("/x", "Sensor"), {"Reading": True})


def test_links_and_members() -> None:
    assert parse.link({"Thermal": {"@odata.id": "/redfish/v1/Chassis/1/Thermal"}}, "Thermal") == (
        "/redfish/v1/Chassis/1/Thermal"
    )
    assert parse.link({"Thermal": "x"}, "Thermal") is None
    assert parse.members({"Members": [{"@odata.id": "/a"}, {}, {"@odata.id": "/b"}]}) == ["/a", "/b"]


# -- pressure and V2 --------------------------------------------------------------------------------------


def test_pressure_answer() -> None:
    doc = {"code": 200, "sensor": [{"pressure": 0.01, "sensorid": "101037B", "temperature": 26.02}]}
    assert parse.differential_pressure(doc) == 0.01
    for bad in ({"code": 200, "sensor": []}, {"sensor": [{"pressure": "high"}]}, [], {"sensor": "x"}):
        with pytest.raises(CollectError) as info:
            parse.differential_pressure(bad)
        assert info.value.reason == BAD_RESPONSE


@pytest.mark.parametrize(
    ("url", "infer"),
    [
        (
            "http://10.0.0.1:8080/v2/models/myModel/versions/v0.1.0/infer",
            "http://10.0.0.1:8080/v2/models/myModel/versions/v0.1.0/infer",
        ),
        ("http://h:8080/v2/models/m", "http://h:8080/v2/models/m/infer"),
        ("https://gw/ml/v2/models/m/infer", "https://gw/ml/v2/models/m/infer"),
    ],
)
def test_inference_endpoint(url: str, infer: str) -> None:
    assert parse.inference_endpoint(url).infer_url == infer


@pytest.mark.parametrize(
    "url", ["http://h:8080/v2/", "http://h/v2/models", "ftp://h/v2/models/m", "h/v2/models/m"]
)
def test_inference_endpoint_without_a_model(url: str) -> None:
    with pytest.raises(CollectError) as info:
        parse.inference_endpoint(url)
    assert info.value.reason == INVALID_CONFIG


def test_inference_request_and_response_as_wao_sends_them() -> None:
    assert parse.inference_request(40.0, 25.0, 7.5) == {
        "inputs": [{"name": "predict-prob", "shape": [1, 3], "datatype": "FP32", "data": [[40.0, 25.0, 7.5]]}]
    }
    answer = {
        "model_name": "m",
        "outputs": [{"name": "predict", "shape": [1, 1], "datatype": "FP64", "data": [94.76]}],
    }
    assert parse.inference_watts(answer) == 94.76
    assert parse.inference_watts({"outputs": [{"data": [[12.5]]}]}) == 12.5
    for bad in ({"outputs": []}, {"outputs": [{"data": []}]}, {"error": "x"}):
        with pytest.raises(CollectError):
            parse.inference_watts(bad)


def test_machine_learning_model() -> None:
    doc = {
        "PowerConsumptionModel": {
            "Name": "power",
            "Url": "http://ml:8080/",
            "Type": "V2InferenceProtocol",
            "Version": "v1",
        }
    }
    provided = parse.machine_learning_model(doc)
    assert provided.type == "V2InferenceProtocol"
    assert provided.endpoint == "http://ml:8080/v2/models/power/versions/v1/infer"
    with pytest.raises(CollectError, match="lacks Url, Version"):
        parse.machine_learning_model({"PowerConsumptionModel": {"Name": "p", "Type": "V2InferenceProtocol"}})


# -- backoff ----------------------------------------------------------------------------------------------


def test_retry_delays_double_up_to_the_cap() -> None:
    delays = backoff.retry_delays(0.2, 1.0)
    assert [next(delays) for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.jittered(1.0, 0.0) == pytest.approx(0.8)
    assert backoff.jittered(1.0, 0.999999) == pytest.approx(1.2, abs=1e-5)


def test_retries_stop_at_the_deadline() -> None:
    assert backoff.fits(0.2, now=10.0, deadline=11.0)
    assert not backoff.fits(0.99, now=10.0, deadline=11.0)


def test_failing_sources_are_asked_less_often_up_to_four_intervals() -> None:
    assert [backoff.next_fetch_delay(15, n) for n in range(6)] == [15, 15, 30, 60, 60, 60]


# -- state and conditions ---------------------------------------------------------------------------------


def _conditions(state: SourceState, now: float) -> dict[str, tuple[bool, str]]:
    return {c.type: (c.status, c.reason) for c in state.conditions(now)}


def test_a_value_is_served_until_its_ttl_then_stale_once() -> None:
    state = SourceState(ttl=60)
    assert _conditions(state, 0) == {
        "Available": (False, "NoValue"),
        "Stale": (False, "NoValue"),
        "Error": (False, "NoValue"),
    }
    assert state.succeeded(25.0, now=100, detail="DMTF Thermal") is None
    assert _conditions(state, 130) == {
        "Available": (True, "Fetched"),
        "Stale": (False, "Fetched"),
        "Error": (False, "Fetched"),
    }
    assert state.check_stale(150) is None
    went_stale = state.check_stale(161)
    assert went_stale is not None and went_stale.reason == "Stale" and "61s old" in went_stale.message
    assert state.check_stale(170) is None  # one Event, not one per fetch
    assert _conditions(state, 161)["Stale"] == (True, "Expired")
    back = state.succeeded(26.0, now=170)
    assert back is not None and back.reason == "Recovered"


def test_errors_report_once_per_reason_and_recover() -> None:
    state = SourceState(ttl=60)
    state.succeeded(25.0, now=0)
    first = state.failed(CollectError(UNREACHABLE, "connection refused"), now=15)
    assert first is not None and (first.kind, first.reason) == ("Warning", "Unreachable")
    assert state.failed(CollectError(UNREACHABLE, "connection refused"), now=30) is None
    assert state.failures == 2 and state.errors_total == {"Unreachable": 2}
    conditions = _conditions(state, 30)
    assert conditions["Error"] == (True, "Unreachable")
    assert conditions["Available"] == (True, "Fetched")  # the value is still fresh
    assert _conditions(state, 61)["Available"] == (False, "Unreachable")
    recovered = state.succeeded(24.0, now=75)
    assert recovered is not None and "after Unreachable" in recovered.message
    assert state.failures == 0 and _conditions(state, 75)["Error"] == (False, "Fetched")


def test_condition_times_move_only_on_a_status_change() -> None:
    state = SourceState(ttl=60)
    state.succeeded(1.0, now=10)
    first = {c.type: c.since for c in state.conditions(10)}
    state.succeeded(2.0, now=20)
    assert {c.type: c.since for c in state.conditions(20)} == first
    state.failed(CollectError(UNREACHABLE, "x"), now=30)
    since = {c.type: c.since for c in state.conditions(30)}
    assert since["Error"] == 30 and since["Available"] == 10
