"""Agent serving certificates: the operator's review and signature (operator/rmd_operator/agent_certs.py) and
the agent's renewal decision and its API failures (agent/rmd_agent/server/serving_cert.py), without an API
server."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from rmd_agent.errors import ConfigError, KubeApiError, KubeConnectionError
from rmd_agent.server import serving_cert
from rmd_agent.server.app import check_serve_settings
from rmd_agent.server.serving_cert import (
    CSRS,
    CertificateRequestFailed,
    ServingCertificate,
    new_request,
    renewal_reason,
)
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


class RefusingApi:
    """Stands in for kube_api.KubeApi: every request raises `error`; records (method, path)."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls: list[tuple[str, str]] = []

    async def call(self, method: str, path: str, **_: Any) -> Any:
        self.calls.append((method, path))
        raise self.error


def serving(api: Any, tmp_path: Path) -> ServingCertificate:
    return ServingCertificate(
        api,
        node="n1",
        name="rmd-agent.n1",
        cert_path=tmp_path / "tls.crt",
        key_path=tmp_path / "tls.key",
        expiration_seconds=3600,
    )


async def test_a_refused_request_says_why_and_no_answer_is_not_a_refusal(tmp_path: Path) -> None:
    status = {"kind": "Status", "message": "denied request: the rmd agent must use its pod's token"}
    api = RefusingApi(KubeApiError(403, "Forbidden", json.dumps(status)))
    with pytest.raises(CertificateRequestFailed) as refused:
        await serving(api, tmp_path).ensure()
    assert str(refused.value) == (
        "cannot create a CertificateSigningRequest: 403 Forbidden: denied request: the rmd agent must use "
        "its pod's token"
    )
    assert api.calls == [("POST", CSRS)] and CSRS == "/apis/certificates.k8s.io/v1/certificatesigningrequests"
    unreachable = RefusingApi(KubeConnectionError("POST https://api:6443/...: no answer: refused"))
    with pytest.raises(KubeConnectionError):  # at start: the agent stops (exit 1), it is no bad setting
        await serving(unreachable, tmp_path).ensure()
    assert not (tmp_path / "tls.key").exists()


async def test_a_renewal_without_an_answer_is_retried_in_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:
            raise asyncio.CancelledError

    monkeypatch.setattr(serving_cert.asyncio, "sleep", sleep)
    api = RefusingApi(KubeConnectionError("POST https://api:6443/...: no answer: refused"))
    with caplog.at_level(logging.WARNING), pytest.raises(asyncio.CancelledError):
        await serving(api, tmp_path).renew_forever()
    assert waits == [60.0, 60.0] and len(api.calls) == 2
    assert "serving certificate renewal failed; retrying in 60 s: POST https://api:6443/...: no answer" in (
        caplog.text
    )
