"""Read the certificate an agent presents at its gRPC endpoint, without a client certificate.

The agent asks for the operator's client certificate, but only after it has sent its own: in TLS 1.3 the
client's side of the handshake completes before the server checks the client's certificate (the refusal
arrives on the first read), so the peer certificate is in hand. Nothing is verified here; certs.py judges
the certificate as the operator would. An agent serving only TLS 1.2 refuses the handshake: then nothing is
read and the report says so."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from rmd_operator.validate.snapshot import PeerCertificate


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of "host:port" or "[v6]:port". ValueError when it is neither."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} is not host:port")
    return host.removeprefix("[").removesuffix("]"), int(port)


def peer_certificate(endpoint: str, timeout: float) -> PeerCertificate:
    try:
        host, port = split_endpoint(endpoint)
    except ValueError as exc:
        return PeerCertificate(None, endpoint, str(exc))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only read: the operator verifies, with its CA
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.set_alpn_protocols(["h2"])  # what gRPC speaks
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as sock,
            context.wrap_socket(sock, do_handshake_on_connect=False) as tls,
        ):
            tls.settimeout(timeout)
            tls.do_handshake()
            der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError) as exc:
        return PeerCertificate(None, endpoint, f"cannot read it from {endpoint}: {exc}")
    if not der:
        return PeerCertificate(None, endpoint, f"{endpoint} presented no certificate")
    return PeerCertificate(der, endpoint)


def peer_certificates(endpoints: Mapping[str, str], timeout: float) -> dict[str, PeerCertificate]:
    """Node -> the certificate at its endpoint, read concurrently."""
    if not endpoints:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(endpoints))) as pool:
        futures = {node: pool.submit(peer_certificate, ep, timeout) for node, ep in endpoints.items()}
        return {node: future.result() for node, future in futures.items()}
