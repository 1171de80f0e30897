"""Documents -> values (pure): Redfish thermal resources, the pressure API, the V2 inference protocol.

Every function takes the decoded JSON and returns a float or raises CollectError(BadResponse) saying what was
missing, so a user reading the condition knows which document and which field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import quote, urlsplit

from rmd_operator.telemetry.errors import BAD_RESPONSE, INVALID_CONFIG, CollectError

# How a Redfish document holds the inlet temperature.
Layout = Literal["ThermalMetrics", "Thermal", "Sensor", "NamedSensor", "NamedTemperature"]


@dataclass(frozen=True)
class InletPath:
    """Where a BMC keeps its inlet temperature: the URL path and how to read the document there."""

    path: str
    layout: Layout
    name: str = ""  # the sensor's Name, for the vendor layouts that pick one by name
    label: str = ""  # how the docs and logs call it (e.g. "DMTF ThermalMetrics", "Dell iDRAC")


# wao-core's vendor paths (pkg/metrics/redfish), tried only after the DMTF-standard resources of each chassis.
VENDOR_PATHS: Final = (
    InletPath(
        "/redfish/v1/Chassis/System.Embedded.1/Sensors/SystemBoardInletTemp", "Sensor", "", "Dell iDRAC"
    ),
    InletPath("/redfish/v1/Chassis/1/Sensors/128L0", "NamedSensor", "Ambient Temp", "Lenovo XClarity"),
    InletPath("/redfish/v1/Chassis/1/Thermal", "NamedTemperature", "System Temp", "Supermicro"),
)
INTAKE: Final = "Intake"


def _bad(message: str) -> CollectError:
    return CollectError(BAD_RESPONSE, message)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _list(doc: Mapping[str, Any], field: str) -> list[Any]:
    """An array field; [] when absent or not an array (a BMC's answer is not trusted to be well formed)."""
    value = doc.get(field)
    return value if isinstance(value, list) else []


def _enabled(entry: Mapping[str, Any]) -> bool:
    status = entry.get("Status")
    state = status.get("State") if isinstance(status, Mapping) else None
    return state in (None, "Enabled")


def link(doc: Mapping[str, Any], field: str) -> str | None:
    """The `@odata.id` of a navigation property, e.g. a Chassis's `Thermal`."""
    value = doc.get(field)
    target = value.get("@odata.id") if isinstance(value, Mapping) else None
    return target if isinstance(target, str) and target else None


def members(doc: Mapping[str, Any]) -> list[str]:
    """The member paths of a Redfish collection."""
    out = []
    for member in _list(doc, "Members"):
        target = member.get("@odata.id") if isinstance(member, Mapping) else None
        if isinstance(target, str) and target:
            out.append(target)
    return out


def intake_from_thermal_metrics(doc: Mapping[str, Any]) -> float:
    """ThermalSubsystem/ThermalMetrics: the Intake summary, else the first Intake reading."""
    summary = doc.get("TemperatureSummaryCelsius")
    if isinstance(summary, Mapping) and isinstance(summary.get(INTAKE), Mapping):
        value = _number(summary[INTAKE].get("Reading"))
        if value is not None:
            return value
    for entry in _list(doc, "TemperatureReadingsCelsius"):
        if isinstance(entry, Mapping) and entry.get("PhysicalContext") == INTAKE:
            value = _number(entry.get("Reading"))
            if value is not None:
                return value
    raise _bad(
        "ThermalMetrics has no Intake reading (TemperatureSummaryCelsius.Intake or PhysicalContext Intake)"
    )


def intake_from_thermal(doc: Mapping[str, Any]) -> float:
    """Legacy Chassis Thermal: the first enabled Temperatures[] entry with PhysicalContext Intake."""
    for entry in _list(doc, "Temperatures"):
        if isinstance(entry, Mapping) and entry.get("PhysicalContext") == INTAKE and _enabled(entry):
            value = _number(entry.get("ReadingCelsius"))
            if value is not None:
                return value
    raise _bad("Thermal has no enabled Temperatures[] entry with PhysicalContext Intake and a ReadingCelsius")


def read_inlet(path: InletPath, doc: Mapping[str, Any]) -> float:
    if path.layout == "ThermalMetrics":
        return intake_from_thermal_metrics(doc)
    if path.layout == "Thermal":
        return intake_from_thermal(doc)
    if path.layout in ("Sensor", "NamedSensor"):
        if path.name and doc.get("Name") != path.name:
            raise _bad(f"{path.path}: sensor Name is {doc.get('Name')!r}, not {path.name!r}")
        value = _number(doc.get("Reading"))
        if value is None:
            raise _bad(f"{path.path}: no numeric Reading")
        return value
    for entry in _list(doc, "Temperatures"):
        if isinstance(entry, Mapping) and entry.get("Name") == path.name:
            value = _number(entry.get("ReadingCelsius"))
            if value is not None:
                return value
    raise _bad(f"{path.path}: no Temperatures[] entry named {path.name!r} with a ReadingCelsius")


def differential_pressure(doc: Any) -> float:
    """The pressure API's answer: {"code": 200, "sensor": [{"pressure": 0.01, ...}]} -> sensor[0].pressure."""
    sensors = doc.get("sensor") if isinstance(doc, Mapping) else None
    if not isinstance(sensors, Sequence) or isinstance(sensors, str) or not sensors:
        raise _bad("pressure API answer has no sensor[] entry")
    first = sensors[0]
    value = _number(first.get("pressure")) if isinstance(first, Mapping) else None
    if value is None:
        raise _bad("pressure API answer: sensor[0].pressure is not a number")
    return value


@dataclass(frozen=True)
class InferenceEndpoint:
    """A V2 (Open Inference Protocol) model: where to POST and which model/version."""

    base: str  # scheme://host[:port][/prefix], without /v2
    model: str
    version: str = ""

    @property
    def infer_url(self) -> str:
        url = f"{self.base}/v2/models/{quote(self.model, safe='')}"
        if self.version:
            url += f"/versions/{quote(self.version, safe='')}"
        return url + "/infer"


def inference_endpoint(url: str) -> InferenceEndpoint:
    """Model and version from an endpoint as WAO writes it: .../v2/models/<m>[/versions/<v>][/infer]."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CollectError(INVALID_CONFIG, f"inference endpoint {url!r} is not an http(s) URL")
    segments = [s for s in parts.path.split("/") if s]
    if "models" not in segments or segments.index("models") + 1 >= len(segments):
        raise CollectError(
            INVALID_CONFIG, f"inference endpoint {url!r} names no model (.../v2/models/<name>)"
        )
    at = segments.index("models")
    model = segments[at + 1]
    version = ""
    if "versions" in segments[at:] and segments.index("versions", at) + 1 < len(segments):
        version = segments[segments.index("versions", at) + 1]
    prefix = segments[: at - 1] if at >= 1 and segments[at - 1] == "v2" else segments[:at]
    base = f"{parts.scheme}://{parts.netloc}" + "".join(f"/{s}" for s in prefix)
    return InferenceEndpoint(base, model, version)


def inference_request(cpu_usage: float, inlet_temp: float, delta_p: float) -> dict[str, Any]:
    """WAO's request: one FP32 row [cpu usage, inlet temperature, differential pressure]."""
    return {
        "inputs": [
            {
                "name": "predict-prob",
                "shape": [1, 3],
                "datatype": "FP32",
                "data": [[cpu_usage, inlet_temp, delta_p]],
            }
        ]
    }


def _first_number(data: Any) -> float | None:
    # Tensor data may come nested ([[94.7]]) or flattened ([94.7]); the protocol allows both.
    while isinstance(data, list) and data:
        data = data[0]
    return _number(data)


def inference_watts(doc: Any) -> float:
    """outputs[0].data[0] of a V2 inference response."""
    outputs = doc.get("outputs") if isinstance(doc, Mapping) else None
    if not isinstance(outputs, list) or not outputs or not isinstance(outputs[0], Mapping):
        raise _bad("inference response has no outputs[]")
    value = _first_number(outputs[0].get("data"))
    if value is None:
        raise _bad("inference response: outputs[0].data holds no number")
    return value


@dataclass(frozen=True)
class ProvidedEndpoint:
    type: str
    endpoint: str


def machine_learning_model(doc: Mapping[str, Any]) -> ProvidedEndpoint:
    """A system's MachineLearningModel (NEDO MLMM extension) -> the power model's type and infer URL."""
    model = doc.get("PowerConsumptionModel")
    if not isinstance(model, Mapping):
        raise _bad("MachineLearningModel has no PowerConsumptionModel")
    fields = {key: model.get(key) for key in ("Name", "Url", "Type", "Version")}
    missing = [key for key, value in fields.items() if not isinstance(value, str) or not value]
    if missing:
        raise _bad(f"MachineLearningModel.PowerConsumptionModel lacks {', '.join(missing)}")
    endpoint = InferenceEndpoint(str(fields["Url"]).rstrip("/"), str(fields["Name"]), str(fields["Version"]))
    return ProvidedEndpoint(str(fields["Type"]), endpoint.infer_url)
