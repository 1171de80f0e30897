"""The components of the test control plane (rmd_sim.control_plane): the flags each binary runs with and how
to tell it is up. Pure: building a Component starts nothing.

Certificates and kubeconfigs are the files ControlPlane writes in its work directory: `pki/ca.crt`,
`pki/apiserver.{crt,key}`, `pki/kubelet-client.{crt,key}`, `pki/service-account.key`,
`controller-manager.kubeconfig` and `scheduler.kubeconfig`.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

_PROBE_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class Component:
    """A binary of the control plane's binary directory, its arguments, and its readiness probe (which may
    raise OSError or http.client.HTTPException while the component is not listening yet)."""

    name: str
    args: list[str]
    ready: Callable[[], bool]
    ready_state: str  # what `ready` means, for a timeout's message: "healthy" or "ready"


def http_get(port: int, path: str, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """GET on 127.0.0.1 without any proxy (http.client ignores *_PROXY, which must not apply to loopback)."""
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=_PROBE_TIMEOUT_SECONDS)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=_PROBE_TIMEOUT_SECONDS, context=context)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _unverified_tls() -> ssl.SSLContext:
    # The secure port serves a self-signed certificate; /healthz is always allowed without credentials.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def etcd(cluster_name: str, data_dir: Path, port: int, peer_port: int) -> Component:
    client_url, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"

    def healthy() -> bool:
        status, body = http_get(port, "/health")
        return status == 200 and json.loads(body).get("health") == "true"

    args = [
        f"--name={cluster_name}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster={cluster_name}={peer_url}",
        # Throw-away data: skipping fsync makes every API write much faster.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]
    return Component("etcd", args, healthy, "healthy")


def kube_apiserver(
    pki_dir: Path, port: int, etcd_port: int, issuer_url: str, service_cluster_ip_range: str
) -> Component:
    sa_key = pki_dir / "service-account.key"
    args = [
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        # Without it the API server picks the default route's address, and offline CI may have none.
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
        f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
        f"--client-ca-file={pki_dir / 'ca.crt'}",
        # Kubelets are reached at their node address (no DNS for node names here).
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={pki_dir / 'kubelet-client.crt'}",
        f"--kubelet-client-key={pki_dir / 'kubelet-client.key'}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={issuer_url}",
        f"--service-account-key-file={sa_key}",
        f"--service-account-signing-key-file={sa_key}",
        f"--service-cluster-ip-range={service_cluster_ip_range}",
        "--allow-privileged=true",
        "--profiling=false",
    ]
    # /readyz includes RBAC bootstrap and CRD informer sync; anonymous access to it is allowed by default.
    context = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
    return Component("kube-apiserver", args, lambda: http_get(port, "/readyz", context)[0] == 200, "ready")


def kube_controller_manager(workdir: Path, pki_dir: Path, port: int, controllers: Sequence[str]) -> Component:
    kubeconfig = workdir / "controller-manager.kubeconfig"
    args = [
        f"--kubeconfig={kubeconfig}",
        # Client certificates are checked against our CA directly; looking the CA up in the cluster would log
        # errors for the request-header CA that this API server does not configure.
        f"--authentication-kubeconfig={kubeconfig}",
        "--authentication-skip-lookup=true",
        f"--client-ca-file={pki_dir / 'ca.crt'}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--controllers={','.join(controllers)}",
        "--leader-elect=false",
        # Controllers act with the manager's own credentials instead of per-controller tokens.
        "--use-service-account-credentials=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'controller-manager'}",
        "--profiling=false",
    ]
    context = _unverified_tls()
    return Component(
        "kube-controller-manager", args, lambda: http_get(port, "/healthz", context)[0] == 200, "healthy"
    )


def kube_scheduler(workdir: Path, pki_dir: Path, port: int) -> Component:
    # system:kube-scheduler is bound by the API server's bootstrap RBAC to exactly what it needs.
    kubeconfig = workdir / "scheduler.kubeconfig"
    args = [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--authentication-skip-lookup=true",
        f"--client-ca-file={pki_dir / 'ca.crt'}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'scheduler'}",
        "--profiling=false",
    ]
    context = _unverified_tls()
    return Component("kube-scheduler", args, lambda: http_get(port, "/healthz", context)[0] == 200, "healthy")
