"""A NodeConfig's spec as the collectors use it (pure).

The shape is wao-core's (`wao.bitmedia.co.jp/v1beta1`): `metricsCollector.inletTemp` (Redfish | Fake),
`metricsCollector.deltaP` (DifferentialPressureAPI | Fake), `predictor.powerConsumption`
(V2InferenceProtocol | Fake) and `predictor.powerConsumptionEndpointProvider` (Redfish | Fake), each an
EndpointTerm {type, endpoint, basicAuthSecret.name, fetchInterval}. Two fields are ours, both on an
EndpointTerm: `caBundleSecret` {name, key (default ca.crt)}, a CA bundle to trust for that endpoint, and
`insecureSkipVerify` (default false), the only way to skip certificate checks (WAO always skipped them).

The CRD rejects most bad specs at the API server; what still cannot run (a NodeConfig stored before the
schema, a type a field does not take) becomes a per-source `problem`, reported as InvalidConfig, never an
exception: one bad source must not stop the others.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

FAKE: Final = "Fake"
REDFISH: Final = "Redfish"
DP_API: Final = "DifferentialPressureAPI"
V2_INFERENCE: Final = "V2InferenceProtocol"

SourceKind = Literal["inletTemp", "deltaP", "powerConsumption"]
INLET_TEMP: Final = "inletTemp"
DELTA_P: Final = "deltaP"
POWER: Final = "powerConsumption"
SOURCE_KINDS: Final[tuple[SourceKind, ...]] = ("inletTemp", "deltaP", "powerConsumption")

DEFAULT_FETCH_INTERVAL: Final = 15.0  # wao-core's DefaultFetchInterval
MIN_FETCH_INTERVAL: Final = 1.0  # as WAO's runner loop: max(interval, 1s); BMCs do not like to be hammered
DEFAULT_CA_KEY: Final = "ca.crt"

_ALLOWED: Final[dict[str, tuple[str, ...]]] = {
    "metricsCollector.inletTemp": (REDFISH, FAKE),
    "metricsCollector.deltaP": (DP_API, FAKE),
    "predictor.powerConsumption": (V2_INFERENCE, FAKE),
    "predictor.powerConsumptionEndpointProvider": (REDFISH, FAKE),
}
_UNITS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


class DurationError(ValueError):
    pass


def parse_duration(text: str) -> float:
    """Seconds in a Go duration ("10s", "1m30s", "500ms", "1.5h"), as metav1.Duration writes them."""
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    body = body.lstrip("+-")
    if body == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(body):
        match = _DURATION_PART.match(body, pos)
        if match is None:
            raise DurationError(f"not a duration: {text!r} (write e.g. 15s, 1m30s, 500ms)")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not body:
        raise DurationError(f"not a duration: {text!r}")
    return sign * total


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str


@dataclass(frozen=True)
class EndpointTerm:
    """One EndpointTerm. `problem` is set when it cannot be used as written; the rest is then best effort."""

    field: str  # e.g. "metricsCollector.inletTemp", for messages
    type: str
    endpoint: str = ""
    basic_auth_secret: str | None = None
    fetch_interval: float = DEFAULT_FETCH_INTERVAL
    ca_secret: SecretKeyRef | None = None
    insecure_skip_verify: bool = False
    problem: str | None = None


@dataclass(frozen=True)
class Source:
    """One value to collect for a node: its term, and for the predictor the endpoint provider's term."""

    kind: SourceKind
    term: EndpointTerm
    provider: EndpointTerm | None = None

    @property
    def interval(self) -> float:
        return self.term.fetch_interval

    @property
    def problem(self) -> str | None:
        return self.term.problem or (self.provider.problem if self.provider else None)


@dataclass(frozen=True)
class NodeConfigSpec:
    namespace: str
    name: str
    node_name: str
    sources: tuple[Source, ...]

    def source(self, kind: SourceKind) -> Source | None:
        return next((s for s in self.sources if s.kind == kind), None)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def parse_term(field: str, raw: Mapping[str, Any], *, endpoint_optional: bool = False) -> EndpointTerm:
    problems: list[str] = []
    kind = str(raw.get("type") or "")
    endpoint = str(raw.get("endpoint") or "").strip()
    allowed = _ALLOWED[field]
    if kind not in allowed:
        problems.append(f"{field}.type must be one of {', '.join(allowed)}, not {kind!r}")
    elif kind != FAKE and not endpoint and not endpoint_optional:
        problems.append(f"{field}.endpoint is required for type {kind}")
    elif endpoint and not re.match(r"^https?://[^/\s]+", endpoint):
        problems.append(f"{field}.endpoint must be an http:// or https:// URL, not {endpoint!r}")
    interval = DEFAULT_FETCH_INTERVAL
    if raw.get("fetchInterval") not in (None, ""):
        try:
            interval = parse_duration(str(raw["fetchInterval"]))
        except DurationError as exc:
            problems.append(f"{field}.fetchInterval: {exc}")
        else:
            if interval <= 0:
                problems.append(f"{field}.fetchInterval must be positive, not {raw['fetchInterval']!r}")
                interval = DEFAULT_FETCH_INTERVAL
    secret = str(_mapping(raw.get("basicAuthSecret")).get("name") or "") or None
    ca = _mapping(raw.get("caBundleSecret"))
    ca_secret = (
        SecretKeyRef(str(ca["name"]), str(ca.get("key") or DEFAULT_CA_KEY)) if ca.get("name") else None
    )
    return EndpointTerm(
        field=field,
        type=kind,
        endpoint=endpoint.rstrip("/"),
        basic_auth_secret=secret,
        fetch_interval=max(interval, MIN_FETCH_INTERVAL),
        ca_secret=ca_secret,
        insecure_skip_verify=raw.get("insecureSkipVerify") is True,
        problem="; ".join(problems) or None,
    )


def parse_node_config(namespace: str, name: str, spec: Mapping[str, Any]) -> NodeConfigSpec:
    """The sources of a NodeConfig's spec. Absent optional sources (the predictor) are left out."""
    collector = _mapping(spec.get("metricsCollector"))
    predictor = _mapping(spec.get("predictor"))
    sources: list[Source] = []
    for kind, field, raw in (
        ("inletTemp", "metricsCollector.inletTemp", collector.get("inletTemp")),
        ("deltaP", "metricsCollector.deltaP", collector.get("deltaP")),
    ):
        sources.append(Source(kind, parse_term(field, _mapping(raw))))  # type: ignore[arg-type]
    power = predictor.get("powerConsumption")
    provider_raw = predictor.get("powerConsumptionEndpointProvider")
    if isinstance(power, Mapping) or isinstance(provider_raw, Mapping):
        provider = (
            parse_term("predictor.powerConsumptionEndpointProvider", provider_raw)
            if isinstance(provider_raw, Mapping)
            else None
        )
        raw_power = _mapping(power)
        if provider is not None and not raw_power.get("type"):
            # wao-core: the provider's answer gives the type and endpoint; powerConsumption may leave
            # them empty and lend only its basicAuthSecret and fetchInterval (the seed's provider example).
            raw_power = {**raw_power, "type": V2_INFERENCE}
        term = parse_term("predictor.powerConsumption", raw_power, endpoint_optional=provider is not None)
        sources.append(Source("powerConsumption", term, provider))
    return NodeConfigSpec(namespace, name, str(spec.get("nodeName") or ""), tuple(sources))
