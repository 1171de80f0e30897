"""`rmdctl validate` reads an agent's serving certificate at its endpoint without a client certificate: over a
real socket, from a gRPC server with the agent's own TLS (mutual TLS required), the TLS 1.3 client
side of the handshake completes before the server refuses the missing client certificate. In TLS 1.2 the
server would refuse before the client's side completes, so rmdctl asks for 1.3 only: from a server that
speaks only 1.2 nothing is read, and the reason is kept."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from agent_tls_server import agent_tls_server
from rmd_operator.validate.certs import read_certificate
from rmd_operator.validate.tls_peer import peer_certificate, peer_certificates
from rmd_sim.pki import CertificateAuthority


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority("rmd-test-ca")
    pair = ca.issue_server(
        "rmd-agent.worker-1", dns_names=["worker-1.rmd-agent.ns.svc"], ip_addresses=["127.0.0.1"]
    )
    files = {"ca.crt": ca.cert_pem, "tls.crt": pair.cert_pem, "tls.key": pair.key_pem}
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return {name: directory / name for name in files}


@pytest.fixture
def agent_endpoint(pki: dict[str, Path]) -> Iterator[str]:
    with agent_tls_server(pki["tls.crt"], pki["tls.key"], pki["ca.crt"]) as port:
        yield f"127.0.0.1:{port}"


def test_the_certificate_of_an_agent_requiring_client_certificates_is_read(
    agent_endpoint: str, pki: dict[str, Path]
) -> None:
    read = peer_certificate(agent_endpoint, timeout=5)
    assert read.problem == "" and read.source == agent_endpoint and read.der is not None
    served = x509.load_pem_x509_certificate(pki["tls.crt"].read_bytes()).public_bytes(Encoding.DER)
    assert read.der == served
    _, facts = read_certificate(read.der)
    assert facts.dns_names == ("worker-1.rmd-agent.ns.svc",) and facts.issuer == "rmd-test-ca"


def test_many_agents_are_read_at_once_and_an_unreachable_one_says_why(agent_endpoint: str) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening: refused
    read = peer_certificates({"worker-1": agent_endpoint, "worker-2": nobody}, timeout=5)
    assert read["worker-1"].der is not None
    assert read["worker-2"].der is None
    assert read["worker-2"].problem.startswith(f"cannot read it from {nobody}: ")


def test_a_tls_1_2_only_server_asking_for_client_certificates_gives_nothing(pki: dict[str, Path]) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(pki["tls.crt"], pki["tls.key"])
    context.load_verify_locations(pki["ca.crt"])
    context.verify_mode = ssl.CERT_REQUIRED
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with (
            conn,
            context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False) as tls,
            contextlib.suppress(ssl.SSLError, OSError),  # the client gives up: no common version
        ):
            tls.do_handshake()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        read = peer_certificate(f"127.0.0.1:{listener.getsockname()[1]}", timeout=5)
    finally:
        thread.join(10)
        listener.close()
    assert read.der is None and "cannot read it from" in read.problem
