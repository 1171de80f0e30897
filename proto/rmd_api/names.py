"""The Kubernetes names the agent, the operator and the simulator must spell alike.

Each name is read on one side and written on another, so a typo or a version bump on one side alone breaks
the system without any error at either end: an operator watching `rmdnodestate` sees no agent, a pod asking
for `intel.com/l3_cache_way` never gets ways. So each is spelled here only; crds/ holds the same names
(tests/unit/test_contract_names.py checks they agree).

* RmdWorkload: written by people and by the operator's pod flow, watched and status-patched by the operator.
* RmdNodeState: written by each node's agent, watched by the operator (what it says: rmd_api.node_state).
* NodeResourceTopology: written by each node's agent for the scheduler; read by the simulator's demo.
* NodeConfig, NodeConfigTemplate (wao-core's API, group wao.bitmedia.co.jp): written by people; the operator
  writes a template's NodeConfigs and both kinds' status (what they say: rmd_api.node_config).
* `intel.com/l3_cache_ways`: the extended resource the agent's device plugin advertises to the kubelet, which
  pods ask for in their limits and the operator watches for (the pod flow) and the NodeResourceTopology lists.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CustomResource:
    """A custom resource type as the API addresses it: /apis/<group>/<version>/[namespaces/<ns>/]<plural>."""

    group: str
    version: str
    kind: str
    plural: str

    @property
    def api_version(self) -> str:
        """An object's apiVersion."""
        return f"{self.group}/{self.version}"

    @property
    def crd_name(self) -> str:
        """The name of its CustomResourceDefinition."""
        return f"{self.plural}.{self.group}"


RMD_WORKLOAD = CustomResource("intel.com", "v1alpha1", "RmdWorkload", "rmdworkloads")
RMD_NODE_STATE = CustomResource("intel.com", "v1alpha1", "RmdNodeState", "rmdnodestates")
RMD_CONFIG = CustomResource("intel.com", "v1alpha1", "RmdConfig", "rmdconfigs")
RMD_CONFIG_NAME = "rmdconfig"  # the one per cluster (the CRD refuses any other name)
NODE_RESOURCE_TOPOLOGY = CustomResource(
    "topology.node.k8s.io", "v1alpha2", "NodeResourceTopology", "noderesourcetopologies"
)
NODE_CONFIG = CustomResource("wao.bitmedia.co.jp", "v1beta1", "NodeConfig", "nodeconfigs")
NODE_CONFIG_TEMPLATE = CustomResource(
    "wao.bitmedia.co.jp", "v1beta1", "NodeConfigTemplate", "nodeconfigtemplates"
)

CACHE_WAYS_RESOURCE = "intel.com/l3_cache_ways"

# Written on a NodeResourceTopology a moment after each change (agent setting nrt_requeue_seconds), so the
# NUMA-aware scheduler retries the pods it rejected from its stale cache (docs/topology.md).
NRT_REQUEUE_ANNOTATION = "rmd.intel.com/nrt-requeue"
# On every NodeResourceTopology the agent writes: that delay in seconds ("0": no echo), so rmdctl validate can
# check that it follows the NUMA-aware scheduler's cache resync.
NRT_REQUEUE_SECONDS_ANNOTATION = "rmd.intel.com/nrt-requeue-seconds"
