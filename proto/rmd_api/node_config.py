"""What a NodeConfig and a NodeConfigTemplate say (wao-core's API, docs/telemetry.md), in the words their
writers and readers share: the operator's template controller writes NodeConfigs and the templates' status,
the collectors read NodeConfigs and write their status. The objects' fields themselves are the CRDs'
(crds/nodeconfigs.wao.bitmedia.co.jp.yaml, crds/nodeconfigtemplates.wao.bitmedia.co.jp.yaml).
"""

from __future__ import annotations

# spec.metricsCollector.<source>.type and spec.predictor.<source>.type (wao-core's constants).
TYPE_FAKE = "Fake"
TYPE_REDFISH = "Redfish"
TYPE_DPAPI = "DifferentialPressureAPI"
TYPE_V2_INFERENCE = "V2InferenceProtocol"

# The endpoint terms, as (section, field) of spec, and the types each takes ("" also for the two predictors,
# whose endpoint provider then gives type and endpoint).
METRICS_COLLECTOR = "metricsCollector"
PREDICTOR = "predictor"
INLET_TEMP = "inletTemp"
DELTA_P = "deltaP"
POWER_CONSUMPTION = "powerConsumption"
POWER_CONSUMPTION_ENDPOINT_PROVIDER = "powerConsumptionEndpointProvider"
RESPONSE_TIME = "responseTime"
RESPONSE_TIME_ENDPOINTS_PROVIDER = "responseTimeEndpointsProvider"  # sic: wao-core's JSON name
TERMS: dict[tuple[str, str], tuple[str, ...]] = {
    (METRICS_COLLECTOR, INLET_TEMP): (TYPE_REDFISH, TYPE_FAKE),
    (METRICS_COLLECTOR, DELTA_P): (TYPE_DPAPI, TYPE_FAKE),
    (PREDICTOR, POWER_CONSUMPTION): (TYPE_V2_INFERENCE, TYPE_FAKE, ""),
    (PREDICTOR, POWER_CONSUMPTION_ENDPOINT_PROVIDER): (TYPE_REDFISH, TYPE_FAKE),
    (PREDICTOR, RESPONSE_TIME): (TYPE_V2_INFERENCE, TYPE_FAKE, ""),
    (PREDICTOR, RESPONSE_TIME_ENDPOINTS_PROVIDER): (TYPE_REDFISH, TYPE_FAKE),
}
# An endpoint term's string fields a template may fill in per node (wao-core's choice; not fetchInterval).
TEMPLATED_FIELDS = ("type", "endpoint", "basicAuthSecret.name")
# basicAuthSecret names a Secret in the object's namespace with these keys.
SECRET_USERNAME_KEY = "username"
SECRET_PASSWORD_KEY = "password"  # a key name, not a password

DEFAULT_FETCH_INTERVAL_SECONDS = 15.0  # fetchInterval when absent (wao-core's DefaultFetchInterval)
MIN_FETCH_INTERVAL_SECONDS = 1.0  # the CRD refuses less

# NodeConfig status: status.sources.<source> {value, time, conditions} for each source the collectors read
# (inletTemp °C, deltaP Pa, powerConsumption W; value a decimal string), with these condition types
# (rmd_operator.telemetry.state).
SOURCES = (INLET_TEMP, DELTA_P, POWER_CONSUMPTION)
SOURCE_CONDITION_TYPES = ("Available", "Stale", "Error")

# NodeConfigTemplate status: the Ready condition and the reasons a node has no NodeConfig as the template says
# (also the reasons of the Warning Events on the template).
READY = "Ready"
SYNCED = "Synced"
TEMPLATE_ERROR = "TemplateError"
CONFLICT = "Conflict"
INVALID = "Invalid"
WRITE_FAILED = "WriteFailed"
INVALID_SELECTOR = "InvalidSelector"

# The template data (wao-core's TemplateData): what {{.Hostname}} and {{.IPv4.*}} name.
HOSTNAME_LABEL = "kubernetes.io/hostname"


def node_config_name(template: str, node: str) -> str:
    """The name of the NodeConfig a template keeps for a node (wao-core's naming)."""
    return f"{template}-{node}"
