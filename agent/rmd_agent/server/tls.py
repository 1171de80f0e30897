"""mTLS for the agent's gRPC server: credentials from PEM files, and who the client is.

The handshake (grpc core) already refuses a client without a certificate or with one its CA bundle does not
verify. What is left to the agent is which verified clients may call: a client's identities are the DNS
names in its certificate's subject alternative names, and nothing else (docs/security.md). Not grpc's peer
identities: those are every SAN, or the CN when there is none, so a URI SAN or a bare CN `rmd-operator`
would pass for the operator.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
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


NO_DNS_NAME = "no DNS name in the client certificate's subject alternative names"
_NEVER_IN_DNS_NAMES = frozenset(":/@ \t")  # in URIs, e-mail addresses, IPv6 addresses


def check_allowed_clients(allowed: Iterable[str]) -> None:
    """ConfigError for an allow list no client could ever match: empty, or with an entry that is no DNS
    name (a SPIFFE ID, say) -- refused at start rather than at every call."""
    entries = tuple(allowed)
    if not entries:
        raise ConfigError(
            "allowed_clients is empty, so no client could call: name the DNS name in the operator's "
            f"certificate, or '{ANY_CLIENT}' to accept any certificate with a DNS SAN the client CA signed"
        )
    for entry in entries:
        if not _NEVER_IN_DNS_NAMES.isdisjoint(entry):
            raise ConfigError(
                f"allowed_clients: {entry!r} is not a DNS name; clients are identified only by the DNS "
                "names in their certificate's subject alternative names (never a URI, e-mail or IP SAN, "
                "nor the subject CN)"
            )


def client_dns_names(auth_context: Mapping[str, Iterable[bytes]]) -> tuple[str, ...]:
    """The DNS names among the subject alternative names of a call's verified client certificate (none
    without TLS). gRPC's TLS layer lists them apart from URI, e-mail and IP SANs and the subject CN
    (`peer_dns`), so the certificate needs no parsing here, nor the `cryptography` package (9 MiB)."""
    return tuple(name.decode() for name in auth_context.get("peer_dns", ()))


def is_allowed(names: Iterable[str], allowed: frozenset[str]) -> bool:
    """Whether any of a client's DNS names is on the allow list (exact match), or the list holds the
    wildcard. A client without a DNS name never is, wildcard or not."""
    found = tuple(names)
    return bool(found) and (ANY_CLIENT in allowed or not allowed.isdisjoint(found))
