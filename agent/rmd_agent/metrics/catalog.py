"""Every metric the agent exports: name, type, help and labels, in one place.

The collectors build their families from these entries (so a name or label cannot drift from its
documentation), docs/metrics.md is generated from them (tools/gen_metrics_doc.py, drift-checked in CI), and
the dashboard test checks every query against them. Names are as exposed: counters end in `_total`.
"""

from __future__ import annotations

from prometheus_client.core import Metric

from rmd_api.metric_spec import Group, MetricSpec, MetricType

__all__ = ["GROUPS", "LABELS", "METRICS", "Group", "MetricSpec", "MetricType", "family", "spec"]

GROUPS = (
    Group(
        "node",
        "Node energy (RAPL)",
        "One series per RAPL zone and socket, read from powercap and corrected for counter wraparound. "
        "Zones overlap: `package` contains `core` and `uncore`, `psys` covers the platform. Never sum "
        "across zones; use one zone, or `rmd_node_host_*` which picks zones that do not overlap.",
    ),
    Group(
        "workload",
        "Pod, container and system energy",
        "The active part of each zone's energy (energy x node CPU busy ratio), split by cgroup CPU time. "
        "Per zone kind, summed over sockets. `rmd_pod_*` + `rmd_system_*` = `rmd_node_active_*` for each "
        "zone; idle energy is not attributed. Terminated pods are exported once more after they end, "
        "then dropped. docs/power.md explains the model.",
    ),
    Group(
        "rdt",
        "Cache allocation and monitoring (RDT)",
        "Per workload enforced on the node. Occupancy and bandwidth come from the workload's resctrl "
        "group when resctrl monitoring exists; workloads sharing a group report the group's figures.",
    ),
    Group("agent", "Agent", "The agent's own health: sampling cost and errors, gRPC server."),
)

_ZONE = ("zone", "socket")
_POD = ("namespace", "pod", "uid")
_WORKLOAD = ("namespace", "workload", "cos", "cache_id")

