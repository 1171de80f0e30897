"""What an RmdNodeState says, in the words its writer and its readers share (docs/node-state.md).

Each node's agent writes one RmdNodeState (rmd_agent.node_state); the operator finds it by its name, dials
status.endpoint, decides from status.capabilities which workloads the node can take, and waits while the
Ready condition is False, showing its reason (rmd_operator.targets, rmd_operator.pods). A key spelled
differently on one side is no error anywhere: the operator just sees "capability unknown" or "no agent"
forever. So the name, the capability keys and the condition vocabulary are spelled here only; the object's
fields themselves are the CRD's (crds/rmdnodestates.intel.com.yaml).
"""

from __future__ import annotations

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

# status.conditions: the Ready condition and the reasons the agent gives it.
READY = "Ready"
AGENT_READY = "AgentReady"
ENGINE_NOT_READY = "EngineNotReady"
ENGINE_UNAVAILABLE = "EngineUnavailable"
AGENT_STOPPED = "AgentStopped"
