"""rmd_agent.kube_api over real sockets: a TLS server standing in for the API server (it records what it
receives) and a CONNECT proxy. What the agent sends (token, client certificate, impersonation, JSON), what
it trusts (the cluster's CA only), which proxy it uses (the kubeconfig's, never the environment's), its
timeout, its errors, the in-cluster service account with its token read again, and an IPv6 API server. The
real API server is in tests/e2e (test_node_state.py, test_nrt.py, test_agent_certificates.py)."""

from __future__ import annotations

import base64
import json
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from rmd_agent.errors import KubeApiError, KubeConnectionError
from rmd_agent.kube_api import MERGE_PATCH, KubeApi
from rmd_agent.kube_config import ClusterConfig, load_in_cluster, load_kubeconfig
from rmd_sim.pki import CertificateAuthority, KeyPair

Obj = dict[str, Any]
CA = CertificateAuthority("test-cluster-ca")
SERVING = CA.issue_server("kube-apiserver", dns_names=["localhost"], ip_addresses=["127.0.0.1", "::1"])
AGENT = CA.issue_client("system:node-agent")


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


class ApiServer(ThreadingHTTPServer):
    """Answers every request with `answer` (status, JSON body) after `hold` is set, and records it:
    (method, path with query, headers, body, the client certificate's CN or None)."""

    daemon_threads = True

    def __init__(self, workdir: Path, host: str = "127.0.0.1", serving: KeyPair = SERVING) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, 0), _Handler)
        (workdir / "server.crt").write_bytes(serving.cert_pem)
        (workdir / "server.key").write_bytes(serving.key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(workdir / "server.crt", workdir / "server.key")
        context.load_verify_locations(cadata=CA.cert_pem.decode())
        context.verify_mode = ssl.CERT_OPTIONAL  # records who presented a certificate
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.received: list[tuple[str, str, Any, bytes, str | None]] = []
        self.answer: tuple[int, Obj] = (200, {"kind": "Thing"})
        self.hold = threading.Event()
        self.hold.set()
        host_in_url = f"[{host}]" if ":" in host else host
        self.url = f"https://{host_in_url}:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.hold.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: ApiServer
    protocol_version = "HTTP/1.1"

    def _any(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        peer = self.connection.getpeercert()  # type: ignore[attr-defined]  # an SSLSocket
        cn = dict(item[0] for item in peer["subject"])["commonName"] if peer else None
        self.server.received.append((self.command, self.path, self.headers, body, cn))
        self.server.hold.wait()
        status, answer = self.server.answer
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = _any

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  # the base class's name
        pass


class ConnectProxy(socketserver.ThreadingTCPServer):
    """An HTTP proxy for CONNECT only; records each target."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Tunnel)
        self.targets: list[str] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Tunnel(socketserver.StreamRequestHandler):
    server: ConnectProxy

    def handle(self) -> None:
        method, target, _ = self.rfile.readline().decode().split(" ", 2)
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        self.server.targets.append(f"{method} {target}")
        host, _, port = target.rpartition(":")
        with socket.create_connection((host.strip("[]"), int(port))) as upstream:
            self.connection.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            back = threading.Thread(target=_pipe, args=(upstream, self.connection), daemon=True)
            back.start()
            _pipe(self.connection, upstream)
            back.join(5)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ApiServer]:
    api = ApiServer(tmp_path)
    yield api
    api.stop()


@pytest.fixture
def proxy() -> Iterator[ConnectProxy]:
    tunnel = ConnectProxy()
    yield tunnel
    tunnel.stop()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(
    path: Path, server: str, *, ca: bytes = CA.cert_pem, client: KeyPair | None = AGENT, **extra: Any
) -> ClusterConfig:
    cluster = {"server": server, "certificate-authority-data": b64(ca), **extra.pop("cluster", {})}
    user: Obj = {"token": "t0ken", **extra.pop("user", {})}
    if client is not None:
        user |= {"client-certificate-data": b64(client.cert_pem), "client-key-data": b64(client.key_pem)}
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return load_kubeconfig(path)


def test_a_request_carries_token_certificate_impersonation_and_json(
    server: ApiServer, tmp_path: Path
) -> None:
    extra = {"authentication.kubernetes.io/node-name": ["node-a"]}
    config = kubeconfig(
        tmp_path / "kc", server.url, user={"as": "system:serviceaccount:ns:sa", "as-user-extra": extra}
    )
    server.answer = (201, {"metadata": {"name": "x", "uid": "u1"}})
    with KubeApi(config) as api:
        answer = api.request(
            "PATCH",
            "/apis/example.com/v1/namespaces/ns/widgets/x",
            query={"fieldManager": "rmd-agent", "fieldValidation": "Strict"},
            body={"spec": {"a": None}},
            content_type=MERGE_PATCH,
        )
    assert answer == {"metadata": {"name": "x", "uid": "u1"}}
    ((method, path, headers, body, cn),) = server.received
    assert (method, path) == (
        "PATCH",
        "/apis/example.com/v1/namespaces/ns/widgets/x?fieldManager=rmd-agent&fieldValidation=Strict",
    )
    assert json.loads(body) == {"spec": {"a": None}}
    assert headers["Content-Type"] == MERGE_PATCH and headers["Accept"] == "application/json"
    assert headers["Authorization"] == "Bearer t0ken"
    assert headers["Impersonate-User"] == "system:serviceaccount:ns:sa"
    assert headers["Impersonate-Extra-authentication.kubernetes.io%2Fnode-name"] == "node-a"
    assert cn == "system:node-agent"


async def test_call_runs_the_request_off_the_event_loop(server: ApiServer, tmp_path: Path) -> None:
    with KubeApi(kubeconfig(tmp_path / "kc", server.url)) as api:
        assert await api.call("GET", "/api/v1/nodes/n1") == {"kind": "Thing"}
    assert [r[:2] for r in server.received] == [("GET", "/api/v1/nodes/n1")]


def test_an_error_answer_is_a_kube_api_error(server: ApiServer, tmp_path: Path) -> None:
    status = {"kind": "Status", "status": "Failure", "message": 'widgets "x" already exists', "code": 409}
    server.answer = (409, status)
    with KubeApi(kubeconfig(tmp_path / "kc", server.url)) as api, pytest.raises(KubeApiError) as refused:
        api.request("POST", "/apis/example.com/v1/widgets", body={})
    assert (refused.value.status, refused.value.reason) == (409, "Conflict")
    assert json.loads(refused.value.body or "") == status
    assert str(refused.value) == '409 Conflict: widgets "x" already exists'


def test_a_server_the_cluster_ca_did_not_sign_is_refused(server: ApiServer, tmp_path: Path) -> None:
    other = CertificateAuthority("another-ca")
    config = kubeconfig(tmp_path / "kc", server.url, ca=other.cert_pem)
    with KubeApi(config) as api, pytest.raises(KubeConnectionError) as refused:
        api.request("GET", "/api/v1/nodes/n1")
    assert refused.value.status == 0
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    assert server.received == []  # the token was never sent


def test_the_tls_server_name_of_the_kubeconfig_is_the_name_checked(tmp_path: Path) -> None:
    """The simulated nodes reach the API server through a relay whose address its certificate does not name
    (rmd_sim/netns.py)."""
    named = ApiServer(tmp_path, serving=CA.issue_server("api", dns_names=["api.test"], ip_addresses=[]))
    try:
        with (
            KubeApi(kubeconfig(tmp_path / "kc", named.url)) as api,
            pytest.raises(KubeConnectionError) as refused,
        ):
            api.request("GET", "/version")
        assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value) and "127.0.0.1" in str(refused.value)
        config = kubeconfig(tmp_path / "kc", named.url, cluster={"tls-server-name": "api.test"})
        with KubeApi(config) as api:
            assert api.request("GET", "/version") == {"kind": "Thing"}
        assert [r[:2] for r in named.received] == [("GET", "/version")]
    finally:
        named.stop()


def test_a_proxy_in_the_environment_is_not_used(
    server: ApiServer, proxy: ConnectProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy.url)
    with KubeApi(kubeconfig(tmp_path / "kc", server.url)) as api:
        api.request("GET", "/api/v1/nodes/n1")
    assert len(server.received) == 1
    assert proxy.targets == []


def test_the_proxy_named_in_the_kubeconfig_is_used(
    server: ApiServer, proxy: ConnectProxy, tmp_path: Path
) -> None:
    config = kubeconfig(tmp_path / "kc", server.url, cluster={"proxy-url": proxy.url})
    with KubeApi(config) as api:
        api.request("GET", "/api/v1/nodes/n1")
    assert proxy.targets == [f"CONNECT 127.0.0.1:{server.server_address[1]}"]
    assert server.received[0][3:] == (b"", "system:node-agent")  # still TLS to the API server, end to end


def test_a_request_without_an_answer_times_out(server: ApiServer, tmp_path: Path) -> None:
    server.hold.clear()
    with KubeApi(kubeconfig(tmp_path / "kc", server.url), timeout=0.3) as api:
        started = time.monotonic()
        with pytest.raises(KubeConnectionError, match=r"no answer: .*[Tt]imed? ?out"):
            api.request("POST", "/apis/example.com/v1/widgets", body={})  # not retried: not idempotent
        assert time.monotonic() - started < 2.0
    assert len(server.received) == 1


def test_nothing_listening_is_a_connection_error(tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with (
        KubeApi(kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{port}")) as api,
        pytest.raises(KubeConnectionError, match=f"GET https://127.0.0.1:{port}/api/v1/nodes/n1: no answer"),
    ):
        api.request("GET", "/api/v1/nodes/n1")


def service_account(root: Path, token: str) -> Path:
    root.mkdir()
    (root / "token").write_text(token)
    (root / "ca.crt").write_bytes(CA.cert_pem)
    return root


def test_in_cluster_the_rotated_token_is_sent_within_a_minute(server: ApiServer, tmp_path: Path) -> None:
    account = service_account(tmp_path / "sa", "first")
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.server_address[1])}
    now = [0.0]
    with KubeApi(load_in_cluster(env, account), clock=lambda: now[0]) as api:
        api.request("GET", "/api/v1/nodes/n1")
        (account / "token").write_text("second")  # the kubelet rotates the projected token
        now[0] = 59.0
        api.request("GET", "/api/v1/nodes/n1")
        now[0] = 60.0
        api.request("GET", "/api/v1/nodes/n1")
    assert [r[2]["Authorization"] for r in server.received] == [
        "Bearer first",
        "Bearer first",
        "Bearer second",
    ]
    assert {r[4] for r in server.received} == {None}  # a service account presents no client certificate


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
def test_in_cluster_with_an_ipv6_api_server(tmp_path: Path) -> None:
    server = ApiServer(tmp_path, host="::1")
    try:
        account = service_account(tmp_path / "sa", "t")
        env = {"KUBERNETES_SERVICE_HOST": "::1", "KUBERNETES_SERVICE_PORT": str(server.server_address[1])}
        with KubeApi(load_in_cluster(env, account)) as api:
            assert api.request("GET", "/version") == {"kind": "Thing"}
        assert [r[:2] for r in server.received] == [("GET", "/version")]
    finally:
        server.stop()
