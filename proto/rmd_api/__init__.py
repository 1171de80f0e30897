"""Shared contract between the RMD agent and operator: everything both sides must spell or read alike.

agent/v1 and kubelet/: protobuf stubs (the agent's gRPC API; the kubelet APIs and checkpoints the agent reads
and the simulator serves). names: custom resources and the cache-ways resource. node_state: what an
RmdNodeState says. workload_spec: the RmdWorkload spec layouts <-> the agent's WorkloadSpec. agent_certs: the
agents' serving certificates. cpuset, settings_layers: shared types. It imports nothing of rmd_agent,
rmd_operator or rmd_sim.
"""
