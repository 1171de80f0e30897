"""The agent's front end: the rmd.agent.v1 gRPC API with mTLS, gRPC health, and HTTP health and metrics.

Modules: convert (protobuf <-> engine types, pure), grpc_service (servicer, error mapping, identity check),
tls (credentials, client identities), metrics, http (/healthz, /readyz, /metrics), app (`rmd-agent serve`).
"""
