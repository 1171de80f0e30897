"""Prometheus metrics of the agent's gRPC server, on the one registry the process exports at /metrics.

Labels stay bounded: service and method come only from registered handlers (an unknown method is never
observed), and the code is one of gRPC's status codes.
"""

from __future__ import annotations

from grpclib.const import Status
from prometheus_client import CollectorRegistry, Counter, Histogram

# Round trips are sub-millisecond when the engine has nothing to write, tens of ms when resctrl is written.
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def split_method(full_method: str) -> tuple[str, str]:
    """ "/rmd.agent.v1.Agent/ApplyWorkload" -> ("rmd.agent.v1.Agent", "ApplyWorkload")."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service, method


class GrpcMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.handled = Counter(
            "rmd_agent_grpc_server_handled_total",
            "gRPC calls completed by the agent, by method and status code",
            ["grpc_service", "grpc_method", "grpc_code"],
            registry=registry,
        )
        self.seconds = Histogram(
            "rmd_agent_grpc_server_handling_seconds",
            "Time the agent took to answer a gRPC call, by method and status code",
            ["grpc_service", "grpc_method", "grpc_code"],
            buckets=_BUCKETS,
            registry=registry,
        )

    def observe(self, full_method: str, code: Status, seconds: float) -> None:
        labels = (*split_method(full_method), code.name)
        self.handled.labels(*labels).inc()
        self.seconds.labels(*labels).observe(seconds)
