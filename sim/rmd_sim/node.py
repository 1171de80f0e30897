"""A whole simulated node: host tree, kernel-like resctrl (FUSE), simulated kubelet, and a real
`rmd-agent serve` process talking mTLS. Used by end-to-end tests, benchmarks and the demo.

    pki = ClusterPki(workdir / "pki")
    async with SimNode("worker-node-1", workdir / "n1", pki) as node:
        channel = node.channel()          # grpc.aio secure channel as the operator's identity
        ...
        node.check_resctrl()              # [] when the node's resctrl follows the kernel's rules

The agent process reads its settings from a YAML file (config.yaml under the node's work dir);
`agent_settings` overrides or adds settings (e.g. kubeconfig for the Kubernetes parts).

`resctrl_process=True` serves the node's FUSE resctrl from a child process (`python -m rmd_sim
resctrl-mount`) instead of a thread of this one: many nodes served by one process contend for its GIL
(benchmarks). `node.mount.sim` (fault injection) is then unavailable; `check_resctrl()` still works.

`move_agent(network)` restarts the agent inside an `rmd_sim.netns.AgentNetwork` (a network namespace of its
own, so a test can cut it off for real): it then listens on the namespace's address and reaches the API
server through the network's relay. Everything else (host tree, FUSE mount, kubelet sockets) stays shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

import grpc
import kubernetes
import yaml

from rmd_sim.hosttree import write_host_tree
from rmd_sim.kubelet import SimKubelet
from rmd_sim.kubelet_api import KubeletNode
from rmd_sim.netns import AgentNetwork
from rmd_sim.netutil import free_port
from rmd_sim.pki import CertificateAuthority
from rmd_sim.resctrl import check_resctrl_tree
from rmd_sim.resctrl_fuse import MOUNT_TIMEOUT_S, ResctrlMount, ResctrlMountError, is_mounted, unmount
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

    def agent_certs(
        self, node: str, directory: Path, validity: datetime.timedelta | None = None
    ) -> tuple[Path, Path]:
        """Node `node`'s agent serving certificate: for its node name, rmd-agent.<node> and loopback; valid a
        year, or `validity`."""
        pair = self.ca.issue_server(
            f"rmd-agent.{node}",
            dns_names=[node, f"rmd-agent.{node}", "localhost"],
            ip_addresses=["127.0.0.1"],
            validity=validity,
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
        resctrl_process: bool = False,
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
        self.resctrl_process = resctrl_process
        self.mount_process: subprocess.Popen[bytes] | None = None
        self.kubelet: SimKubelet | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "agent.log"
        self.network: AgentNetwork | None = None  # the agent's own network namespace, if any
        # The lifetime of the serving certificate the agent gets at its next start (None: a year).
        self.cert_validity: datetime.timedelta | None = None

    @property
    def agent_host(self) -> str:
        """The address the agent listens on: loopback, or its own network namespace's address."""
        return self.network.address if self.network is not None else "127.0.0.1"

    @property
    def endpoint(self) -> str:
        return f"{self.agent_host}:{self.grpc_port}"

    def agent_config(self) -> dict[str, Any]:
        config = self._agent_config()
        if self.network is not None and config.get("kubeconfig"):
            # The API server is on this namespace's loopback: go through the network's relay.
            config["kubeconfig"] = str(
                self.network.write_kubeconfig(Path(config["kubeconfig"]), self.workdir / "netns.kubeconfig")
            )
        return config

    def _agent_config(self) -> dict[str, Any]:
        cert, key = self.pki.agent_certs(self.name, self.workdir / "tls", self.cert_validity)
        return {
            "node_name": self.name,
            "host_root": str(self.root),
            "grpc_listen": self.endpoint,
            "http_listen": f"{self.agent_host}:{self.http_port}",
            "tls_cert": str(cert),
            "tls_key": str(key),
            "tls_client_ca": str(self.pki.ca_file),
            "allowed_clients": [OPERATOR_IDENTITY],
            "pstate_counters": "files",  # the simulated hardware counters (rmd_sim.perf)
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
        if self.spec.resctrl_mounted:  # a node without resctrl (no RDT, or nobody mounted it) serves none
            if self.resctrl_process:
                await asyncio.to_thread(self._start_mount_process)
            else:
                await asyncio.to_thread(self.mount.start)
        if self.with_kubelet:
            self.kubelet = SimKubelet.from_host_tree(self.root, device_plugins=self.kubeconfig is not None)
            await self.kubelet.__aenter__()
        if self.kubelet is not None and self.kubeconfig is not None:
            api = await asyncio.to_thread(kubernetes.config.new_client_from_config, str(self.kubeconfig))
            self.kubelet_node = KubeletNode(self.kubelet, api, self.name, labels=self.labels)
            await self.kubelet_node.__aenter__()
        await self.start_agent()

    def _start_mount_process(self) -> None:
        with (self.workdir / "resctrl-mount.log").open("ab") as log:
            self.mount_process = subprocess.Popen(
                [sys.executable, "-m", "rmd_sim", "resctrl-mount", "--host-root", str(self.root)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not is_mounted(self.mount.mountpoint):
            if self.mount_process.poll() is not None or time.monotonic() > deadline:
                self._stop_mount_process()
                raise ResctrlMountError(
                    f"resctrl-mount of {self.name} did not mount {self.mount.mountpoint}; see its log "
                    f"{self.workdir / 'resctrl-mount.log'}"
                )
            time.sleep(0.02)

    def _stop_mount_process(self) -> None:
        proc, self.mount_process = self.mount_process, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()  # the command's handler unmounts before exiting
            try:
                proc.wait(MOUNT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if is_mounted(self.mount.mountpoint):  # killed, or crashed: the dead mount answers ENOTCONN
            unmount(self.mount.mountpoint, lazy=True)

    async def start_agent(self) -> None:
        config = self.workdir / "config.yaml"
        config.write_text(yaml.safe_dump(self.agent_config(), sort_keys=True))
        self.process = await asyncio.to_thread(self._spawn_agent, config)
        await self.wait_ready()

    def _spawn_agent(self, config: Path) -> subprocess.Popen[bytes]:
        prefix = self.network.exec_prefix() if self.network is not None else []
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                [*prefix, sys.executable, "-m", "rmd_agent", "serve", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def readyz(self) -> int:
        """The agent's /readyz status code (http.client: no *_PROXY applies to the agent's address)."""
        conn = http.client.HTTPConnection(self.agent_host, self.http_port, timeout=1)
        try:
            conn.request("GET", "/readyz")
            return conn.getresponse().status
        finally:
            conn.close()

    async def wait_ready(self, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise AgentProcessError(f"agent of {self.name} exited:\n{self.log_tail()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if await asyncio.to_thread(self.readyz) == 200:
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

    async def move_agent(self, network: AgentNetwork | None) -> None:
        """Restart the agent inside `network` (None: back in this process's network namespace). Its endpoint
        changes, and so does the one it publishes in its RmdNodeState. The caller owns `network`."""
        await self.stop_agent()
        self.network = network
        await self.start_agent()

    async def stop(self) -> None:
        await self.stop_agent()
        if self.kubelet_node is not None:
            await self.kubelet_node.__aexit__(None, None, None)
            self.kubelet_node = None
        if self.kubelet is not None:
            await self.kubelet.__aexit__(None, None, None)
            self.kubelet = None
        await asyncio.to_thread(self.mount.stop)
        await asyncio.to_thread(self._stop_mount_process)

    def channel(self) -> grpc.aio.Channel:
        """A channel to this node's agent with the operator's client certificate."""
        return grpc.aio.secure_channel(
            self.endpoint, self.pki.channel_credentials(), options=self.channel_options()
        )

    def channel_options(self) -> list[tuple[str, Any]]:
        """Options of a channel to this agent as the operator: its identity checked, never through a proxy."""
        return [("grpc.ssl_target_name_override", f"rmd-agent.{self.name}"), ("grpc.enable_http_proxy", 0)]

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
