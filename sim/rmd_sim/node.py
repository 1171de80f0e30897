"""A whole simulated node: host tree, kernel-like resctrl (FUSE), simulated kubelet, and a real
`rmd-agent serve` process talking mTLS. Used by end-to-end tests, benchmarks and the demo.

    pki = ClusterPki(workdir / "pki")
    async with SimNode("worker-node-1", workdir / "n1", pki) as node:
        channel = node.channel()          # grpc.aio secure channel as the operator's identity
        ...
        node.check_resctrl()              # [] when the node's resctrl follows the kernel's rules

The agent process reads its settings from a YAML file (config.yaml under the node's work dir);
`agent_settings` overrides or adds settings (e.g. kubeconfig for the Kubernetes parts).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Self

import grpc
import kubernetes
import yaml

from rmd_sim.hosttree import write_host_tree
from rmd_sim.kubelet import SimKubelet
from rmd_sim.kubelet_api import KubeletNode
from rmd_sim.netutil import free_port
from rmd_sim.pki import CertificateAuthority
from rmd_sim.resctrl import check_resctrl_tree
from rmd_sim.resctrl_fuse import ResctrlMount
from rmd_sim.spec import NodeSpec

OPERATOR_IDENTITY = "rmd-operator"  # the client identity agents allow by default (docs/security.md)


class ClusterPki:
    """One CA for a simulated cluster, and the operator's client certificate, written under `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = CertificateAuthority("rmd-test-ca")
        self.ca_file = self._write("ca.crt", self.ca.cert_pem)
        client = self.ca.issue_client(OPERATOR_IDENTITY, dns_names=[OPERATOR_IDENTITY])
        self.client_cert = self._write("operator.crt", client.cert_pem)
        self.client_key = self._write("operator.key", client.key_pem)

    def _write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def agent_certs(self, node: str, directory: Path) -> tuple[Path, Path]:
        """Node `node`'s agent serving certificate: for its node name, rmd-agent.<node> and loopback."""
        pair = self.ca.issue_server(
            f"rmd-agent.{node}",
            dns_names=[node, f"rmd-agent.{node}", "localhost"],
            ip_addresses=["127.0.0.1"],
        )
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "tls.crt").write_bytes(pair.cert_pem)
        (directory / "tls.key").write_bytes(pair.key_pem)
        (directory / "tls.key").chmod(0o600)
        return directory / "tls.crt", directory / "tls.key"

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_file.read_bytes(),
            private_key=self.client_key.read_bytes(),
            certificate_chain=self.client_cert.read_bytes(),
        )


class AgentProcessError(RuntimeError):
    """The agent process exited or did not become ready; the message ends with its log."""


class SimNode:
    def __init__(
        self,
        name: str,
        workdir: Path,
        pki: ClusterPki,
        *,
        spec: NodeSpec | None = None,
        agent_settings: dict[str, Any] | None = None,
        kubelet: bool = True,
        kubeconfig: Path | None = None,
        labels: dict[str, str] | None = None,
        node_state_namespace: str = "default",
    ) -> None:
        self.name = name
        self.workdir = workdir
        self.root = workdir / "host"
        self.pki = pki
        self.spec = spec or NodeSpec.default()
        self.extra_settings = dict(agent_settings or {})
        self.with_kubelet = kubelet or kubeconfig is not None
        # With a kubeconfig the node joins the API server: its kubelet registers the Node and runs the pods
        # bound to it, and its agent publishes RmdNodeState and NodeResourceTopology.
        self.kubeconfig = kubeconfig
        self.labels = dict(labels or {})
        self.node_state_namespace = node_state_namespace
        self.kubelet_node: KubeletNode | None = None
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.mount = ResctrlMount(self.root)
        self.kubelet: SimKubelet | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "agent.log"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def agent_config(self) -> dict[str, Any]:
        cert, key = self.pki.agent_certs(self.name, self.workdir / "tls")
        return {
            "node_name": self.name,
            "host_root": str(self.root),
            "grpc_listen": self.endpoint,
            "http_listen": f"127.0.0.1:{self.http_port}",
            "tls_cert": str(cert),
            "tls_key": str(key),
            "tls_client_ca": str(self.pki.ca_file),
            "allowed_clients": [OPERATOR_IDENTITY],
            **self.kubernetes_settings(),
            **self.extra_settings,
        }

    def kubernetes_settings(self) -> dict[str, Any]:
        if self.kubeconfig is None:
            return {"nrt_enabled": False, "node_state_enabled": False}
        return {
            "kubeconfig": str(self.kubeconfig),
            "nrt_enabled": True,
            "node_state_enabled": True,
            "node_state_namespace": self.node_state_namespace,
        }

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.root.exists():
            write_host_tree(self.spec, self.root)
        await asyncio.to_thread(self.mount.start)
        if self.with_kubelet:
            self.kubelet = SimKubelet.from_host_tree(self.root, device_plugins=self.kubeconfig is not None)
            await self.kubelet.__aenter__()
        if self.kubelet is not None and self.kubeconfig is not None:
            api = await asyncio.to_thread(kubernetes.config.new_client_from_config, str(self.kubeconfig))
            self.kubelet_node = KubeletNode(self.kubelet, api, self.name, labels=self.labels)
            await self.kubelet_node.__aenter__()
        await self.start_agent()

    async def start_agent(self) -> None:
        config = self.workdir / "config.yaml"
        config.write_text(yaml.safe_dump(self.agent_config(), sort_keys=True))
        self.process = await asyncio.to_thread(self._spawn_agent, config)
        await self.wait_ready()

    def _spawn_agent(self, config: Path) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "rmd_agent", "serve", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def wait_ready(self, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        url = f"http://127.0.0.1:{self.http_port}/readyz"
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise AgentProcessError(f"agent of {self.name} exited:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                status = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=1).status)
                if status == 200:
                    return
            await asyncio.sleep(0.1)
        raise AgentProcessError(f"agent of {self.name} not ready after {within:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    async def stop_agent(self, sig: int = signal.SIGTERM, grace: float = 15.0) -> int | None:
        """Stop the agent process (SIGKILL simulates a crash); returns its exit status."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        proc.send_signal(sig)
        try:
            return await asyncio.to_thread(proc.wait, grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return await asyncio.to_thread(proc.wait)

    async def stop(self) -> None:
        await self.stop_agent()
        if self.kubelet_node is not None:
            await self.kubelet_node.__aexit__(None, None, None)
            self.kubelet_node = None
        if self.kubelet is not None:
            await self.kubelet.__aexit__(None, None, None)
            self.kubelet = None
        await asyncio.to_thread(self.mount.stop)

    def channel(self) -> grpc.aio.Channel:
        """A channel to this node's agent with the operator's client certificate."""
        return grpc.aio.secure_channel(
            self.endpoint,
            self.pki.channel_credentials(),
            options=[("grpc.ssl_target_name_override", f"rmd-agent.{self.name}")],
        )

    def check_resctrl(self) -> list[str]:
        return check_resctrl_tree(self.mount.backing_root)

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
