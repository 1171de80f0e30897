"""Agent serving certificates: the operator's review and signature (operator/rmd_operator/agent_certs.py) and
the agent's renewal decision (agent/rmd_agent/server/serving_cert.py), without an API server."""

from __future__ import annotations

import base64
import datetime
import ipaddress
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from rmd_agent.errors import ConfigError
from rmd_agent.server.app import check_serve_settings
from rmd_agent.server.serving_cert import new_request, renewal_reason
from rmd_agent.settings import AgentSettings
from rmd_api.agent_certs import NODE_NAME_EXTRA, SIGNER_NAME
from rmd_operator.agent_certs import Signer, needs_action, review
from rmd_sim.pki import CertificateAuthority

USER = "system:serviceaccount:rmd-system:rmd-agent"
NOW = datetime.datetime(2026, 11, 25, 12, tzinfo=datetime.UTC)


def csr(
    request_pem: bytes, *, node: str | None = "n1", user: str = USER, usages: Any = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "signerName": SIGNER_NAME,
        "username": user,
        "request": base64.b64encode(request_pem).decode(),
        "usages": usages or ["digital signature", "server auth"],
        "expirationSeconds": 86400,
    }
    if node is not None:
        spec["extra"] = {NODE_NAME_EXTRA: [node]}
    return {"metadata": {"name": "c1"}, "spec": spec}


def judge(obj: dict[str, Any]) -> Any:
    return review(obj, agent_user=USER, server_name=lambda n: f"rmd-agent.{n}", max_seconds=3600)


def request_with(names: list[x509.GeneralName], cn: str = "rmd-agent.n1") -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    )
    return (
        builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


def test_the_agents_own_name_is_approved_with_the_lifetime_capped() -> None:
    _, pem = new_request("rmd-agent.n1")
    verdict = judge(csr(pem))
    assert verdict.approve and verdict.name == "rmd-agent.n1"
    assert verdict.lifetime == datetime.timedelta(seconds=3600)  # asked a day, capped at max_seconds


def test_each_rule_denies_with_its_reason() -> None:
    _, own = new_request("rmd-agent.n1")
    assert judge(csr(own, user="system:serviceaccount:default:x")).reason == "NotAnAgent"
    assert judge(csr(own, node=None)).reason == "NoNode"
    assert judge(csr(own, node="n2")).reason == "WrongNames"  # n2's token, n1's name
    assert judge(csr(own, usages=["server auth", "client auth"])).reason == "WrongUsages"
    assert judge(csr(own, usages=["digital signature"])).reason == "WrongUsages"
    extra_ip = request_with([x509.DNSName("rmd-agent.n1"), x509.IPAddress(ipaddress.ip_address("10.0.0.1"))])
    assert judge(csr(extra_ip)).reason == "WrongNames"
    other_cn = request_with([x509.DNSName("rmd-agent.n1")], cn="admin")
    assert judge(csr(other_cn)).reason == "WrongNames"
    assert judge(csr(b"not a request")).reason == "BadRequest"


def test_only_our_undecided_or_unsigned_requests_need_action() -> None:
    _, pem = new_request("rmd-agent.n1")
    obj = csr(pem)
    assert needs_action(obj)
    obj["status"] = {"conditions": [{"type": "Approved", "status": "True"}]}
    assert needs_action(obj)  # approved, not yet signed
    obj["status"]["certificate"] = "x"
    assert not needs_action(obj)
    denied = csr(pem)
    denied["status"] = {"conditions": [{"type": "Denied", "status": "True"}]}
    assert not needs_action(denied)
    other = csr(pem)
    other["spec"]["signerName"] = "kubernetes.io/kube-apiserver-client"
    assert not needs_action(other)


def test_the_signed_certificate_serves_that_name_only_and_the_agent_keeps_it_until_renewal() -> None:
    ca = CertificateAuthority("test-ca")
    _, pem = new_request("rmd-agent.n1")
    obj = csr(pem)
    cert_pem = Signer.from_pem(ca.cert_pem, ca.key_pem).sign(obj, judge(obj), NOW)
    cert = x509.load_pem_x509_certificate(cert_pem)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert renewal_reason(cert_pem, "rmd-agent.n1", NOW) is None
    assert "not valid for" in (renewal_reason(cert_pem, "rmd-agent.n2", NOW) or "")
    two_thirds = NOW + datetime.timedelta(minutes=40)  # of 5 min backdating + 60 min
    assert "due for renewal" in (renewal_reason(cert_pem, "rmd-agent.n1", two_thirds) or "")
    assert renewal_reason(None, "rmd-agent.n1", NOW) == "no certificate yet"


def test_the_signature_names_the_ca_by_its_own_key_identifier() -> None:
    """helm's genCA (the chart's CA) gives its certificate a subject key identifier that is not the SHA-1 of
    its key; an authority key identifier computed from the key then matches no CA, and OpenSSL/BoringSSL fail
    the handshake with "unable to get local issuer certificate" (seen on a real node)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rmd RMD CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier(b"\x6d" * 20), critical=False)
        .sign(key, hashes.SHA256())
    )
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _, pem = new_request("rmd-agent.n1")
    obj = csr(pem)
    cert = x509.load_pem_x509_certificate(Signer.from_pem(ca_pem, key_pem).sign(obj, judge(obj), NOW))
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == b"\x6d" * 20


def test_serve_refuses_tls_csr_without_a_node_or_with_too_short_a_lifetime() -> None:
    with pytest.raises(ConfigError, match="needs node_name"):
        check_serve_settings(AgentSettings(tls_csr=True))
    with pytest.raises(ConfigError, match="at least 600"):
        check_serve_settings(AgentSettings(tls_csr=True, node_name="n1", tls_csr_expiration_seconds=60))
    # good settings: nothing read yet (the files come with the certificate)
    assert check_serve_settings(AgentSettings(tls_csr=True, node_name="n1")) is None
