"""The operator as approver and signer of the agents' serving certificates (signer
intel.com/rmd-agent-serving): each request is reviewed (agent_certs.review), approved or denied through its
approval subresource, and, once approved, signed through its status subresource. Each step is one write; the
watch event it causes brings the next step, so a restart between them resumes where it stopped. The
`kubernetes` client runs in worker threads.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_api.kube_time import format_time
from rmd_operator.agent_certs import Signer, needs_action, review, true_conditions
from rmd_operator.errors import ConfigError
from rmd_operator.kube import load_configuration
from rmd_operator.settings import OperatorSettings

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT_SECONDS = 30.0
MERGE_PATCH = "application/merge-patch+json"


class AgentCertificateSigner:
    """Create with `await AgentCertificateSigner.create(settings)`; `close()` at exit."""

    def __init__(self, settings: OperatorSettings, signer: Signer, api: Any) -> None:
        self._settings = settings
        self._signer = signer
        self._api = api
        self._certificates = client.CertificatesV1Api(api)

    @classmethod
    async def create(cls, settings: OperatorSettings) -> AgentCertificateSigner:
        def load() -> tuple[Signer, Any]:
            try:
                cert = Path(settings.agent_signer_ca_cert).read_bytes()
                key = Path(settings.agent_signer_ca_key).read_bytes()
                signer = Signer.from_pem(cert, key)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"agent certificate signer: cannot load the CA: {exc}") from None
            return signer, client.ApiClient(configuration=load_configuration())

        signer, api = await asyncio.to_thread(load)
        return cls(settings, signer, api)

    def close(self) -> None:
        self._api.close()

    async def handle(self, csr: Mapping[str, Any]) -> None:
        """One step for a CertificateSigningRequest of our signer: decide, or sign what was approved."""
        if not needs_action(csr):
            return
        name = str((csr.get("metadata") or {}).get("name"))
        s = self._settings
        verdict = review(
            csr, agent_user=s.agent_user(), server_name=s.server_name, max_seconds=s.agent_cert_max_seconds
        )
        approved = "Approved" in true_conditions(csr)
        try:
            if not approved:
                condition = {
                    "type": "Approved" if verdict.approve else "Denied",
                    "status": "True",
                    "reason": verdict.reason,
                    "message": verdict.message,
                    "lastUpdateTime": format_time(_now()),
                }
                await self._patch("approval", name, {"status": {"conditions": [condition]}})
                log.info(
                    "%s CertificateSigningRequest %s: %s", condition["type"].lower(), name, verdict.message
                )
            elif verdict.approve:
                cert = await asyncio.to_thread(self._signer.sign, csr, verdict, _now())
                await self._patch(
                    "status", name, {"status": {"certificate": base64.b64encode(cert).decode()}}
                )
                log.info("signed CertificateSigningRequest %s for %s", name, verdict.name)
            else:  # approved by somebody else, but not something this signer signs
                failed = {
                    "type": "Failed",
                    "status": "True",
                    "reason": verdict.reason,
                    "message": verdict.message,
                }
                await self._patch("status", name, {"status": {"conditions": [failed]}})
                log.warning(
                    "CertificateSigningRequest %s approved elsewhere, not signed: %s", name, verdict.message
                )
        except ApiException as exc:
            log.warning("CertificateSigningRequest %s: %s %s", name, exc.status, exc.reason)
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            log.warning("CertificateSigningRequest %s: %s", name, exc)

    async def _patch(self, subresource: str, name: str, patch: Mapping[str, Any]) -> None:
        method = (
            self._certificates.patch_certificate_signing_request_approval
            if subresource == "approval"
            else self._certificates.patch_certificate_signing_request_status
        )
        await asyncio.to_thread(
            method,
            name,
            dict(patch),
            _content_type=MERGE_PATCH,
            _request_timeout=_REQUEST_TIMEOUT_SECONDS,
            _preload_content=False,
        )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
