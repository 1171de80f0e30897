"""mTLS for the agent's gRPC server: the TLS context from PEM files, and who the client is.

The handshake already refuses a client without a certificate or with one its CA bundle does not verify.
What is left to the agent is which verified clients may call: a client's identities are the DNS names in its
certificate's subject alternative names, and nothing else (docs/security.md): not every SAN, nor the CN when
there is none, so a URI SAN or a bare CN `rmd-operator` does not pass for the operator.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

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


def _context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    for path, what in ((cert, "TLS certificate"), (key, "TLS key"), (client_ca, "client CA bundle")):
        _read_pem(path, what)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2  # as gRPC requires
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])  # gRPC clients insist on it
    try:
        context.load_cert_chain(cert, key)
        context.load_verify_locations(client_ca)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"TLS files {cert}, {key}, {client_ca}: {exc}") from None
    return context


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


def server_ssl_context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    """A server TLS context that requires and verifies a client certificate, and reads the three files
    again when they change (a renewed certificate, a rotated CA bundle: no restart needed). ConfigError for
    unreadable files at the start; a later unreadable or half-written set is logged and the previous one kept.
    """
    paths = (cert, key, client_ca)
    loaded = _stamps(paths)
    current = first = _context(cert, key, client_ca)

    # Called at every handshake, SNI or not: a stat of three files, and the handshake moved to a context
    # built from the new files when they changed.
    def on_hello(connection: Any, _server_name: str | None, _context_in_use: ssl.SSLContext) -> None:
        nonlocal loaded, current
        stamps = _stamps(paths)
        if stamps != loaded:
            try:
                current = _context(cert, key, client_ca)
                log.info("TLS files changed: serving with the new certificate")
            except ConfigError as exc:
                log.warning("TLS files changed but cannot be read; keeping the previous ones: %s", exc)
            loaded = stamps
        if current is not first:
            connection.context = current

    first.sni_callback = on_hello
    return first


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


def client_dns_names(peer_cert: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The DNS names among the subject alternative names of a call's verified client certificate (none
    without TLS), from `ssl.SSLSocket.getpeercert()`, which lists them apart from URI, e-mail and IP SANs and
    the subject CN, so the certificate needs no parsing here, nor the `cryptography` package (9 MiB)."""
    if not peer_cert:
        return ()
    return tuple(value for kind, value in peer_cert.get("subjectAltName", ()) if kind == "DNS")


def is_allowed(names: Iterable[str], allowed: frozenset[str]) -> bool:
    """Whether any of a client's DNS names is on the allow list (exact match), or the list holds the
    wildcard. A client without a DNS name never is, wildcard or not."""
    found = tuple(names)
    return bool(found) and (ANY_CLIENT in allowed or not allowed.isdisjoint(found))