METRICS: tuple[MetricSpec, ...] = (
    # node
    MetricSpec("rmd_node_energy_joules_total", "counter", "Energy of a RAPL zone", _ZONE, "node", "J"),
    MetricSpec(
        "rmd_node_active_energy_joules_total",
        "counter",
        "Active part of a RAPL zone's energy (energy x node CPU busy ratio)",
        _ZONE,
        "node",
        "J",
    ),
    MetricSpec(
        "rmd_node_idle_energy_joules_total",
        "counter",
        "Idle part of a RAPL zone's energy (energy - active energy)",
        _ZONE,
        "node",
        "J",
    ),
    MetricSpec(
        "rmd_node_power_watts", "gauge", "Power of a RAPL zone over the last interval", _ZONE, "node", "W"
    ),
    MetricSpec(
        "rmd_node_active_power_watts",
        "gauge",
        "Active power of a RAPL zone over the last interval",
        _ZONE,
        "node",
        "W",
    ),
    MetricSpec(
        "rmd_node_idle_power_watts",
        "gauge",
        "Idle power of a RAPL zone over the last interval",
        _ZONE,
        "node",
        "W",
    ),
    MetricSpec(
        "rmd_node_host_energy_joules_total",
        "counter",
        "Node energy from RAPL zones that do not overlap (psys, else package + dram)",
        ("zones",),
        "node",
        "J",
    ),
    MetricSpec(
        "rmd_node_host_power_watts",
        "gauge",
        "Node power from RAPL zones that do not overlap (psys, else package + dram), last interval",
        ("zones",),
        "node",
        "W",
    ),
    MetricSpec(
        "rmd_node_cpu_busy_ratio",
        "gauge",
        "Share of CPU time not idle over the last interval (/proc/stat)",
        (),
        "node",
    ),
    MetricSpec(
        "rmd_rapl_available",
        "gauge",
        "1 when RAPL energy counters are read, 0 with the reason when not (VM, no driver, permissions)",
        ("reason",),
        "node",
    ),
    # workloads
    MetricSpec(
        "rmd_pod_energy_joules_total",
        "counter",
        "Active energy attributed to a pod",
        (*_POD, "zone"),
        "workload",
        "J",
    ),
    MetricSpec(
        "rmd_pod_power_watts",
        "gauge",
        "Active power attributed to a pod over the last interval",
        (*_POD, "zone"),
        "workload",
        "W",
    ),
    MetricSpec(
        "rmd_container_energy_joules_total",
        "counter",
        'Active energy attributed to a container; container="" is the pod\'s sandbox and anything unnamed',
        (*_POD, "container", "zone"),
        "workload",
        "J",
    ),
    MetricSpec(
        "rmd_container_power_watts",
        "gauge",
        "Active power attributed to a container over the last interval",
        (*_POD, "container", "zone"),
        "workload",
        "W",
    ),
    MetricSpec(
        "rmd_system_energy_joules_total",
        "counter",
        "Active energy of processes outside pods (kubelet, runtime, system services, kernel)",
        ("zone",),
        "workload",
        "J",
    ),
    MetricSpec(
        "rmd_system_power_watts",
        "gauge",
        "Active power of processes outside pods over the last interval",
        ("zone",),
        "workload",
        "W",
    ),
    # RDT
    MetricSpec(
        "rmd_workload_cache_ways",
        "gauge",
        "L3 cache ways allocated to a workload per cache domain",
        _WORKLOAD,
        "rdt",
    ),
    MetricSpec(
        "rmd_workload_llc_occupancy_bytes",
        "gauge",
        "L3 cache occupancy of the workload's resctrl group (llc_occupancy)",
        _WORKLOAD,
        "rdt",
        "bytes",
    ),
    MetricSpec(
        "rmd_workload_memory_bandwidth_bytes_total",
        "counter",
        "Memory traffic of the workload's resctrl group (mbm_total_bytes, mbm_local_bytes); rate() gives B/s",
        (*_WORKLOAD, "scope"),
        "rdt",
        "bytes",
    ),
    # agent
    MetricSpec("rmd_agent_power_samples_total", "counter", "Power samples taken", (), "agent"),
    MetricSpec(
        "rmd_agent_power_sample_errors_total",
        "counter",
        "Host read problems met while sampling, by source (rapl, proc_stat, cgroup) or internal",
        ("source",),
        "agent",
    ),
    MetricSpec(
        "rmd_agent_power_sample_duration_seconds",
        "histogram",
        "Wall time of one power sample (host reads and attribution)",
        (),
        "agent",
        "s",
    ),
    MetricSpec(
        "rmd_agent_power_last_sample_timestamp_seconds",
        "gauge",
        "When the last power sample was taken (seconds since the epoch)",
        (),
        "agent",
        "s",
    ),
    MetricSpec(
        "rmd_agent_rdt_refresh_errors_total",
        "counter",
        "Failures refreshing RDT workload metrics (workload list or resctrl monitoring reads)",
        (),
        "agent",
    ),
    # defined in rmd_agent.server.metrics (GrpcMetrics); listed so they are documented and checked
    MetricSpec(
        "rmd_agent_grpc_server_handled_total",
        "counter",
        "gRPC calls completed by the agent, by method and status code",
        ("grpc_service", "grpc_method", "grpc_code"),
        "agent",
    ),
    MetricSpec(
        "rmd_agent_grpc_server_handling_seconds",
        "histogram",
        "Time the agent took to answer a gRPC call, by method and status code",
        ("grpc_service", "grpc_method", "grpc_code"),
        "agent",
        "s",
    ),
)

LABELS: dict[str, str] = {
    "zone": "RAPL zone kind: package, core, uncore, dram or psys",
    "socket": 'CPU socket of the zone ("" for psys, which is the whole platform)',
    "zones": 'the zones summed, e.g. "package+dram" or "psys"',
    "reason": 'why RAPL is not read ("" when it is)',
    "namespace": "pod namespace, from the kubelet's log directories (empty if the pod cannot be named)",
    "pod": "pod name, from the same place",
    "uid": "pod UID, from the pod's cgroup path",
    "container": 'container name; "" for the sandbox and containers not yet named',
    "workload": "RmdWorkload (or pod-requested workload) name",
    "cos": "the resctrl group (class of service) holding the workload's CPUs",
    "cache_id": "L3 cache domain id (one per socket, or per die on some parts)",
    "scope": "total (all memory) or local (the domain's own NUMA node)",
    "source": "rapl, proc_stat, cgroup or internal",
    "grpc_service": "gRPC service",
    "grpc_method": "gRPC method",
    "grpc_code": "gRPC status code name",
}

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


def spec(name: str) -> MetricSpec:
    return BY_NAME[name]


def family(name: str) -> Metric:
    """An empty family for a catalog metric, with its labels declared."""
    return BY_NAME[name].family()


def all_series_names() -> frozenset[str]:
    """Every series name the catalog's metrics can produce (for checking queries)."""
    return frozenset(name for m in METRICS for name in m.sample_names())
