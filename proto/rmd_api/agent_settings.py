"""The names of rmd-agent's settings, as the operator may set them for an RmdConfig (its spec.agentSettings).

The operator cannot import rmd_agent (the layers), so the names are spelled here; tests/unit check them
against rmd_agent.settings.AgentSettings and the chart's values schema, so the three never drift.
"""

from __future__ import annotations

# Settings a deployment may choose: the chart's values schema allows exactly these under agent.settings.
OVERRIDABLE = frozenset(
    {
        "allowed_clients",
        "device_plugin_enabled",
        "heartbeat_seconds",
        "insecure",
        "kubelet_timeout_seconds",
        "log_format",
        "log_level",
        "node_state_enabled",
        "node_state_resync_seconds",
        "nrt_enabled",
        "nrt_exclude",
        "nrt_min_write_interval_seconds",
        "nrt_pods_fingerprint_method",
        "nrt_poll_seconds",
        "nrt_requeue_seconds",
        "nrt_resync_seconds",
        "power_containers",
        "power_enabled",
        "power_interval_seconds",
        "pstate_counters",
        "rdt_metrics_interval_seconds",
        "shutdown_grace_seconds",
    }
)

# Of those, the ones the chart also reads to shape the pod or its RBAC (host mounts, the agent's Role): an
# RmdConfig changing them would leave the pod without what the setting needs, so only the chart sets them.
CHART_ONLY = frozenset(
    {"device_plugin_enabled", "heartbeat_seconds", "node_state_enabled", "nrt_enabled", "power_enabled"}
)

# The environment variable of a setting (rmd-agent reads RMD_<NAME>, above its config file).
ENV_PREFIX = "RMD_"


def env_name(setting: str) -> str:
    return ENV_PREFIX + setting.upper()
