"""The agents' serving certificates: which CertificateSigningRequests for signer intel.com/rmd-agent-serving
the operator approves, and the certificate it signs for them (pure; handlers.py does the API calls).

A request is approved only if all of these hold (docs/security.md), so that a node can only ever obtain a
certificate for its own name:
* it was made by the agents' service account;
* the requester's token was bound to a pod on a node (the API server copies that node into the request's
  `extra`), and that node is the one the certificate would name;
* the request is signed by its key and names exactly `agent_server_name` of that node: one DNS name, nothing
  else (no IPs, URIs, e-mail addresses), and a subject CN that is empty or the same name;
* it asks for server usages only (no client auth).
Anything else is denied with the reason, which `kubectl get csr` shows.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rmd_api.agent_certs import (
    DEFAULT_EXPIRATION_SECONDS,
    MIN_EXPIRATION_SECONDS,
    NODE_NAME_EXTRA,
    SIGNER_NAME,
)

ALLOWED_USAGES = frozenset({"digital signature", "key encipherment", "server auth"})
_BACKDATE = datetime.timedelta(minutes=5)  # clocks of nodes and operator differ a little


@dataclass(frozen=True)
class Review:
    approve: bool
    reason: str  # condition reason: RmdAgentServing, or why it is denied
    message: str
    name: str = ""  # the DNS name to sign for (when approved)
    lifetime: datetime.timedelta = datetime.timedelta(0)


def true_conditions(csr: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The request's conditions that hold (Approved, Denied, Failed), by type."""
    found = (csr.get("status") or {}).get("conditions") or ()
    return {
        str(c.get("type")): c for c in found if isinstance(c, Mapping) and c.get("status", "True") == "True"
    }


def needs_action(csr: Mapping[str, Any]) -> bool:
    """Ours, and either undecided or approved but not yet signed."""
    if (csr.get("spec") or {}).get("signerName") != SIGNER_NAME:
        return False
    conditions = true_conditions(csr)
    if "Denied" in conditions or "Failed" in conditions:
        return False
    return "Approved" not in conditions or not (csr.get("status") or {}).get("certificate")


def _deny(reason: str, message: str) -> Review:
    return Review(False, reason, message)


def review(
    csr: Mapping[str, Any], *, agent_user: str, server_name: Callable[[str], str], max_seconds: int
) -> Review:
    spec = csr.get("spec") or {}
    user = spec.get("username")
    if user != agent_user:
        return _deny(
            "NotAnAgent", f"requested by {user!r}; only {agent_user!r} may ask for agent certificates"
        )
    nodes = (spec.get("extra") or {}).get(NODE_NAME_EXTRA) or []
    if len(nodes) != 1 or not nodes[0]:
        return _deny(
            "NoNode",
            "the requester's token names no node: the agent must use the token of its pod (a pod-bound "
            f"service-account token carries {NODE_NAME_EXTRA})",
        )
    node = str(nodes[0])
    name = server_name(node)
    try:
        request = x509.load_pem_x509_csr(base64.b64decode(spec.get("request") or ""))
    except ValueError as exc:
        return _deny("BadRequest", f"the request is not a PEM certificate request: {exc}")
    if not request.is_signature_valid:
        return _deny("BadRequest", "the request's signature does not verify with its key")
    problem = _names_problem(request, name)
    if problem:
        return _deny("WrongNames", f"node {node}: {problem}")
    usages = set(spec.get("usages") or ())
    if "server auth" not in usages or not usages <= ALLOWED_USAGES:
        return _deny(
            "WrongUsages",
            f"usages {sorted(usages)}: must include 'server auth' and only {sorted(ALLOWED_USAGES)}",
        )
    asked = spec.get("expirationSeconds") or DEFAULT_EXPIRATION_SECONDS
    seconds = max(MIN_EXPIRATION_SECONDS, min(int(asked), max_seconds))
    return Review(
        True,
        "RmdAgentServing",
        f"serving certificate for {name}, the agent of node {node}",
        name=name,
        lifetime=datetime.timedelta(seconds=seconds),
    )


def _names_problem(request: x509.CertificateSigningRequest, name: str) -> str | None:
    cns = [str(a.value) for a in request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if any(cn != name for cn in cns):
        return f"subject CN {cns} is not {name!r}"
    try:
        sans = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return f"the request names no DNS name; it must name exactly {name!r}"
    dns = sans.get_values_for_type(x509.DNSName)
    others = [g for g in sans if not isinstance(g, x509.DNSName)]
    if dns != [name] or others:
        named = [str(g.value) for g in sans]
        return f"the request names {named}; it must name exactly {name!r} and nothing else"
    return None


@dataclass(frozen=True)
class Signer:
    """The CA that signs agents' serving certificates (the RMD CA of the chart)."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

    @classmethod
    def from_pem(cls, cert_pem: bytes, key_pem: bytes) -> Signer:
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise ValueError("the signer key must be an EC or RSA private key")
        return cls(x509.load_pem_x509_certificate(cert_pem), key)

    def sign(self, csr: Mapping[str, Any], verdict: Review, now: datetime.datetime) -> bytes:
        """The PEM certificate for an approved request: its key, the one DNS name, server auth only."""
        request = x509.load_pem_x509_csr(base64.b64decode((csr.get("spec") or {})["request"]))
        public_key = request.public_key()
        usage_flags = {
            "digital_signature": True,
            "key_encipherment": isinstance(public_key, rsa.RSAPublicKey),
        }
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, verdict.name)]))
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(min(now + verdict.lifetime, self.cert.not_valid_after_utc))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(verdict.name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    content_commitment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                    **usage_flags,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(self._authority_key_identifier(), critical=False)
        )
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM)

    def _authority_key_identifier(self) -> x509.AuthorityKeyIdentifier:
        """The CA's own subject key identifier. Verifiers look the issuer up by it, and it need not be the
        SHA-1 of the key: helm's genCA (the chart's CA) makes another, and a computed one failed every
        handshake."""
        try:
            ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        except x509.ExtensionNotFound:
            return x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key())
        return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
