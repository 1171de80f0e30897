"""What an RmdNodeState says, in the words its writer and its readers share (docs/node-state.md).

Each node's agent writes one RmdNodeState (rmd_agent.node_state); the operator finds it by its name, dials
status.endpoint, decides from status.capabilities which workloads the node can take, and waits while the
Ready condition is False, showing its reason (rmd_operator.targets, rmd_operator.pods). A key spelled
differently on one side is no error anywhere: the operator just sees "capability unknown" or "no agent"
forever. So the name, the capability keys and the condition vocabulary are spelled here only; the object's
fields themselves are the CRD's (crds/rmdnodestates.intel.com.yaml).
"""

from __future__ import annotations

import math

NAME_PREFIX = "rmd-node-state-"  # the CRD enforces rmd-node-state-<spec.node>


def node_state_name(node: str) -> str:
    """The name of `node`'s RmdNodeState."""
    return NAME_PREFIX + node


# status.capabilities: the features of `rmd-agent probe --json` (docs/probe.md). The operator decides on
# RDT_L3_CAT and MBA, and names POD_RESOURCES and POD_RESOURCES_GET when its CPU lookups fail.
RESCTRL_MOUNTED = "resctrlMounted"
RDT_L3_CAT = "rdtL3Cat"
MBA = "mba"
NUMA = "numa"
L3_CACHE = "l3Cache"
RAPL = "rapl"
CPUFREQ = "cpufreq"
CGROUP = "cgroup"
CPU_MANAGER_POLICY = "cpuManagerPolicy"
TOPOLOGY_MANAGER_POLICY = "topologyManagerPolicy"
POD_RESOURCES = "podResources"
POD_RESOURCES_GET = "podResourcesGet"  # which PodResources API the agent's pod lookups use


# The detail of TOPOLOGY_MANAGER_POLICY when the kubelet config was read: people read it, and
# `rmdctl validate` compares policy and scope across nodes, so it is written and parsed here only.
def topology_manager_detail(policy: str, scope: str) -> str:
    return f"{policy} (scope {scope})"


def parse_topology_manager_detail(detail: str) -> tuple[str, str] | None:
    """(policy, scope) of a detail topology_manager_detail wrote; None for any other text."""
    policy, sep, rest = detail.partition(" (scope ")
    if not sep or not policy or " " in policy or not rest.endswith(")"):
        return None
    scope = rest[:-1]
    return (policy, scope) if scope and " " not in scope else None


# status.conditions: the Ready condition and the reasons the agent gives it.
READY = "Ready"
AGENT_READY = "AgentReady"
ENGINE_NOT_READY = "EngineNotReady"
ENGINE_UNAVAILABLE = "EngineUnavailable"
AGENT_STOPPED = "AgentStopped"
# Given by the operator, not the agent: the agent stopped renewing its heartbeat Lease (below) while its
# RmdNodeState said Ready=True. The agent's next write of the condition replaces it.
HEARTBEAT_EXPIRED = "HeartbeatExpired"

# The agent's heartbeat: a coordination.k8s.io/v1 Lease in the RmdNodeState's namespace, renewed every
# heartbeat_seconds (docs/node-state.md "Heartbeat"). Its holderIdentity is new at every start of the agent,
# so the operator also learns from it that an agent restarted.
LEASE_PREFIX = "rmd-agent-"
LEASE_LABEL = "app.kubernetes.io/managed-by"
LEASE_LABEL_VALUE = "rmd-agent"


def lease_name(node: str) -> str:
    """The name of `node`'s agent heartbeat Lease."""
    return LEASE_PREFIX + node


def lease_duration_seconds(renew_seconds: float) -> int:
    """How long a renewal counts: two and a half renew periods (rounded up to the Lease's whole seconds).
    One late or lost renewal is tolerated, and a dead agent is declared within three periods of its death:
    its last renewal was at most at its death, and expiry comes 2.5 periods after that renewal, leaving half
    a period for the operator to notice and write."""
    return max(1, math.ceil(2.5 * renew_seconds))
