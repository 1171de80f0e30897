"""The agent process never imports the `kubernetes` package (issue #14: `import kubernetes.client` alone costs
about 30 MiB). pyproject's import contract `agent-without-kubernetes` forbids it in the source; this test
checks the running process, where a dependency or an `importlib` call could still bring it in.

A fresh interpreter loads what `rmd-agent serve` loads with everything on: the command line, the server and
the engine module, the companions started with NodeResourceTopology, RmdNodeState, heartbeat, power and the
device plugin (their modules are imported only then), and the serving-certificate client of `tls_csr`. The
kubeconfig names a port nothing listens on, so the started tasks fail their requests and are stopped."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import yaml

from rmd_sim.pki import CertificateAuthority

# Run in the child: prints the modules it loaded as JSON on its last line.
SERVE_IMPORTS = r"""
import asyncio, importlib, json, sys
from pathlib import Path

from prometheus_client import CollectorRegistry

import rmd_agent.cli  # noqa: F401  # the command
import rmd_agent.logsetup  # noqa: F401  # loaded by `serve`
from rmd_agent.companions import Companions
from rmd_agent.server.app import AgentServer
from rmd_agent.settings import AgentSettings

importlib.import_module("rmd_agent.engine")  # as app.create_default_engine loads it


class Engine:
    async def start(self): ...
    async def close(self): ...
    async def apply(self, workload): raise RuntimeError("not in this test")
    async def remove(self, namespace, name, uid=""): return False
    async def list(self): return []
    async def node(self): raise RuntimeError("not in this test")
    async def container_cpus(self, *args): raise RuntimeError("not in this test")
    async def ready(self): return False, "test"


class Pods:
    async def list(self): raise RuntimeError("no kubelet in this test")


async def main(work, csr):
    settings = AgentSettings(
        node_name="n1", host_root=work / "host", kubeconfig=str(work / "kubeconfig"),
        nrt_enabled=True, node_state_enabled=True, heartbeat_seconds=5.0, power_enabled=True,
        device_plugin_enabled=True, tls_csr=csr, tls_cert=work / "tls.crt", tls_key=work / "tls.key",
    )
    registry = CollectorRegistry()
    companions = Companions(settings, Engine(), registry, Pods())
    await companions.start(50051)
    server = AgentServer(settings, companions.engine, registry)
    if csr:
        server._serving_certificate()
    await companions.stop(grace=5.0)


asyncio.run(main(Path(sys.argv[1]), sys.argv[2] == "csr"))
print(json.dumps(sorted(sys.modules)))
"""


def write_kubeconfig(path: Path, ca: CertificateAuthority) -> None:
    user = ca.issue_client("rmd-agent")
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": "https://127.0.0.1:1",
                            "certificate-authority-data": b64(ca.cert_pem),
                        },
                    }
                ],
                "users": [
                    {
                        "name": "u",
                        "user": {
                            "client-certificate-data": b64(user.cert_pem),
                            "client-key-data": b64(user.key_pem),
                        },
                    }
                ],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )


def serve_imports(work: Path, certificates: str) -> list[str]:
    """The modules the child loaded; `certificates` is "csr" (tls_csr) or "files"."""
    (work / "host").mkdir()
    write_kubeconfig(work / "kubeconfig", CertificateAuthority("test-ca"))
    done = subprocess.run(
        [sys.executable, "-c", SERVE_IMPORTS, str(work), certificates],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_serve_with_certificates_as_files_never_imports_cryptography(tmp_path: Path) -> None:
    """The client's identity comes from gRPC's `peer_dns`, the certificate request is made only with
    tls_csr: 9 MiB less for an agent given its certificate as files (bench/README.md, agent_grpc.py)."""
    loaded = serve_imports(tmp_path, "files")
    assert "rmd_agent.nrt.exporter" in loaded, "the companions were not loaded: the test covers nothing"
    assert [m for m in loaded if m == "cryptography" or m.startswith("cryptography.")] == []


def test_serve_with_everything_on_never_imports_kubernetes(tmp_path: Path) -> None:
    loaded = serve_imports(tmp_path, "csr")
    # The optional companions were loaded, so their imports were seen.
    for module in (
        "rmd_agent.engine",
        "rmd_agent.nrt.exporter",
        "rmd_agent.node_state",
        "rmd_agent.heartbeat",
        "rmd_agent.server.serving_cert",
        "rmd_agent.power.sampler",
        "rmd_agent.deviceplugin.plugin",
    ):
        assert module in loaded, f"{module} was not loaded: the test no longer covers it"
    assert [m for m in loaded if m == "kubernetes" or m.startswith("kubernetes.")] == []
