"""mTLS for the agent's gRPC server: credentials from PEM files, and who the client is.

The handshake (grpc core) already refuses a client without a certificate or with one its CA bundle does not
verify. What is left to the agent is which verified clients may call: a client's identities are its
certificate's subject alternative names (DNS, URI such as a SPIFFE ID, ...), or its subject CN when it has
no SAN -- what grpc reports as the peer identities, and the rule of RFC 6125 (the CN is a fallback only).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc

from rmd_agent.errors import ConfigError
from rmd_agent.settings import ANY_CLIENT

log = logging.getLogger(__name__)


def _read_pem(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{what} {path} holds no PEM block")
    return data


def _configuration(cert: Path, key: Path, client_ca: Path) -> Any:
    cert_pem = _read_pem(cert, "TLS certificate")
    key_pem = _read_pem(key, "TLS key")
    ca_pem = _read_pem(client_ca, "client CA bundle")
    return grpc.ssl_server_certificate_configuration([(key_pem, cert_pem)], root_certificates=ca_pem)


def _stamps(paths: Iterable[Path]) -> tuple[tuple[int, int, int], ...]:
    stamps = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            stamps.append((0, 0, 0))
            continue
        stamps.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(stamps)


def server_credentials(cert: Path, key: Path, client_ca: Path) -> grpc.ServerCredentials:
    """Server credentials that require and verify a client certificate, and read the three files again when
    they change (a renewed certificate, a rotated CA bundle: no restart needed). ConfigError for unreadable
    files at the start; a later unreadable or half-written set is logged and the previous one kept."""
    paths = (cert, key, client_ca)
    loaded = _stamps(paths)
    initial = _configuration(cert, key, client_ca)

    def fetch() -> Any:  # grpc calls this on each new handshake: a stat of three files
        nonlocal loaded
        stamps = _stamps(paths)
        if stamps == loaded:
            return None
        try:
            configuration = _configuration(cert, key, client_ca)
        except ConfigError as exc:
            log.warning("TLS files changed but cannot be read; keeping the previous ones: %s", exc)
            return None
        loaded = stamps
        log.info("TLS files changed: serving with the new certificate")
        return configuration

    return grpc.dynamic_ssl_server_credentials(initial, fetch, require_client_authentication=True)


def decode_identities(raw: Iterable[bytes] | None) -> tuple[str, ...]:
    return tuple(i.decode("utf-8", "replace") for i in raw or ())


def is_allowed(identities: Iterable[str], allowed: frozenset[str]) -> bool:
    """Whether any identity is on the allow list (exact match), or the list holds the wildcard."""
    ids = tuple(identities)
    return bool(ids) and (ANY_CLIENT in allowed or any(i in allowed for i in ids))
