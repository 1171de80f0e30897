"""The operator's one settings object. Precedence: command-line flags > environment > config file > defaults.

Environment variables are the field names upper-cased with an RMD_OPERATOR_ prefix
(RMD_OPERATOR_DRIFT_INTERVAL_SECONDS); POD_NAMESPACE and POD_NAME (what the downward API conventionally sets)
are read too, as fallbacks for node_state_namespace and instance. Nothing else in the operator reads
os.environ. List settings (namespaces) take a YAML list in the file and a comma-separated string in a flag or
variable. Each field's `help` metadata is its flag's help text and its line in docs/operator.md.

kopf evaluates decorator arguments when the handlers module is imported, so the settings must be final before
that import: `rmd-operator run` loads them, calls `activate`, and only then lets kopf import
rmd_operator.handlers. Run as `kopf run -m rmd_operator.handlers`, the handlers module activates the settings
from the environment and the config file itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmd_api.agent_certs import MIN_EXPIRATION_SECONDS, SIGNER_NAME
from rmd_api.settings_layers import as_plain_dict, dump, layered_values
from rmd_operator.errors import ConfigError

ENV_PREFIX = "RMD_OPERATOR_"
CONFIG_ENV = "RMD_OPERATOR_CONFIG"
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
NODE_PLACEHOLDER = "{node}"


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...] = field(
        default=(), metadata={"help": "namespaces whose RmdWorkloads are handled; empty: all namespaces"}
    )
    node_state_namespace: str = field(
        default="default",
        metadata={
            "help": "namespace where the agents write their RmdNodeStates (also read from $POD_NAMESPACE); "
            "RmdNodeStates elsewhere are ignored"
        },
    )
    agent_ca: Path = field(
        default=Path("/etc/rmd-operator/tls/ca.crt"),
        metadata={"help": "PEM CA bundle the agents' serving certificates must chain to"},
    )
    client_cert: Path = field(
        default=Path("/etc/rmd-operator/tls/tls.crt"),
        metadata={"help": "PEM client certificate (chain) the operator presents to the agents"},
    )
    client_key: Path = field(
        default=Path("/etc/rmd-operator/tls/tls.key"), metadata={"help": "PEM private key of client_cert"}
    )
    agent_server_name: str = field(
        default="rmd-agent.{node}",
        metadata={"help": "name an agent's certificate must carry (DNS SAN); {node} is the node's name"},
    )
    agent_signer_ca_cert: str = field(
        default="",
        metadata={
            "help": "PEM CA certificate that signs the agents' serving certificates requested through the "
            f"CSR API (signer {SIGNER_NAME}); empty: no signer (agents use given files)"
        },
    )
    agent_signer_ca_key: str = field(default="", metadata={"help": "PEM private key of agent_signer_ca_cert"})
    agent_service_account: str = field(
        default="rmd-agent",
        metadata={
            "help": "the agents' ServiceAccount (in node_state_namespace): the only requester whose agent "
            "certificate requests are signed"
        },
    )
    agent_cert_max_seconds: int = field(
        default=30 * 24 * 3600, metadata={"help": "longest lifetime of a signed agent certificate"}
    )
    insecure_agents: bool = field(
        default=False,
        metadata={"help": "talk to agents in plaintext without TLS or identity checks (warns; development)"},
    )
    agent_call_timeout_seconds: float = field(
        default=10.0, metadata={"help": "deadline of every call to an agent"}
    )
    agent_max_calls: int = field(
        default=8, metadata={"help": "calls in flight to one agent at most (more wait their turn)"}
    )
    retry_initial_seconds: float = field(
        default=2.0, metadata={"help": "first delay before retrying an unreachable agent (then doubled)"}
    )
    retry_max_seconds: float = field(
        default=300.0, metadata={"help": "longest delay between retries of an unreachable agent"}
    )
    drift_interval_seconds: float = field(
        default=60.0,
        metadata={
            "help": "how often each workload is checked against its agents (and re-applied where missing); "
            "also the retry interval of rejections that may pass later (capacity, conflicts)"
        },
    )
    remove_orphans: bool = field(
        default=True,
        metadata={
            "help": "remove workloads an agent holds for RmdWorkloads that no longer exist (in the handled "
            "namespaces)"
        },
    )
    peering: str = field(
        default="",
        metadata={"help": "kopf peering object name for several replicas; empty: standalone (one replica)"},
    )
    priority: int = field(default=0, metadata={"help": "this replica's peering priority"})
    liveness_listen: str = field(
        default="0.0.0.0:8080", metadata={"help": "host:port of the /healthz liveness endpoint; empty: none"}
    )
    metrics_listen: str = field(
        default="",
        metadata={
            "help": "host:port of the Prometheus /metrics endpoint (node telemetry); empty: none (the chart "
            "sets 0.0.0.0:8081)"
        },
    )
    log_format: str = field(default="text", metadata={"help": "log format: text or json"})
    log_level: str = field(default="info", metadata={"help": "log level: debug, info, warning or error"})
    watch_timeout_seconds: int = field(
        default=300, metadata={"help": "server-side timeout of each API watch request (then re-watched)"}
    )
    list_page_size: int = field(
        default=500,
        metadata={
            "help": "objects per page when listing (at start and after a watch falls too far behind), so "
            "a large cluster's pods never arrive in one piece"
        },
    )
    instance: str = field(
        default="",
        metadata={"help": "this replica's name in Events (also read from $POD_NAME); empty: the host name"},
    )

    # -- the pod flow: pods with an intel.com/l3_cache_ways limit (docs/pods.md) -----------------------------
    delete_failed_pods: bool = field(
        default=True,
        metadata={
            "help": "delete a pod whose cache request failed on its node, with an Event saying why (as "
            "rmd-operator did; its controller may place a new pod elsewhere); false: keep it, Event only"
        },
    )

    # -- NodeConfigTemplates (wao.bitmedia.co.jp, docs/telemetry.md) ---------------------------------------
    node_config_templates: bool = field(
        default=True,
        metadata={
            "help": "keep one NodeConfig per node matching each NodeConfigTemplate (in the handled "
            "namespaces); false where wao-core's controller still does it"
        },
    )

    node_telemetry: bool = field(
        default=True,
        metadata={
            "help": "collect each NodeConfig's inlet temperature, pressure and predicted power (in the "
            "handled namespaces) into its status and the metrics; false where wao-core's adapter does it"
        },
    )

    # -- RmdConfig (intel.com, docs/install.md "Deployed by an RmdConfig") ----------------------------------
    agent_manifests_configmap: str = field(
        default="",
        metadata={
            "help": "ConfigMap in node_state_namespace holding the agents' manifests (the chart's "
            "<fullname>-agent-manifests, with agent.deployedBy rmdconfig): deploy them for the cluster's "
            "RmdConfig; empty: RmdConfigs are not handled (the chart deploys the agents)"
        },
    )
    cluster_name: str = field(
        default="",
        metadata={
            "help": "the chart's name prefix of cluster-scoped objects (rmd.clusterName): the NUMA-aware "
            "scheduler's ClusterRoleBindings and ClusterRole are named after it"
        },
    )
    agent_pods_fingerprint_method: str = field(
        default="with-exclusive-resources",
        metadata={
            "help": "the agents' nrt_pods_fingerprint_method as the chart sets it, which the NUMA-aware "
            "scheduler's cache resync must match (an RmdConfig's agentSettings may override it)"
        },
    )
    rmdconfig_resync_seconds: float = field(
        default=60.0,
        metadata={
            "help": "how often the RmdConfig's objects and status are checked again when nothing changed "
            "(a ServiceMonitor CRD installed later is found by then at the latest); 5 s while agents roll out"
        },
    )

    def agent_user(self) -> str:
        """The user name of the agents' ServiceAccount as the API server reports it."""
        return f"system:serviceaccount:{self.node_state_namespace}:{self.agent_service_account}"

    def server_name(self, node: str) -> str:
        """The identity the agent on `node` must prove (its certificate's DNS SAN)."""
        return self.agent_server_name.replace(NODE_PLACEHOLDER, node)

    def as_dict(self) -> dict[str, Any]:
        return as_plain_dict(self)


