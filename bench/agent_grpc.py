"""Benchmark: the agent's ApplyWorkload round trip over mTLS, and its idle memory.

Starts `rmd-agent serve` in a child process on loopback with throw-away certificates (rmd_sim.pki), waits
for /readyz, reads the child's RSS while idle, then times sequential round trips from a client holding an
allowed client certificate:

    health      grpc.health.v1 Check on the same channel: TLS, HTTP/2, interceptor and no engine (baseline)
    apply same  ApplyWorkload of an unchanged spec (the operator's steady state; engine answers "unchanged")
    apply flip  ApplyWorkload alternating between two cache sizes (the engine rewrites the allocation)
    connect     a new mTLS channel plus one health check (handshake cost, paid once per operator->agent
                connection)

The ratio of each figure to the health baseline, measured in the same run, is what to compare across
machines. With `--engine real` (default when rmd_agent.engine exists) the agent runs its real engine on a
simulated node tree (rmd_sim); `--engine fake` serves an in-memory engine, measuring the server alone.

    python bench/agent_grpc.py [--calls 2000] [--engine auto|fake|real] [--json]

Targets (issue): ApplyWorkload p99 <= 50 ms over mTLS; agent RSS idle <= 60 MiB. Exit status 1 if missed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rmd_agent.engine_api import AppliedWorkload, ContainerCpus, CpuState, NodeSummary
from rmd_agent.logsetup import configure_logging
from rmd_agent.plan.workload import Workload
from rmd_agent.server.app import serve
from rmd_agent.settings import load_settings
from rmd_api.agent.v1 import agent_pb2, agent_pb2_grpc

# The simulator is imported only where the benchmark (the parent) uses it: this file is also the fake
# agent's program (--serve-fake), whose memory is measured.

_agent_stub: Any = agent_pb2_grpc.AgentStub  # generated without annotations

TARGET_P99_MS = 50.0
TARGET_RSS_MIB = 60.0
CLIENT_IDENTITY = "rmd-operator"
READY_TIMEOUT = 60.0


# -- the fake-engine agent (child process) -------------------------------------------------------------------


def _serve_fake(settings_json: str) -> None:
    """Child process: the real `serve()` with an in-memory engine."""

    class MemoryEngine:
        def __init__(self) -> None:
            self.held: dict[str, AppliedWorkload] = {}

        async def start(self) -> None: ...

        async def close(self) -> None: ...

        async def apply(self, workload: Workload) -> tuple[AppliedWorkload, bool]:
            applied = AppliedWorkload(
                dataclasses.replace(workload, resolved=True),
                id=workload.key,
                cos_name=workload.name,
                pool="guaranteed",
                cache={0: (1 << (workload.cache_max or 0)) - 1},
            )
            changed = self.held.get(workload.key) != applied
            self.held[workload.key] = applied
            return applied, changed

        async def remove(self, namespace: str, name: str, uid: str = "") -> bool:
            return self.held.pop(f"{namespace}/{name}", None) is not None

        async def list(self) -> list[AppliedWorkload]:
            return list(self.held.values())

        async def node(self) -> NodeSummary:
            return NodeSummary("bench", {}, 0, 0, (), 0, 0, len(self.held))

        async def container_cpus(self, namespace: str, pod: str, uid: str, container: str) -> ContainerCpus:
            return ContainerCpus(CpuState.NOT_YET_ALLOCATED)

        async def ready(self) -> tuple[bool, str]:
            return True, ""

    settings = load_settings(json.loads(settings_json))
    configure_logging(settings.log_format, settings.log_level)
    asyncio.run(serve(settings, lambda _settings, _pods: MemoryEngine()))


# -- measuring -----------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _wait_ready(proc: subprocess.Popen[bytes], http_port: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the agent exited with status {proc.returncode}; see its log above")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=1) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"the agent was not ready within {READY_TIMEOUT:g}s")


@dataclasses.dataclass(frozen=True)
class Figures:
    name: str
    calls: int
    p50_ms: float
    p99_ms: float
    mean_ms: float


def _time(name: str, calls: int, call: Callable[[int], Any]) -> Figures:
    samples = []
    for i in range(calls):
        started = time.perf_counter()
        call(i)
        samples.append((time.perf_counter() - started) * 1000)
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return Figures(name, calls, cuts[49], cuts[98], statistics.fmean(samples))


def _apply_request(ways: int) -> agent_pb2.ApplyWorkloadRequest:
    return agent_pb2.ApplyWorkloadRequest(
        ref=agent_pb2.WorkloadRef(namespace="bench", name="w", uid="bench-uid"),
        spec=agent_pb2.WorkloadSpec(core_ids=["2-3"], cache=agent_pb2.CacheRequest(max=ways, min=ways)),
    )


def _measure(target: str, credentials: grpc.ChannelCredentials, calls: int) -> list[Figures]:
    with grpc.secure_channel(target, credentials) as channel:
        agent: Any = _agent_stub(channel)
        health: Any = health_pb2_grpc.HealthStub(channel)
        check = health_pb2.HealthCheckRequest()
        requests = [_apply_request(2), _apply_request(3)]
        for i in range(max(50, calls // 10)):  # warm up: connection, code paths, allocator
            health.Check(check, timeout=5)
            agent.ApplyWorkload(requests[i % 2], timeout=5)
        figures = [
            _time("health", calls, lambda _: health.Check(check, timeout=5)),
            _time("apply same", calls, lambda _: agent.ApplyWorkload(requests[0], timeout=5)),
            _time("apply flip", calls, lambda i: agent.ApplyWorkload(requests[i % 2], timeout=5)),
        ]

    def connect(_: int) -> None:
        with grpc.secure_channel(target, credentials) as fresh:
            health_pb2_grpc.HealthStub(fresh).Check(check, timeout=5)

    figures.append(_time("connect", max(20, calls // 20), connect))
    return figures


def _engine_mode(choice: str) -> str:
    if choice != "auto":
        return choice
    return "real" if importlib.util.find_spec("rmd_agent.engine") is not None else "fake"


def run(calls: int, engine: str) -> dict[str, Any]:
    from rmd_sim.pki import CertificateAuthority  # noqa: PLC0415  # not in the fake agent

    work = Path(tempfile.mkdtemp(prefix="rmd-bench-"))
    ca = CertificateAuthority("bench-ca")
    server = ca.issue_server("rmd-agent", dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    client = ca.issue_client("bench", dns_names=[CLIENT_IDENTITY])
    for name, data in {"tls.crt": server.cert_pem, "tls.key": server.key_pem, "ca.crt": ca.cert_pem}.items():
        (work / name).write_bytes(data)
    grpc_port, http_port = _free_port(), _free_port()
    settings: dict[str, Any] = {
        "node_name": "bench",
        "grpc_listen": f"127.0.0.1:{grpc_port}",
        "http_listen": f"127.0.0.1:{http_port}",
        "tls_cert": str(work / "tls.crt"),
        "tls_key": str(work / "tls.key"),
        "tls_client_ca": str(work / "ca.crt"),
        "allowed_clients": CLIENT_IDENTITY,
        "log_level": "warning",
    }
    mount = None
    if engine == "real":
        from rmd_sim.hosttree import write_host_tree  # noqa: PLC0415  # not in the fake agent
        from rmd_sim.resctrl_fuse import ResctrlMount  # noqa: PLC0415
        from rmd_sim.spec import load_spec  # noqa: PLC0415

        write_host_tree(load_spec("default"), work / "host")
        mount = ResctrlMount(work / "host")  # the agent needs a kernel-like resctrl, not plain files
        mount.start()
        settings["host_root"] = str(work / "host")
        settings["pstate_counters"] = "files"
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
        command = [sys.executable, "-m", "rmd_agent", "serve", *flags]
    else:
        command = [sys.executable, __file__, "--serve-fake", json.dumps(settings)]
    proc = subprocess.Popen(command)
    try:
        _wait_ready(proc, http_port)
        time.sleep(1.0)  # let start-up garbage settle before reading the idle footprint
        rss_idle = _rss_mib(proc.pid)
        credentials = grpc.ssl_channel_credentials(ca.cert_pem, client.key_pem, client.cert_pem)
        figures = _measure(f"localhost:{grpc_port}", credentials, calls)
        rss_after = _rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if mount is not None:
            mount.stop()
    base = figures[0]
    return {
        "engine": engine,
        "calls": calls,
        "rss_idle_mib": round(rss_idle, 1),
        "rss_after_load_mib": round(rss_after, 1),
        "round_trips": [
            dataclasses.asdict(f)
            | {"p50_ms": round(f.p50_ms, 3), "p99_ms": round(f.p99_ms, 3), "mean_ms": round(f.mean_ms, 3)}
            | {"p99_vs_health": round(f.p99_ms / base.p99_ms, 2)}
            for f in figures
        ],
    }


def _report(result: dict[str, Any]) -> bool:
    print(f"engine: {result['engine']}   calls per figure: {result['calls']}   cpus: {os.cpu_count()}")
    print(f"{'round trip':<12} {'calls':>6} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'p99/health':>10}")
    for f in result["round_trips"]:
        print(
            f"{f['name']:<12} {f['calls']:>6} {f['p50_ms']:>8.3f} {f['p99_ms']:>8.3f} {f['mean_ms']:>8.3f} "
            f"{f['p99_vs_health']:>10.2f}"
        )
    print(
        f"agent RSS: idle {result['rss_idle_mib']:.1f} MiB, after load {result['rss_after_load_mib']:.1f} MiB"
    )
    apply_p99 = float(max(f["p99_ms"] for f in result["round_trips"] if f["name"].startswith("apply")))
    ok_latency = apply_p99 <= TARGET_P99_MS
    ok_rss = float(result["rss_idle_mib"]) <= TARGET_RSS_MIB
    verdict = "met" if ok_latency else "MISSED"
    print(f"target ApplyWorkload p99 <= {TARGET_P99_MS:g} ms: {verdict} ({apply_p99:.3f} ms)")
    print(f"target RSS idle <= {TARGET_RSS_MIB:g} MiB: {'met' if ok_rss else 'MISSED'}")
    return ok_latency and ok_rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=2000, help="round trips per figure (default 2000)")
    parser.add_argument("--engine", choices=["auto", "fake", "real"], default="auto")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--serve-fake", metavar="SETTINGS_JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake:
        _serve_fake(args.serve_fake)
        return 0
    result = run(args.calls, _engine_mode(args.engine))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    return 0 if _report(result) else 1


if __name__ == "__main__":
    sys.exit(main())
