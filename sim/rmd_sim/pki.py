"""Throw-away PKI for the test control plane: one CA, serving and client certificates, the SA signing key.

Everything is generated in memory with `cryptography` and returned as PEM bytes; writing files is the
caller's business. ECDSA P-256 keeps certificate generation fast; the service-account key is RSA because
that is what every Kubernetes release accepts for both `--service-account-key-file` and
`--service-account-signing-key-file`.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Backdated so that a clock a few minutes behind (or a VM resumed from suspend) still accepts the certs.
_NOT_BEFORE_SLACK = datetime.timedelta(hours=1)
_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM-encoded."""

    cert_pem: bytes
    key_pem: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str, organizations: Iterable[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, common_name: str) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _NOT_BEFORE_SLACK)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        """The CA's private key, for a signer under test (the operator's agent certificate signer)."""
        return _key_pem(self._key)

    def issue_server(
        self,
        common_name: str,
        *,
        dns_names: Iterable[str],
        ip_addresses: Iterable[str],
        validity: datetime.timedelta | None = None,
    ) -> KeyPair:
        """A serving certificate valid for the given names (Go's TLS checks SANs only, never the CN), for a
        year or until `validity` from now (a short one makes a certificate about to expire)."""
        sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        return self._issue(_name(common_name), ExtendedKeyUsageOID.SERVER_AUTH, sans, validity or _VALIDITY)

    def issue_client(
        self,
        user: str,
        groups: Iterable[str] = (),
        *,
        dns_names: Iterable[str] = (),
        uris: Iterable[str] = (),
    ) -> KeyPair:
        """A client certificate; kube-apiserver maps CN to the user name and each O to a group. SAN DNS names
        and URIs (e.g. SPIFFE IDs) are what the node agent matches against its allowed client identities."""
        sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
        sans += [x509.UniformResourceIdentifier(uri) for uri in uris]
        return self._issue(_name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH, sans)

    def _issue(
        self,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName],
        validity: datetime.timedelta = _VALIDITY,
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _NOT_BEFORE_SLACK)
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def service_account_key_pem() -> bytes:
    """An RSA private key in PEM; kube-apiserver derives the public half for token verification itself."""
    return _key_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
