"""The agent's gRPC API, gRPC health and HTTP endpoints: a real grpc.aio server and clients over loopback TCP,
with real certificates (rmd_sim.pki), in front of a fake engine."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rmd_agent.engine_api import (
    AppliedWorkload,
    CacheDomainSummary,
    ContainerCpus,
    CpuState,
    EngineUnavailable,
    NodeSummary,
)
from rmd_agent.errors import ConfigError, KubeletUnavailable
from rmd_agent.logsetup import JsonFormatter
from rmd_agent.plan.workload import RejectReason, Workload, WorkloadRejected
from rmd_agent.server.app import AGENT_SERVICE, AgentServer
from rmd_agent.settings import AgentSettings, load_settings, split_host_port
from rmd_api.agent.v1 import agent_pb2, agent_pb2_grpc
from rmd_sim.pki import CertificateAuthority, KeyPair

OPERATOR = "rmd-operator"
NO_DNS_SAN = "no DNS name in the client certificate's subject alternative names"
TIMEOUT = 10.0
_agent_stub: Any = agent_pb2_grpc.AgentStub  # generated without annotations


class FakeEngine:
    """An Engine keeping workloads in a dict. `fail` makes the next call of a method raise."""

    def __init__(self) -> None:
        self.workloads: dict[str, AppliedWorkload] = {}
        self.calls: list[str] = []
        self.fail: dict[str, Exception] = {}
        self.readiness = (True, "")
        self.started = False
        self.closed = False
        self.cpus: dict[tuple[str, str, str], ContainerCpus] = {}

    def _enter(self, method: str) -> None:
        self.calls.append(method)
        if method in self.fail:
            raise self.fail.pop(method)

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True

    async def apply(self, workload: Workload) -> tuple[AppliedWorkload, bool]:
        self._enter("apply")
        resolved = dataclasses.replace(workload, resolved=True)
        applied = AppliedWorkload(
            workload=resolved,
            id=f"id-{workload.name}",
            cos_name=f"rmd-{workload.name}",
            pool="guaranteed" if workload.cache_max else "shared",
            cache={0: (1 << (workload.cache_max or 0)) - 1} if workload.cache_max else {},
        )
        changed = self.workloads.get(workload.key) != applied
        self.workloads[workload.key] = applied
        return applied, changed

    async def remove(self, namespace: str, name: str, uid: str = "") -> bool:
        self._enter("remove")
        held = self.workloads.get(f"{namespace}/{name}")
        if held is None or (uid and held.workload.uid != uid):
            return False
        del self.workloads[f"{namespace}/{name}"]
        return True

    async def list(self) -> list[AppliedWorkload]:
        self._enter("list")
        return list(self.workloads.values())

    async def node(self) -> NodeSummary:
        self._enter("node")
        return NodeSummary(
            node_name="node-a",
            capabilities={"rdtL3Cat": (True, "11 ways"), "mba": (False, "no info/MB")},
            cpus=8,
            numa_nodes=1,
            caches=(CacheDomainSummary(0, frozenset(range(8)), 11, {"guaranteed": 9, "shared": 2}),),
            closids_total=16,
            closids_used=1 + len(self.workloads),
            workloads=len(self.workloads),
        )

    async def container_cpus(self, namespace: str, pod: str, uid: str, container: str) -> ContainerCpus:
        self._enter("container_cpus")
        return self.cpus.get((namespace, pod, container), ContainerCpus(CpuState.NOT_YET_ALLOCATED))

    async def ready(self) -> tuple[bool, str]:
        return self.readiness


# -- certificates --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pki:
    dir: Path
    ca: CertificateAuthority
    server: KeyPair
    operator: KeyPair  # DNS SAN on the allow list
    operator_uri: KeyPair  # URI SAN with the allowed name, no DNS SAN: no identity
    operator_cn: KeyPair  # no SAN, CN with the allowed name: no identity
    intruder: KeyPair  # the right CA, a DNS SAN not on the list
    intruder_cn: KeyPair  # DNS SAN not on the list, CN on it: the CN must not count
    intruder_uri: KeyPair  # DNS SAN not on the list, URI SAN on it: the URI must not count
    foreign: KeyPair  # another CA, a DNS SAN on the list

    def settings(self, **overrides: Any) -> AgentSettings:
        self.write("server", self.server)
        (self.dir / "ca.crt").write_bytes(self.ca.cert_pem)
        values: dict[str, Any] = {
            "node_name": "node-a",
            "grpc_listen": "127.0.0.1:0",
            "http_listen": "127.0.0.1:0",
            "tls_cert": self.dir / "server.crt",
            "tls_key": self.dir / "server.key",
            "tls_client_ca": self.dir / "ca.crt",
            "allowed_clients": (OPERATOR,),
            "shutdown_grace_seconds": 1.0,
        }
        return AgentSettings(**(values | overrides))

    def write(self, name: str, pair: KeyPair) -> tuple[Path, Path]:
        cert, key = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    ca = CertificateAuthority("rmd-agent-test-ca")
    other = CertificateAuthority("rmd-agent-test-ca")  # same name, different key: must still be refused
    return Pki(
        dir=tmp_path_factory.mktemp("pki"),
        ca=ca,
        server=ca.issue_server("rmd-agent", dns_names=["localhost"], ip_addresses=["127.0.0.1"]),
        operator=ca.issue_client("operator", dns_names=[OPERATOR]),
        operator_uri=ca.issue_client("operator", uris=[OPERATOR]),
        operator_cn=ca.issue_client(OPERATOR),
        intruder=ca.issue_client("intruder", dns_names=["intruder"]),
        intruder_cn=ca.issue_client(OPERATOR, dns_names=["intruder"]),
        intruder_uri=ca.issue_client("intruder", dns_names=["intruder"], uris=[OPERATOR]),
        foreign=other.issue_client("operator", dns_names=[OPERATOR]),
    )


# -- servers and clients -------------------------------------------------------------------------------------


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
async def server(pki: Pki, engine: FakeEngine) -> AsyncIterator[AgentServer]:
    agent = AgentServer(pki.settings(), engine)
    await agent.start()
    yield agent
    await agent.stop()


def _channel(pki: Pki, port: int, client: KeyPair | None) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        pki.ca.cert_pem,
        client.key_pem if client else None,
        client.cert_pem if client else None,
    )
    return grpc.aio.secure_channel(f"localhost:{port}", credentials)


@pytest.fixture
async def stub(pki: Pki, server: AgentServer) -> AsyncIterator[Any]:
    async with _channel(pki, server.grpc_port, pki.operator) as channel:
        yield _agent_stub(channel)


def _apply(name: str, cores: str = "1-2", ways: int = 2, uid: str = "u1") -> agent_pb2.ApplyWorkloadRequest:
    return agent_pb2.ApplyWorkloadRequest(
        ref=agent_pb2.WorkloadRef(namespace="ns", name=name, uid=uid),
        spec=agent_pb2.WorkloadSpec(core_ids=[cores], cache=agent_pb2.CacheRequest(max=ways, min=ways)),
    )


async def _http_get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), TIMEOUT)
    writer.close()
    await writer.wait_closed()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split(" ")[1]), body


# -- the five RPCs -------------------------------------------------------------------------------------------


async def test_apply_list_remove_round_trip(stub: Any, engine: FakeEngine) -> None:
    first = await stub.ApplyWorkload(_apply("db", "1-2", 3), timeout=TIMEOUT)
    assert first.changed
    w = first.workload
    assert (w.ref.namespace, w.ref.name, w.ref.uid) == ("ns", "db", "u1")
    assert list(w.cpus) == [1, 2] and w.pool == "guaranteed" and w.cos_name == "rmd-db"
    assert [(c.cache_id, c.mask, c.ways) for c in w.cache] == [(0, "7", 3)]
    assert engine.workloads["ns/db"].workload.core_ids == {1, 2}

    again = await stub.ApplyWorkload(_apply("db", "1-2", 3), timeout=TIMEOUT)
    assert not again.changed and again.workload == first.workload

    listed = await stub.ListWorkloads(agent_pb2.ListWorkloadsRequest(), timeout=TIMEOUT)
    assert [x.ref.name for x in listed.workloads] == ["db"]

    ref = agent_pb2.WorkloadRef(namespace="ns", name="db", uid="other-uid")
    removed = await stub.RemoveWorkload(agent_pb2.RemoveWorkloadRequest(ref=ref), timeout=TIMEOUT)
    assert not removed.found  # a re-created object of the same name is another workload
    ref.uid = "u1"
    removed = await stub.RemoveWorkload(agent_pb2.RemoveWorkloadRequest(ref=ref), timeout=TIMEOUT)
    assert removed.found and not engine.workloads


async def test_get_node(stub: Any) -> None:
    await stub.ApplyWorkload(_apply("db"), timeout=TIMEOUT)
    node = await stub.GetNode(agent_pb2.GetNodeRequest(), timeout=TIMEOUT)
    assert node.node_name == "node-a" and node.cpus == 8 and node.workloads == 1
    assert node.capabilities["mba"].detail == "no info/MB" and not node.capabilities["mba"].supported
    assert [(c.cache_id, c.cpus, dict(c.free_ways)) for c in node.caches] == [
        (0, "0-7", {"guaranteed": 9, "shared": 2})
    ]


async def test_get_container_cpus(stub: Any, engine: FakeEngine) -> None:
    request = agent_pb2.GetContainerCpusRequest(pod_namespace="ns", pod_name="p", pod_uid="u", container="c")
    pending = await stub.GetContainerCpus(request, timeout=TIMEOUT)
    assert pending.state == agent_pb2.GetContainerCpusResponse.NOT_YET_ALLOCATED and not pending.cpus
    engine.cpus[("ns", "p", "c")] = ContainerCpus(CpuState.ALLOCATED, frozenset({5, 4}))
    allocated = await stub.GetContainerCpus(request, timeout=TIMEOUT)
    assert allocated.state == agent_pb2.GetContainerCpusResponse.ALLOCATED and list(allocated.cpus) == [4, 5]


# -- errors --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        (RejectReason.INVALID, grpc.StatusCode.INVALID_ARGUMENT),
        (RejectReason.CAPACITY, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (RejectReason.CONFLICT, grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
async def test_rejections_answer_their_code_with_the_message(
    stub: Any, engine: FakeEngine, reason: RejectReason, code: grpc.StatusCode
) -> None:
    engine.fail["apply"] = WorkloadRejected(reason, f"no way ({reason})", "ns/db")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ApplyWorkload(_apply("db"), timeout=TIMEOUT)
    assert caught.value.code() == code
    assert caught.value.details() == f"no way ({reason})"


async def test_malformed_request_is_invalid_before_reaching_the_engine(stub: Any, engine: FakeEngine) -> None:
    request = _apply("db")
    request.spec.cache.min = 0  # max 2, min 0 selects no pool
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ApplyWorkload(request, timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "min=0" in (caught.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetContainerCpus(agent_pb2.GetContainerCpusRequest(pod_namespace="ns"), timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "pod_name" in (caught.value.details() or "")
    assert engine.calls == []


@pytest.mark.parametrize(
    ("method", "error"),
    [
        ("node", EngineUnavailable("resctrl is not mounted")),
        ("container_cpus", KubeletUnavailable("no kubelet")),
    ],
)
async def test_unavailable(stub: Any, engine: FakeEngine, method: str, error: Exception) -> None:
    engine.fail[method] = error
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if method == "node":
            await stub.GetNode(agent_pb2.GetNodeRequest(), timeout=TIMEOUT)
        else:
            request = agent_pb2.GetContainerCpusRequest(pod_namespace="ns", pod_name="p", container="c")
            await stub.GetContainerCpus(request, timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == str(error)


async def test_unexpected_error_is_internal_and_logged_with_traceback(
    stub: Any, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    engine.fail["list"] = KeyError("secret detail")
    with (
        caplog.at_level(logging.ERROR, logger="rmd_agent.server.grpc_service"),
        pytest.raises(grpc.aio.AioRpcError) as caught,
    ):
        await stub.ListWorkloads(agent_pb2.ListWorkloadsRequest(), timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "KeyError" in (caught.value.details() or "")
    assert "secret detail" not in (caught.value.details() or "")
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "ListWorkloads" in record.getMessage() and record.exc_info is not None


# -- who may call --------------------------------------------------------------------------------------------


async def _list_as(pki: Pki, port: int, client: KeyPair) -> Any:
    async with _channel(pki, port, client) as channel:
        return await _agent_stub(channel).ListWorkloads(agent_pb2.ListWorkloadsRequest(), timeout=TIMEOUT)


async def _refused(
    pki: Pki, port: int, client: KeyPair, code: grpc.StatusCode, caplog: pytest.LogCaptureFixture
) -> str:
    """The details of the refusal of `client`'s call, after checking its code and that it was logged."""
    with (
        caplog.at_level(logging.WARNING, logger="rmd_agent.server.grpc_service"),
        pytest.raises(grpc.aio.AioRpcError) as caught,
    ):
        await _list_as(pki, port, client)
    assert caught.value.code() == code
    assert any(r.getMessage().startswith("refused /rmd.agent.v1.Agent/ListWorkloads") for r in caplog.records)
    return caught.value.details() or ""


