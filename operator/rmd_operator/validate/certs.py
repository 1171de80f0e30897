"""What an agent's serving certificate says, judged the way the operator will judge it: its dates, the name
the operator expects of the node's agent, and the CA it trusts. Pure: the certificate comes as DER bytes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID

# Warn when less than this much of a certificate's life is left, or MAX_WARNING_WINDOW, whichever is less. An
# agent renews its CSR certificate at two thirds of its life, so a third is left at worst while it works.
WARNING_FRACTION = 0.25
MAX_WARNING_WINDOW = timedelta(days=30)


@dataclass(frozen=True)
class CertificateFacts:
    subject: str
    issuer: str
    not_before: datetime
    not_after: datetime
    dns_names: tuple[str, ...]

    @property
    def lifetime(self) -> timedelta:
        return self.not_after - self.not_before

    def warning_window(self) -> timedelta:
        return min(MAX_WARNING_WINDOW, self.lifetime * WARNING_FRACTION)


class CertificateUnreadable(ValueError):
    """Bytes that are not an X.509 certificate."""


def _common_name(name: x509.Name) -> str:
    values = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(values[0].value) if values else name.rfc4514_string()


def read_certificate(der: bytes) -> tuple[x509.Certificate, CertificateFacts]:
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise CertificateUnreadable(f"not an X.509 certificate: {exc}") from None
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(sans.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns = ()
    facts = CertificateFacts(
        subject=_common_name(cert.subject),
        issuer=_common_name(cert.issuer),
        not_before=cert.not_valid_before_utc.astimezone(UTC),
        not_after=cert.not_valid_after_utc.astimezone(UTC),
        dns_names=dns,
    )
    return cert, facts


def name_matches(pattern: str, name: str) -> bool:
    """Whether a certificate DNS name (possibly `*.domain`, one label) covers `name`, as TLS checks it."""
    pattern, name = pattern.lower().rstrip("."), name.lower().rstrip(".")
    if pattern.startswith("*."):
        head, _, rest = name.partition(".")
        return bool(head) and rest == pattern[2:]
    return pattern == name


def expected_name(server_name_pattern: str | None, node: str) -> str | None:
    """The name the operator expects from `node`'s agent ({node} in its agent_server_name)."""
    if not server_name_pattern:
        return None
    return server_name_pattern.replace("{node}", node)


def issued_by(cert: x509.Certificate, ca_bundle_pem: bytes) -> bool | None:
    """Whether a CA of the bundle signed `cert`; None when the bundle holds no certificate."""
    try:
        cas = x509.load_pem_x509_certificates(ca_bundle_pem)
    except ValueError:
        return None
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False