def _check(s: OperatorSettings) -> None:
    if s.log_format not in LOG_FORMATS:
        raise ConfigError(f"setting log_format: {s.log_format!r} must be 'text' or 'json'")
    if s.log_level not in LOG_LEVELS:
        raise ConfigError(f"setting log_level: {s.log_level!r} must be one of {', '.join(LOG_LEVELS)}")
    if s.agent_server_name.count(NODE_PLACEHOLDER) != 1:
        raise ConfigError(
            f"setting agent_server_name: {s.agent_server_name!r} must contain {NODE_PLACEHOLDER} once, "
            "so that each agent proves it is the agent of the node it claims to be"
        )
    for name in (
        "agent_call_timeout_seconds",
        "retry_initial_seconds",
        "drift_interval_seconds",
        "rmdconfig_resync_seconds",
    ):
        if getattr(s, name) <= 0:
            raise ConfigError(f"setting {name}: must be positive, not {getattr(s, name)}")
    if s.retry_max_seconds < s.retry_initial_seconds:
        raise ConfigError(
            f"setting retry_max_seconds: {s.retry_max_seconds} is below retry_initial_seconds "
            f"{s.retry_initial_seconds}"
        )
    if s.agent_max_calls < 1:
        raise ConfigError(f"setting agent_max_calls: must be at least 1, not {s.agent_max_calls}")
    if bool(s.agent_signer_ca_cert) != bool(s.agent_signer_ca_key):
        raise ConfigError("settings agent_signer_ca_cert and agent_signer_ca_key: give both or neither")
    if s.agent_cert_max_seconds < MIN_EXPIRATION_SECONDS:
        raise ConfigError(
            f"setting agent_cert_max_seconds: at least {MIN_EXPIRATION_SECONDS}, "
            f"not {s.agent_cert_max_seconds}"
        )
    if s.list_page_size < 1:
        raise ConfigError(f"setting list_page_size: must be at least 1, not {s.list_page_size}")
    if s.watch_timeout_seconds <= 0:
        raise ConfigError(f"setting watch_timeout_seconds: must be positive, not {s.watch_timeout_seconds}")
    if s.metrics_listen:
        host, sep, port = s.metrics_listen.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ConfigError(
                f"setting metrics_listen: {s.metrics_listen!r} must be host:port, e.g. 0.0.0.0:8081"
            )
    if not s.node_state_namespace:
        raise ConfigError("setting node_state_namespace: must name the namespace of the RmdNodeStates")


def load_settings(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> OperatorSettings:
    """Build the settings from flags (only those given, i.e. not None), environment and an optional file."""
    values = layered_values(
        OperatorSettings,
        flags=flags,
        environ=environ or {},
        config_file=config_file,
        env_prefix=ENV_PREFIX,
        config_env=CONFIG_ENV,
        # The downward API's conventional names, below the prefixed ones.
        aliases={"node_state_namespace": "POD_NAMESPACE", "instance": "POD_NAME"},
        error=ConfigError,
    )
    settings = OperatorSettings(**values)
    _check(settings)
    return settings


def dump_settings(settings: OperatorSettings) -> str:
    return dump(settings)


# -- the settings of this process ----------------------------------------------------------------------------

_active: OperatorSettings | None = None


def activate(settings: OperatorSettings) -> None:
    """Make `settings` the process's settings; call before rmd_operator.handlers is imported."""
    global _active  # noqa: PLW0603  # the one process-wide value, set once at start
    _active = settings


def active() -> OperatorSettings:
    """The process's settings; loaded from the environment (and its config file) if nobody activated any,
    which is what happens under a plain `kopf run -m rmd_operator.handlers`."""
    if _active is None:
        activate(load_settings(environ=os.environ))
    assert _active is not None
    return _active
