"""Agents' serving certificates through the CSR API on a real API server: the real operator process signs
what an agent of a node may have (its own name) and denies the rest with the reason; the agent's client
(ServingCertificate) writes the key and certificate and does not ask again while they are good.

The agent's requests are made as its ServiceAccount with the node its pod token would carry, through the API
server's impersonation (the API server records the impersonated user and extra in the CSR, as it would for a
pod-bound token).
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from kubernetes import client

from rmd_agent.kube_api import KubeApi
from rmd_agent.kube_config import load_kubeconfig
from rmd_agent.server.serving_cert import CertificateRequestFailed, ServingCertificate, new_request
from rmd_api.agent_certs import NODE_NAME_EXTRA, SIGNER_NAME
from rmd_sim.cluster import SimCluster
from rmd_sim.control_plane import ControlPlane
from rmd_sim.pki import CertificateAuthority

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

NAMESPACE = "rmd-system"
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:rmd-agent"


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="rmd-csr-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def ca(workdir: Path) -> CertificateAuthority:
    authority = CertificateAuthority("rmd-test-signer")
    (workdir / "signer.crt").write_bytes(authority.cert_pem)
    (workdir / "signer.key").write_bytes(authority.key_pem)
    return authority


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(
    workdir: Path, ca: CertificateAuthority, control_plane: ControlPlane
) -> AsyncIterator[SimCluster]:
    with control_plane.api_client() as api:
        rbac = client.RbacAuthorizationV1Api(api)
        role = {
            "metadata": {"name": "rmd-test-agent-csr"},
            "rules": [
                {
                    "apiGroups": ["certificates.k8s.io"],
                    "resources": ["certificatesigningrequests"],
                    "verbs": ["create", "get"],
                }
            ],
        }
        binding = {
            "metadata": {"name": "rmd-test-agent-csr"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "rmd-test-agent-csr",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "rmd-agent", "namespace": NAMESPACE}],
        }
        for create, body in ((rbac.create_cluster_role, role), (rbac.create_cluster_role_binding, binding)):
            try:
                create(body)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
    sim = SimCluster(
        workdir / "cluster",
        nodes=[],
        control_plane=control_plane,
        operator_settings={
            "agent_signer_ca_cert": str(workdir / "signer.crt"),
            "agent_signer_ca_key": str(workdir / "signer.key"),
            "agent_cert_max_seconds": 3600,
        },
    )
    await sim.start()
    try:
        yield sim
    finally:
        await sim.stop()


def agent_api(control_plane: ControlPlane, node: str | None, user: str = AGENT_USER) -> Any:
    api = control_plane.api_client()
    api.set_default_header("Impersonate-User", user)
    if node is not None:
        api.set_default_header(f"Impersonate-Extra-{NODE_NAME_EXTRA.replace('/', '%2F')}", node)
    return api


def agent_client(control_plane: ControlPlane, node: str | None, user: str = AGENT_USER) -> KubeApi:
    """The agent's own client, acting as `user` with the node a pod-bound token would carry."""
    extra = {NODE_NAME_EXTRA: [node]} if node is not None else None
    return KubeApi(load_kubeconfig(control_plane.impersonating_kubeconfig(user, extra)))


def certificate(api: KubeApi, workdir: Path, node: str, name: str) -> ServingCertificate:
    return ServingCertificate(
        api,
        node=node,
        name=name,
        cert_path=workdir / node / "tls.crt",
        key_path=workdir / node / "tls.key",
        expiration_seconds=7200,
        wait_seconds=30,
    )


def csr_count(control_plane: ControlPlane) -> int:
    with control_plane.api_client() as api:
        found = client.CertificatesV1Api(api).list_certificate_signing_request(
            field_selector=f"spec.signerName={SIGNER_NAME}"
        )
    return len(found.items)


async def test_an_agent_gets_a_certificate_for_its_own_name_only_once(
    cluster: SimCluster, control_plane: ControlPlane, ca: CertificateAuthority, workdir: Path
) -> None:
    api = agent_client(control_plane, "node-a")
    serving = certificate(api, workdir, "node-a", "rmd-agent.node-a")
    before = csr_count(control_plane)
    validity = await serving.ensure()
    cert = x509.load_pem_x509_certificate(serving.cert_path.read_bytes())
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    cert.verify_directly_issued_by(ca_cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(sans) == [x509.DNSName("rmd-agent.node-a")]
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    lifetime = validity.not_after - validity.not_before
    assert 3600 <= lifetime.total_seconds() <= 3600 + 600  # capped by agent_cert_max_seconds (+ backdating)
    assert stat.S_IMODE(serving.key_path.stat().st_mode) == 0o600
    key = serving.key_path.read_bytes()
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey) and b"PRIVATE KEY" in key
    await serving.ensure()  # still good: nothing asked, nothing written
    assert csr_count(control_plane) == before + 1
    assert serving.key_path.read_bytes() == key
    api.close()


async def test_a_node_cannot_get_another_nodes_name(
    cluster: SimCluster, control_plane: ControlPlane, workdir: Path
) -> None:
    api = agent_client(control_plane, "node-a")
    with pytest.raises(CertificateRequestFailed, match=r"denied: WrongNames.*rmd-agent\.node-a"):
        await certificate(api, workdir, "node-a", "rmd-agent.node-b").ensure()
    api.close()


@pytest.mark.parametrize(
    ("user", "node", "reason"),
    [
        ("system:serviceaccount:default:someone", "node-c", "NotAnAgent"),
        (AGENT_USER, None, "NoNode"),
    ],
)
async def test_requests_from_others_or_without_a_node_are_denied(
    cluster: SimCluster,
    control_plane: ControlPlane,
    workdir: Path,
    *,
    user: str,
    node: str | None,
    reason: str,
) -> None:
    if user != AGENT_USER:  # give this user the right to ask, so that only the signer can refuse
        with control_plane.api_client() as admin:
            client.RbacAuthorizationV1Api(admin).patch_cluster_role_binding(
                "rmd-test-agent-csr",
                {
                    "subjects": [
                        {"kind": "ServiceAccount", "name": "rmd-agent", "namespace": NAMESPACE},
                        {"kind": "ServiceAccount", "name": "someone", "namespace": "default"},
                    ]
                },
            )
    api = agent_client(control_plane, node, user)
    with pytest.raises(CertificateRequestFailed, match=f"denied: {reason}"):
        await certificate(api, workdir, "node-c", "rmd-agent.node-c").ensure()
    api.close()


async def test_extra_names_or_client_usage_are_denied(
    cluster: SimCluster, control_plane: ControlPlane
) -> None:
    api = agent_api(control_plane, "node-d")
    certificates = client.CertificatesV1Api(api)
    _, request = new_request("rmd-agent.node-d")
    asked = certificates.create_certificate_signing_request(
        {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"generateName": "rmd-test-"},
            "spec": {
                "request": base64.b64encode(request).decode(),
                "signerName": SIGNER_NAME,
                "usages": ["digital signature", "server auth", "client auth"],
            },
        }
    )
    for _ in range(100):
        found = certificates.read_certificate_signing_request(asked.metadata.name)
        conditions = {c.type: c for c in (found.status.conditions or [])}
        if conditions:
            break
        await asyncio.sleep(0.2)
    assert "Denied" in conditions and conditions["Denied"].reason == "WrongUsages"
    assert not found.status.certificate
    api.close()
