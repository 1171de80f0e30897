"""The agent's serving certificate from the Kubernetes CSR API (setting tls_csr), the way kubelets get theirs.

At start, and again at two thirds of the certificate's life, the agent makes a new key (it never leaves the
node), asks for a certificate valid for `tls_server_name` of its node only (signer
intel.com/rmd-agent-serving, rmd_api.agent_certs), waits for the operator to sign it, and writes key and
certificate to tls_key and tls_cert (the key first, each by atomic rename). The gRPC server reads those
files again when they change (tls.py), so a renewal needs no restart. A certificate already on disk that is
valid for the name and not yet due for renewal is used as it is, so a restart does not ask again.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from rmd_agent.errors import ConfigError, KubeApiError, KubeConnectionError
from rmd_agent.kube_api import KubeApi, object_path
from rmd_api.agent_certs import NODE_ANNOTATION, SIGNER_NAME, USAGES

log = logging.getLogger(__name__)

RENEW_AT = 2 / 3  # of the certificate's life
_POLL_SECONDS = (0.2, 5.0)
CSRS = object_path("certificates.k8s.io", "v1", "certificatesigningrequests")


class CertificateRequestFailed(ConfigError):
    """The CSR was denied or failed, or nobody signed it in time."""


@dataclass(frozen=True)
class Validity:
    not_before: datetime.datetime
    not_after: datetime.datetime

    @property
    def renew_at(self) -> datetime.datetime:
        return self.not_before + (self.not_after - self.not_before) * RENEW_AT


def certificate_validity(cert_pem: bytes, name: str) -> Validity | None:
    """The validity of the first certificate in `cert_pem` if it is valid for DNS name `name`; else None."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    if name not in names.get_values_for_type(x509.DNSName):
        return None
    return Validity(cert.not_valid_before_utc, cert.not_valid_after_utc)


def renewal_reason(cert_pem: bytes | None, name: str, now: datetime.datetime) -> str | None:
    """Why a new certificate is needed (None: the one on disk will do for now)."""
    if cert_pem is None:
        return "no certificate yet"
    validity = certificate_validity(cert_pem, name)
    if validity is None:
        return f"the certificate on disk is not valid for {name}"
    if now >= validity.renew_at:
        return f"the certificate is due for renewal (expires {validity.not_after:%Y-%m-%d %H:%M} UTC)"
    return None


def new_request(name: str) -> tuple[bytes, bytes]:
    """A new P-256 key and a PEM certificate request for `name` (subject CN and the one DNS SAN)."""
    key = ec.generate_private_key(ec.SECP256R1())
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, request.public_bytes(serialization.Encoding.PEM)


def request_body(node: str, request_pem: bytes, expiration_seconds: int) -> dict[str, Any]:
    """The CertificateSigningRequest the agent of `node` creates for `request_pem`: exactly what the chart's
    admission policy admits from an agent (charts/rmd/templates/agent-csr-policy.yaml)."""
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        # The API server cuts a generated name's prefix to 58 characters, so the name cannot be relied on to
        # carry the node; the annotation does.
        "metadata": {"generateName": f"rmd-agent-{node}-"[:200], "annotations": {NODE_ANNOTATION: node}},
        "spec": {
            "request": base64.b64encode(request_pem).decode(),
            "signerName": SIGNER_NAME,
            "usages": list(USAGES),
            "expirationSeconds": expiration_seconds,
        },
    }


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


class ServingCertificate:
    """Obtains and renews the serving certificate at `cert_path`/`key_path` for DNS name `name`."""

    def __init__(
        self,
        api: KubeApi,
        *,
        node: str,
        name: str,
        cert_path: Path,
        key_path: Path,
        expiration_seconds: int,
        wait_seconds: float = 300.0,
    ) -> None:
        self._api = api
        self.node = node
        self.name = name
        self.cert_path = cert_path
        self.key_path = key_path
        self.expiration_seconds = expiration_seconds
        self.wait_seconds = wait_seconds

    async def ensure(self) -> Validity:
        """Make sure a usable certificate is on disk (asking for one if needed); its validity."""
        now = datetime.datetime.now(datetime.UTC)
        cert_pem = _read(self.cert_path)
        reason = renewal_reason(cert_pem, self.name, now) if _read(self.key_path) else "no key yet"
        if reason is None and cert_pem is not None:
            validity = certificate_validity(cert_pem, self.name)
            assert validity is not None
            return validity
        log.info("asking for a serving certificate for %s: %s", self.name, reason, extra={"node": self.node})
        key_pem, cert_pem = await self._request()
        await asyncio.to_thread(_write_atomically, self.key_path, key_pem, 0o600)
        await asyncio.to_thread(_write_atomically, self.cert_path, cert_pem, 0o644)
        validity = certificate_validity(cert_pem, self.name)
        if validity is None:
            raise CertificateRequestFailed(f"the signed certificate is not valid for {self.name}")
        log.info(
            "serving certificate for %s issued, valid until %s",
            self.name,
            validity.not_after.isoformat(),
            extra={"node": self.node},
        )
        return validity

    async def renew_forever(self) -> None:
        """Renew at two thirds of each certificate's life until cancelled (after a failure: in a minute)."""
        while True:
            try:
                validity = await self.ensure()
                delay = (validity.renew_at - datetime.datetime.now(datetime.UTC)).total_seconds()
            except (ConfigError, KubeApiError, OSError) as exc:
                log.warning("serving certificate renewal failed; retrying in 60 s: %s", exc)
                delay = 60.0
            await asyncio.sleep(max(delay, 1.0))

    async def _request(self) -> tuple[bytes, bytes]:
        key_pem, request_pem = await asyncio.to_thread(new_request, self.name)
        body = request_body(self.node, request_pem, self.expiration_seconds)
        try:
            created = await self._api.call("POST", CSRS, body=body)
        except KubeConnectionError:
            raise  # no answer: not a refusal (at start the agent stops; a renewal retries)
        except KubeApiError as exc:  # the API server's message says why (RBAC, the chart's CSR policy)
            raise CertificateRequestFailed(f"cannot create a CertificateSigningRequest: {exc}") from None
        name = created["metadata"]["name"]
        cert_pem = await self._wait_for_certificate(name)
        return key_pem, cert_pem

    async def _wait_for_certificate(self, name: str) -> bytes:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_seconds
        pause = _POLL_SECONDS[0]
        while True:
            csr = await self._api.call("GET", f"{CSRS}/{name}")
            status = csr.get("status") or {}
            for condition in status.get("conditions") or ():
                if (
                    condition.get("type") in ("Denied", "Failed")
                    and condition.get("status", "True") == "True"
                ):
                    raise CertificateRequestFailed(
                        f"CertificateSigningRequest {name} {condition['type'].lower()}: "
                        f"{condition.get('reason', '')}: {condition.get('message', '')}"
                    )
            if status.get("certificate"):
                return base64.b64decode(status["certificate"])
            if loop.time() >= deadline:
                raise CertificateRequestFailed(
                    f"CertificateSigningRequest {name} was not signed within {self.wait_seconds:.0f} s: is "
                    f"the operator running with an agent certificate signer (signer {SIGNER_NAME})?"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, _POLL_SECONDS[1])
