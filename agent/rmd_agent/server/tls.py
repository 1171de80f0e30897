"""mTLS for the agent's gRPC server: credentials from PEM files, and who the client is.

The handshake (grpc core) already refuses a client without a certificate or with one its CA bundle does not
verify. What is left to the agent is which verified clients may call: a client's identities are its
certificate's subject alternative names (DNS, URI such as a SPIFFE ID, ...), or its subject CN when it has
no SAN -- what grpc reports as the peer identities, and the rule of RFC 6125 (the CN is a fallback only).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import grpc

from rmd_agent.errors import ConfigError
from rmd_agent.settings import ANY_CLIENT


def _read_pem(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{what} {path} holds no PEM block")
    return data


def server_credentials(cert: Path, key: Path, client_ca: Path) -> grpc.ServerCredentials:
    """Server credentials that require and verify a client certificate. ConfigError for unreadable files."""
    cert_pem = _read_pem(cert, "TLS certificate")
    key_pem = _read_pem(key, "TLS key")
    ca_pem = _read_pem(client_ca, "client CA bundle")
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=True
    )


def decode_identities(raw: Iterable[bytes] | None) -> tuple[str, ...]:
    return tuple(i.decode("utf-8", "replace") for i in raw or ())


def is_allowed(identities: Iterable[str], allowed: frozenset[str]) -> bool:
    """Whether any identity is on the allow list (exact match), or the list holds the wildcard."""
    ids = tuple(identities)
    return bool(ids) and (ANY_CLIENT in allowed or any(i in allowed for i in ids))