async def test_dns_san_on_the_list_is_allowed(pki: Pki, server: AgentServer, engine: FakeEngine) -> None:
    assert list((await _list_as(pki, server.grpc_port, pki.operator)).workloads) == []
    assert engine.calls == ["list"]


@pytest.mark.parametrize("client", [None, "foreign"])
async def test_client_without_a_certificate_of_the_client_ca_is_refused_at_the_handshake(
    pki: Pki, server: AgentServer, engine: FakeEngine, client: str | None
) -> None:
    async with _channel(pki, server.grpc_port, getattr(pki, client) if client else None) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _agent_stub(channel).ListWorkloads(agent_pb2.ListWorkloadsRequest(), timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert engine.calls == []


@pytest.mark.parametrize("client", ["operator_cn", "operator_uri"])
async def test_cn_or_uri_san_is_no_identity(
    pki: Pki, server: AgentServer, engine: FakeEngine, caplog: pytest.LogCaptureFixture, client: str
) -> None:
    """CN `rmd-operator` without a SAN, or URI SAN `rmd-operator`: no DNS name, so no identity."""
    details = await _refused(
        pki, server.grpc_port, getattr(pki, client), grpc.StatusCode.UNAUTHENTICATED, caplog
    )
    assert details == NO_DNS_SAN
    assert engine.calls == []


async def test_dns_san_not_on_the_list_is_denied(
    pki: Pki, server: AgentServer, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    details = await _refused(pki, server.grpc_port, pki.intruder, grpc.StatusCode.PERMISSION_DENIED, caplog)
    assert "intruder" in details
    assert engine.calls == []


@pytest.mark.parametrize("client", ["intruder_cn", "intruder_uri"])
async def test_cn_or_uri_san_on_the_list_does_not_count_beside_a_wrong_dns_san(
    pki: Pki, server: AgentServer, engine: FakeEngine, client: str, caplog: pytest.LogCaptureFixture
) -> None:
    details = await _refused(
        pki, server.grpc_port, getattr(pki, client), grpc.StatusCode.PERMISSION_DENIED, caplog
    )
    assert "intruder" in details
    assert OPERATOR not in details
    assert engine.calls == []


async def test_wildcard_allows_any_client_of_the_ca_with_a_dns_san(
    pki: Pki, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    agent = AgentServer(pki.settings(allowed_clients=("*",)), engine)
    await agent.start()
    try:
        await _list_as(pki, agent.grpc_port, pki.intruder)
        details = await _refused(
            pki, agent.grpc_port, pki.operator_cn, grpc.StatusCode.UNAUTHENTICATED, caplog
        )
    finally:
        await agent.stop()
    assert details == NO_DNS_SAN
    assert engine.calls == ["list"]


async def test_insecure_serves_plaintext_and_warns(
    pki: Pki, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="rmd_agent.server.app"):
        agent = AgentServer(pki.settings(insecure=True, tls_cert=Path("/nonexistent")), engine)
        await agent.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{agent.grpc_port}") as channel:
            reply = await _agent_stub(channel).ApplyWorkload(_apply("db"), timeout=TIMEOUT)
    finally:
        await agent.stop()
    assert reply.changed
    assert any(r.levelno == logging.WARNING and "PLAINTEXT" in r.getMessage() for r in caplog.records)


async def test_tls_server_refuses_a_plaintext_client(server: AgentServer, engine: FakeEngine) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _agent_stub(channel).ListWorkloads(agent_pb2.ListWorkloadsRequest(), timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert engine.calls == []


# Refused at the handshake (UNAVAILABLE), or by the identity check after it.
REFUSED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
FORGED = (
    "no certificate",
    "foreign",
    "operator_cn",
    "operator_uri",
    "intruder",
    "intruder_cn",
    "intruder_uri",
)


async def test_no_forged_identity_is_accepted_by_any_method(
    pki: Pki, server: AgentServer, engine: FakeEngine
) -> None:
    """Issue #13: every way of posing as the operator we know of, against every method of the API, plus
    plaintext. The note quotes the count this prints."""
    ref = agent_pb2.WorkloadRef(namespace="ns", name="x", uid="u1")
    requests = {
        "ApplyWorkload": _apply("x"),
        "RemoveWorkload": agent_pb2.RemoveWorkloadRequest(ref=ref),
        "ListWorkloads": agent_pb2.ListWorkloadsRequest(),
        "GetNode": agent_pb2.GetNodeRequest(),
        "GetContainerCpus": agent_pb2.GetContainerCpusRequest(),
    }
    channels: dict[str, Callable[[], grpc.aio.Channel]] = {
        name: functools.partial(_channel, pki, server.grpc_port, getattr(pki, name, None)) for name in FORGED
    }
    channels["plaintext"] = functools.partial(grpc.aio.insecure_channel, f"127.0.0.1:{server.grpc_port}")
    accepted, tried = [], 0
    for identity, open_channel in channels.items():
        async with open_channel() as channel:
            stub = _agent_stub(channel)
            for method, request in requests.items():
                tried += 1
                try:
                    await getattr(stub, method)(request, timeout=TIMEOUT)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in REFUSED:
                        accepted.append(f"{identity} {method}: {exc.code().name}")
                else:
                    accepted.append(f"{identity} {method}")
    print(f"forged identities accepted: {len(accepted)} of {len(channels)} ({tried} calls)")
    assert accepted == []
    assert engine.calls == []


# -- health and metrics --------------------------------------------------------------------------------------


async def test_grpc_health(pki: Pki, server: AgentServer, engine: FakeEngine) -> None:
    async with _channel(pki, server.grpc_port, pki.operator) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", AGENT_SERVICE):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=TIMEOUT)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        watch = health.Watch(health_pb2.HealthCheckRequest(service=AGENT_SERVICE), timeout=TIMEOUT)
        first = await anext(aiter(watch))
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
    _, metrics = await _http_get(server.http_port, "/metrics")
    labels = 'grpc_code="NOT_FOUND",grpc_method="Check",grpc_service="grpc.health.v1.Health"'
    assert f"rmd_agent_grpc_server_handled_total{{{labels}}} 1.0" in metrics


async def test_grpc_health_of_an_engine_not_ready(pki: Pki, engine: FakeEngine) -> None:
    engine.readiness = (False, "reconciling")
    agent = AgentServer(pki.settings(), engine)
    await agent.start()
    try:
        async with _channel(pki, agent.grpc_port, pki.operator) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            overall = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
            agent_status = await health.Check(
                health_pb2.HealthCheckRequest(service=AGENT_SERVICE), timeout=TIMEOUT
            )
    finally:
        await agent.stop()
    assert overall.status == health_pb2.HealthCheckResponse.SERVING
    assert agent_status.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_grpc_health_needs_an_allowed_identity(pki: Pki, server: AgentServer) -> None:
    async with _channel(pki, server.grpc_port, pki.intruder) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_http_healthz_and_readyz(server: AgentServer, engine: FakeEngine) -> None:
    assert await _http_get(server.http_port, "/healthz") == (200, "ok\n")
    assert await _http_get(server.http_port, "/readyz") == (200, "ok\n")
    engine.readiness = (False, "resctrl is not mounted")
    assert await _http_get(server.http_port, "/readyz?verbose") == (503, "resctrl is not mounted\n")
    assert (await _http_get(server.http_port, "/nothing"))[0] == 404
    assert (await _http_get(server.http_port, "/healthz", "POST"))[0] == 405
    assert await _http_get(server.http_port, "/healthz", "HEAD") == (200, "")


async def test_readyz_turns_unready_on_stop(pki: Pki, engine: FakeEngine) -> None:
    agent = AgentServer(pki.settings(), engine)
    await agent.start()
    assert (await agent.ready()) == (True, "")
    await agent.stop()
    assert (await agent.ready()) == (False, "shutting down")
    assert engine.started and engine.closed


async def test_metrics_count_calls_by_method_and_code(stub: Any, server: AgentServer, pki: Pki) -> None:
    await stub.ApplyWorkload(_apply("db"), timeout=TIMEOUT)
    await stub.ApplyWorkload(_apply("db"), timeout=TIMEOUT)
    async with _channel(pki, server.grpc_port, pki.intruder) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await _agent_stub(channel).GetNode(agent_pb2.GetNodeRequest(), timeout=TIMEOUT)
    status, body = await _http_get(server.http_port, "/metrics")
    assert status == 200
    labels = 'grpc_code="{}",grpc_method="{}",grpc_service="rmd.agent.v1.Agent"'
    assert f"rmd_agent_grpc_server_handled_total{{{labels.format('OK', 'ApplyWorkload')}}} 2.0" in body
    assert (
        f"rmd_agent_grpc_server_handled_total{{{labels.format('PERMISSION_DENIED', 'GetNode')}}} 1.0" in body
    )
    assert (
        f"rmd_agent_grpc_server_handling_seconds_count{{{labels.format('OK', 'ApplyWorkload')}}} 2.0" in body
    )


async def test_unknown_method_is_unimplemented_and_not_counted(pki: Pki, server: AgentServer) -> None:
    async with _channel(pki, server.grpc_port, pki.operator) as channel:
        call = channel.unary_unary("/rmd.agent.v1.Agent/Nope", lambda b: b, lambda b: b)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(b"", timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    _, body = await _http_get(server.http_port, "/metrics")
    assert "Nope" not in body


# -- configuration -------------------------------------------------------------------------------------------


def test_missing_certificate_fails_before_the_engine_starts(pki: Pki, tmp_path: Path) -> None:
    engine = FakeEngine()
    agent = AgentServer(pki.settings(tls_key=tmp_path / "absent.key"), engine)
    with pytest.raises(ConfigError, match=r"TLS key .*absent\.key: No such file"):
        asyncio.run(agent.start())
    assert not engine.started


def test_empty_allow_list_is_a_config_error(pki: Pki) -> None:
    agent = AgentServer(pki.settings(allowed_clients=()), FakeEngine())
    with pytest.raises(ConfigError, match="allowed_clients is empty"):
        asyncio.run(agent.start())


@pytest.mark.parametrize("entry", ["spiffe://cluster.local/ns/rmd/sa/rmd-operator", "ops@example.com"])
def test_allow_list_entry_that_is_no_dns_name_is_a_config_error(pki: Pki, entry: str) -> None:
    agent = AgentServer(pki.settings(allowed_clients=(OPERATOR, entry)), FakeEngine())
    with pytest.raises(ConfigError, match=re.escape(f"allowed_clients: {entry!r} is not a DNS name")):
        asyncio.run(agent.start())


def test_serve_settings_from_flags_environment_and_file(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("allowed_clients: [a, 'b.example']\ngrpc_listen: 127.0.0.1:1\ninsecure: false\n")
    settings = load_settings({"insecure": True}, {"RMD_HTTP_LISTEN": "[::1]:9"}, config)
    assert settings.allowed_clients == ("a", "b.example")
    assert (settings.grpc_listen, settings.http_listen, settings.insecure) == ("127.0.0.1:1", "[::1]:9", True)
    assert load_settings(environ={"RMD_ALLOWED_CLIENTS": "a, b,"}).allowed_clients == ("a", "b")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def serve_process(pki: Pki, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`serve()` in a child process, with this module's FakeEngine, plaintext HTTP on a free port."""
    settings = pki.settings(grpc_listen=f"127.0.0.1:{_free_port()}", http_listen=f"127.0.0.1:{_free_port()}")
    script = textwrap.dedent(
        f"""
        import asyncio, importlib.util, logging, sys
        from rmd_agent.server.app import serve
        from rmd_agent.settings import load_settings
        spec = importlib.util.spec_from_file_location("agent_grpc_test", {__file__!r})
        module = sys.modules["agent_grpc_test"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        logging.basicConfig(level=logging.INFO)
        settings = load_settings({settings.as_dict()!r})
        asyncio.run(serve(settings, lambda s, pods: module.FakeEngine()))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    yield proc, int(settings.http_listen.rsplit(":", 1)[1])
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        print(proc.stderr.read() if proc.stderr else "")  # shown when the test failed


async def test_serve_stops_gracefully_on_sigterm(serve_process: tuple[subprocess.Popen[str], int]) -> None:
    proc, http_port = serve_process
    for _ in range(200):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            if await _http_get(http_port, "/readyz") == (200, "ok\n"):
                break
        except OSError:
            pass
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the agent never became ready")
    os.kill(proc.pid, signal.SIGTERM)
    rc = await asyncio.to_thread(proc.wait, TIMEOUT)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert rc == 0, stderr
    assert "stopping" in stderr and "stopped" in stderr


def _rmd_agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rmd_agent", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_cli_prints_the_effective_serve_settings(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("state_path: /state.json\nallowed_clients: [from-file]\n")
    done = _rmd_agent(
        "serve", "--config", str(config), "--allowed-clients", "a,b", "--insecure", "--print-config"
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["allowed_clients"] == ["a", "b"] and printed["insecure"] is True
    assert printed["state_path"] == "/state.json" and printed["grpc_listen"] == "0.0.0.0:50051"


def test_cli_refuses_to_serve_without_its_certificate(tmp_path: Path) -> None:
    done = _rmd_agent("serve", "--tls-cert", str(tmp_path / "none.crt"), "--http-listen", "127.0.0.1:0")
    assert done.returncode == 2
    assert "none.crt: No such file" in done.stderr


def test_docs_describe_every_setting() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    for f in dataclasses.fields(AgentSettings):
        flag, variable = "--" + f.name.replace("_", "-"), "RMD_" + f.name.upper()
        assert f"| `{f.name}` | `{flag}` | `{variable}` |" in doc, f.name


@pytest.mark.parametrize(
    ("address", "expected"),
    [("0.0.0.0:8081", ("0.0.0.0", 8081)), ("[::1]:9", ("::1", 9)), (":8081", (None, 8081))],
)
def test_listen_addresses(address: str, expected: tuple[str | None, int]) -> None:
    assert split_host_port(address) == expected


@pytest.mark.parametrize("address", ["8081", "host:", "host:http", "h:70000"])
def test_bad_listen_address_is_a_config_error(address: str) -> None:
    with pytest.raises(ConfigError, match="must be host:port"):
        split_host_port(address)


def test_json_logs_are_one_object_per_record() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("rmd_agent.test_json_logs")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            logger.error("refused %s", "x", exc_info=True, extra={"peer": "ipv4:127.0.0.1:1"})
    finally:
        logger.removeHandler(handler)
    [line] = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "error" and record["message"] == "refused x"
    assert record["logger"] == "rmd_agent.test_json_logs" and record["peer"] == "ipv4:127.0.0.1:1"
    assert "ValueError: boom" in record["exception"]


async def test_a_taken_grpc_port_fails_before_the_engine_starts(pki: Pki, server: AgentServer) -> None:
    engine = FakeEngine()
    second = AgentServer(pki.settings(grpc_listen=f"127.0.0.1:{server.grpc_port}"), engine)
    with pytest.raises(ConfigError, match=r"cannot listen on 127\.0\.0\.1"):
        await second.start()
    assert not engine.started


async def test_an_engine_that_cannot_start_leaves_nothing_listening(pki: Pki) -> None:
    engine = FakeEngine()

    async def refuse() -> None:
        raise EngineUnavailable("resctrl is not mounted")

    engine.start = refuse  # type: ignore[method-assign]
    ports = _free_port(), _free_port()
    agent = AgentServer(
        pki.settings(grpc_listen=f"127.0.0.1:{ports[0]}", http_listen=f"127.0.0.1:{ports[1]}"), engine
    )
    with pytest.raises(EngineUnavailable):
        await agent.start()
    assert agent.http_port == ports[1]  # it was listening before the engine failed
    for port in ports:
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
    assert not engine.closed  # never started, so nothing to close


async def test_new_tls_files_are_served_without_a_restart(
    pki: Pki, engine: FakeEngine, tmp_path: Path
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pki.server.cert_pem)
    key.write_bytes(pki.server.key_pem)
    agent = AgentServer(pki.settings(tls_cert=cert, tls_key=key), engine)
    await agent.start()
    renewed_ca = CertificateAuthority("rmd-agent-renewed-ca")
    renewed = renewed_ca.issue_server("rmd-agent", dns_names=["localhost"], ip_addresses=["127.0.0.1"])

    async def list_trusting(ca_pem: bytes) -> None:
        op = pki.operator
        credentials = grpc.ssl_channel_credentials(ca_pem, op.key_pem, op.cert_pem)
        async with grpc.aio.secure_channel(f"localhost:{agent.grpc_port}", credentials) as channel:
            await _agent_stub(channel).ListWorkloads(agent_pb2.ListWorkloadsRequest(), timeout=TIMEOUT)

    try:
        await list_trusting(pki.ca.cert_pem)
        key.write_bytes(b"half written")  # a renewal caught half way: the old files stay in use
        await list_trusting(pki.ca.cert_pem)
        key.write_bytes(renewed.key_pem)
        cert.write_bytes(renewed.cert_pem)
        await list_trusting(renewed_ca.cert_pem)  # a new connection gets the new certificate
        with pytest.raises(grpc.aio.AioRpcError):
            await list_trusting(pki.ca.cert_pem)
    finally:
        await agent.stop()
