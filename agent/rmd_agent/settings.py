"""The agent's one settings object. Precedence: command-line flags > environment > config file > defaults.

Environment variables are the field names upper-cased with an RMD_ prefix (RMD_HOST_ROOT); NODE_NAME is
also read, since that is what the downward API conventionally sets. Nothing else in the agent reads
os.environ. List settings (allowed_clients) take a YAML list in the file and a comma-separated string in a
flag or variable. Each field's `help` metadata is its flag's help text and its line in docs/agent.md.

Paths of things that belong to the node (kubelet files, the agent's state) are relative to host_root, so one
flag moves the agent onto a simulated node; paths of the agent's own files (certificates, policy file) are
taken as given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rmd_agent.errors import ConfigError
from rmd_agent.plan.policy import PolicyBook, parse_policies
from rmd_api.agent_certs import SIGNER_NAME
from rmd_api.names import CACHE_WAYS_RESOURCE
from rmd_api.settings_layers import as_plain_dict, dump, layered_values
from rmd_api.yaml_errors import YAML_ERRORS

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
ANY_CLIENT = "*"  # in allowed_clients: any certificate the client CA signed, with a DNS SAN


@dataclass(frozen=True)
class AgentSettings:
    node_name: str = field(default="", metadata={"help": "this node's name (also read from $NODE_NAME)"})
    host_root: Path = field(
        default=Path("/"), metadata={"help": "root of the host tree the agent reads and writes"}
    )
    # Kubelet paths are relative to host_root, so one flag moves the agent onto a simulated node.
    kubelet_dir: str = field(
        default="var/lib/kubelet", metadata={"help": "kubelet root directory, relative to host_root"}
    )
    kubelet_config: str = field(
        default="var/lib/kubelet/config.yaml",
        metadata={"help": "kubelet configuration file, relative to host_root"},
    )
    pod_resources_socket: str = field(
        default="var/lib/kubelet/pod-resources/kubelet.sock",
        metadata={"help": "kubelet PodResources socket, relative to host_root"},
    )
    kubelet_timeout_seconds: float = field(
        default=2.0, metadata={"help": "deadline of each kubelet PodResources call"}
    )
    log_format: str = field(default="text", metadata={"help": "log format: text or json"})
    log_level: str = field(default="info", metadata={"help": "log level: debug, info, warning or error"})
    # -- serve --
    grpc_listen: str = field(
        default="0.0.0.0:50051", metadata={"help": "host:port of the gRPC API (mTLS unless insecure)"}
    )
    http_listen: str = field(
        default="0.0.0.0:8081", metadata={"help": "host:port of /healthz, /readyz and /metrics (plain HTTP)"}
    )
    tls_cert: Path = field(
        default=Path("/etc/rmd-agent/tls/tls.crt"), metadata={"help": "PEM server certificate (chain)"}
    )
    tls_key: Path = field(
        default=Path("/etc/rmd-agent/tls/tls.key"), metadata={"help": "PEM private key of tls_cert"}
    )
    tls_client_ca: Path = field(
        default=Path("/etc/rmd-agent/tls/ca.crt"),
        metadata={"help": "PEM CA bundle that client certificates must chain to"},
    )
    tls_csr: bool = field(
        default=False,
        metadata={
            "help": "obtain and renew tls_cert/tls_key through the Kubernetes CSR API (signer "
            f"{SIGNER_NAME}, signed by the operator) instead of reading given files"
        },
    )
    tls_server_name: str = field(
        default="rmd-agent.{node}",
        metadata={
            "help": "with tls_csr: the DNS name to ask for ({node} is this node's name); must match the "
            "operator's agent_server_name"
        },
    )
    tls_csr_expiration_seconds: int = field(
        default=7 * 24 * 3600,
        metadata={"help": "with tls_csr: the certificate lifetime asked for (renewed at two thirds)"},
    )
    allowed_clients: tuple[str, ...] = field(
        default=("rmd-operator",),
        metadata={
            "help": "DNS names allowed to call: a client is identified by its certificate's DNS SANs "
            f"only (never its CN or a URI/IP/e-mail SAN); '{ANY_CLIENT}' allows any certificate the client "
            "CA signed that has a DNS SAN"
        },
    )
    insecure: bool = field(
        default=False, metadata={"help": "serve gRPC in plaintext without client authentication (warns)"}
    )
    state_path: str = field(
        default="var/lib/rmd-agent/state.json",
        metadata={"help": "the agent's record of what it enforced, relative to host_root"},
    )
    policy_file: str = field(
        default="", metadata={"help": "YAML policy file (gold/silver/bronze values); empty: built-in"}
    )
    shutdown_grace_seconds: float = field(
        default=5.0, metadata={"help": "on SIGTERM, how long in-flight calls may finish"}
    )
    # -- topology export (NodeResourceTopology; docs/topology.md) --
    nrt_enabled: bool = field(default=True, metadata={"help": "publish this node's NodeResourceTopology"})
    nrt_resync_seconds: float = field(
        default=60.0,
        metadata={"help": "full NodeResourceTopology refresh that also re-reads (and repairs) the object"},
    )
    nrt_min_write_interval_seconds: float = field(
        default=1.0, metadata={"help": "least time between NodeResourceTopology refreshes (bounds writes)"}
    )
    nrt_requeue_seconds: float = field(
        default=3.0,
        metadata={
            "help": "after a refresh that changed the NodeResourceTopology, write it once more this much "
            "later (an annotation only), so a scheduler that rejected a pod from its stale cache retries it "
            "once its cache has resynced; 0 turns it off"
        },
    )
    nrt_poll_seconds: float = field(
        default=2.0,
        metadata={
            "help": "polling interval of the NodeResourceTopology triggers where inotify cannot be used "
            "(and of PodResources List where the kubelet's pod cgroups cannot be found)"
        },
    )
    nrt_exclude: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "resources left out of the NodeResourceTopology: names or globs (memory, hugepages-*), "
            "optionally for one node only as <node>:<name>"
        },
    )
    nrt_pods_fingerprint_method: str = field(
        default="with-exclusive-resources",
        metadata={"help": "pods in the pod fingerprint: with-exclusive-resources or all"},
    )
    # -- power telemetry (docs/power.md, docs/metrics.md) --
    power_enabled: bool = field(
        default=True, metadata={"help": "sample RAPL energy and attribute it to pods (exported on /metrics)"}
    )
    power_interval_seconds: float = field(
        default=5.0, metadata={"help": "RAPL and cgroup CPU-time sampling interval"}
    )
    power_containers: bool = field(
        default=True, metadata={"help": "also export per-container energy (pods, node and system always)"}
    )
    rdt_metrics_interval_seconds: float = field(
        default=15.0,
        metadata={"help": "refresh of the per-workload cache metrics (ways, LLC occupancy, MBM)"},
    )
    # -- P-state monitoring (docs/pstate.md) --
    pstate_counters: str = field(
        default="perf",
        metadata={
            "help": "where P-state monitors read branch counters: perf (the kernel's perf events, needs "
            "CAP_PERFMON) or files (<host_root>/.rmd-sim/perf, written by a simulated node; test only)"
        },
    )
    # -- device plugin (docs/deviceplugin.md) --
    device_plugin_enabled: bool = field(
        default=True,
        metadata={
            "help": f"advertise the guaranteed pool's cache ways to the kubelet as {CACHE_WAYS_RESOURCE}"
        },
    )
    # -- kubernetes (RmdNodeState; docs/node-state.md) --
    kubeconfig: str = field(
        default="", metadata={"help": "kubeconfig file for the Kubernetes API; empty: in-cluster config"}
    )
    node_state_enabled: bool = field(
        default=True,
        metadata={"help": "publish this node's RmdNodeState (endpoint, capabilities, workloads)"},
    )
    node_state_namespace: str = field(
        default="default",
        metadata={"help": "namespace of this node's RmdNodeState (also read from $POD_NAMESPACE)"},
    )
    advertise_address: str = field(
        default="",
        metadata={
            "help": "host the operator dials for the gRPC API (also read from $POD_IP); "
            "empty: grpc_listen's host unless it is a wildcard"
        },
    )
    node_state_resync_seconds: float = field(
        default=60.0, metadata={"help": "how often the RmdNodeState is re-read, and recreated or repaired"}
    )
    heartbeat_seconds: float = field(
        default=5.0,
        metadata={
            "help": "how often the agent renews its heartbeat Lease rmd-agent-<node> (beside the "
            "RmdNodeState; it lasts 2.5 renewals, then the operator marks the node not ready); 0: none"
        },
    )

    def host_path(self, rel: str) -> Path:
        return self.host_root / rel.lstrip("/")

    def as_dict(self) -> dict[str, Any]:
        return as_plain_dict(self)


def load_settings(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> AgentSettings:
    """Build the settings from flags (only those given, i.e. not None), environment and an optional file."""
    values = layered_values(
        AgentSettings,
        flags=flags,
        environ=environ or {},
        config_file=config_file,
        env_prefix="RMD_",
        config_env="RMD_CONFIG",
        # What the downward API conventionally sets, below the RMD_ variables.
        aliases={
            "node_name": "NODE_NAME",
            "node_state_namespace": "POD_NAMESPACE",
            "advertise_address": "POD_IP",
        },
        error=ConfigError,
    )
    if values.get("log_format", "text") not in LOG_FORMATS:
        raise ConfigError(f"setting log_format: {values['log_format']!r} must be 'text' or 'json'")
    if values.get("log_level", "info") not in LOG_LEVELS:
        raise ConfigError(
            f"setting log_level: {values['log_level']!r} must be one of {', '.join(LOG_LEVELS)}"
        )
    return AgentSettings(**values)


def dump_settings(settings: AgentSettings) -> str:
    return dump(settings)


def split_host_port(address: str) -> tuple[str | None, int]:
    """ "0.0.0.0:8081" / "[::1]:8081" / ":8081" -> (host, port); host None means every interface."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"listen address {address!r} must be host:port, e.g. 0.0.0.0:8081 or [::1]:8081")
    host = host.removeprefix("[").removesuffix("]")
    return host or None, int(port)


def load_policy_file(path: Path | None) -> PolicyBook:
    """The built-in policies, overridden by the YAML file at `path` when one is given."""
    if path is None:
        return PolicyBook()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"policy file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"policy file {path}: not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except YAML_ERRORS as exc:
        raise ConfigError(f"policy file {path} is not valid YAML: {exc}") from None
    return parse_policies(data, source=str(path))
