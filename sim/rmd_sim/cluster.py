"""A whole simulated cluster: the real control plane, simulated nodes (each with a simulated kubelet joined to
the API server and a real agent process), and the real operator process. End-to-end tests, benchmarks and
the demo build on it.

    async with SimCluster(workdir, nodes=["worker-node-1", "worker-node-2"]) as cluster:
        cluster.kubectl("apply", "-f", "examples/")
        ...

`isolate_node(name)` moves a node's agent into a network namespace of its own (`rmd_sim.netns`), whose link a
test can cut and restore; `rejoin_node(name)` brings it back. `stop()` undoes both. `add_node(name, spec)`
joins one more node, of a spec of its own (e.g. without RDT), while the cluster runs; `remove_node(name)`
takes it out again, Node object included.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Self

import kubernetes
import yaml

from rmd_api.node_state import lease_name
from rmd_sim.control_plane import DEFAULT_CONTROLLERS, ControlPlane, find_bin_dir, repo_root
from rmd_sim.netns import SUBNET, AgentNetwork
from rmd_sim.netutil import free_port
from rmd_sim.node import ClusterPki, SimNode
from rmd_sim.spec import NodeSpec

RDT_LABEL = "feature.node.kubernetes.io/cpu-rdt.RDTL3CA"  # what node-feature-discovery sets
# Deployments and their ReplicaSets, so tests see what a controller does with a pod that is refused. Not the
# node lifecycle controller: it would evict the pods of simulated nodes, which renew no Lease.
CONTROLLERS = (*DEFAULT_CONTROLLERS, "deployment-controller", "replicaset-controller")
SYSTEM_NAMESPACE = "rmd-system"


def _delete_if_present(delete: Callable[..., Any], *args: str) -> None:
    try:
        delete(*args)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise


class OperatorProcessError(RuntimeError):
    """The operator exited or did not become live; the message ends with its log."""


class SimCluster:
    def __init__(
        self,
        workdir: Path,
        *,
        nodes: Iterable[str] = ("worker-node-1", "worker-node-2", "worker-node-3"),
        spec: NodeSpec | None = None,
        labels: Mapping[str, str] | None = None,
        control_plane: ControlPlane | None = None,
        operator_settings: Mapping[str, Any] | None = None,
        agent_settings: Mapping[str, Any] | None = None,
        resctrl_process: bool = False,
    ) -> None:
        self.workdir = workdir
        self.node_names = list(nodes)
        self.spec = spec or NodeSpec.default()
        self.labels = {RDT_LABEL: "true", **(labels or {})}
        self._own_control_plane = control_plane is None
        self.control_plane = control_plane
        self.operator_settings = dict(operator_settings or {})
        self.agent_settings = dict(agent_settings or {})
        self.resctrl_process = resctrl_process  # each node's FUSE resctrl in its own process (SimNode)
        self.pki = ClusterPki(workdir / "pki")
        self.nodes: dict[str, SimNode] = {}
        self.operator: subprocess.Popen[bytes] | None = None
        self.operator_log = workdir / "operator.log"
        self.liveness_port = free_port()
        self.networks: dict[str, AgentNetwork] = {}  # node -> the network namespace its agent runs in

    @property
    def kubeconfig(self) -> Path:
        assert self.control_plane is not None, "start() first"
        return self.control_plane.kubeconfig

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient with admin rights."""
        assert self.control_plane is not None, "start() first"
        return self.control_plane.api_client()

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.control_plane is not None, "start() first"
        return self.control_plane.kubectl(*args, check=check)

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Each simulated kubelet keeps a blocking pod watch in a worker thread; with asyncio's default pool
        # (min(32, cpus + 4) threads) a large cluster would leave no thread for anything else.
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=16 + 4 * len(self.node_names))
        )
        if self.control_plane is None:
            crds = sorted((repo_root() / "crds").glob("*.yaml"))
            # Started in this (long-lived) thread: its components die with the thread that started them.
            self.control_plane = ControlPlane(
                find_bin_dir(),
                self.workdir / "control-plane",
                crds=crds,
                controllers=CONTROLLERS,
                scheduler=True,
            )
            self.control_plane.start()
        with self.api_client() as api, contextlib.suppress(kubernetes.client.ApiException):
            kubernetes.client.CoreV1Api(api).create_namespace(
                kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name=SYSTEM_NAMESPACE))
            )
        for name in self.node_names:
            self.nodes[name] = self._new_node(name, self.spec)
        await asyncio.gather(*(node.start() for node in self.nodes.values()))
        await self.start_operator()

    def _new_node(self, name: str, spec: NodeSpec) -> SimNode:
        return SimNode(
            name,
            self.workdir / name,
            self.pki,
            spec=spec,
            kubeconfig=self.kubeconfig,
            labels=self.labels,
            node_state_namespace=SYSTEM_NAMESPACE,
            agent_settings=self.agent_settings,
            resctrl_process=self.resctrl_process,
        )

    async def add_node(self, name: str, spec: NodeSpec | None = None) -> SimNode:
        """Join node `name` (of `spec`, else the cluster's) to the running cluster: its kubelet registers the
        Node, its agent publishes its objects."""
        if name in self.nodes:
            raise ValueError(f"node {name} is already in the cluster")
        node = self._new_node(name, spec or self.spec)
        self.nodes[name] = node
        try:
            await node.start()
        except BaseException:
            del self.nodes[name]
            await node.stop()
            raise
        self.node_names.append(name)
        return node

    async def remove_node(self, name: str) -> None:
        """Stop node `name` and delete its Node (the garbage collector deletes the objects it owns: its
        RmdNodeState and NodeResourceTopology) and its agent's heartbeat Lease, which has no owner."""
        node = self.nodes.pop(name)
        self.node_names.remove(name)
        await node.stop()

        def delete() -> None:
            with self.api_client() as api:
                core, leases = kubernetes.client.CoreV1Api(api), kubernetes.client.CoordinationV1Api(api)
                _delete_if_present(core.delete_node, name)
                _delete_if_present(leases.delete_namespaced_lease, lease_name(name), SYSTEM_NAMESPACE)

        await asyncio.to_thread(delete)

    def operator_config(self) -> dict[str, Any]:
        return {
            "agent_ca": str(self.pki.ca_file),
            "client_cert": str(self.pki.client_cert),
            "client_key": str(self.pki.client_key),
            "node_state_namespace": SYSTEM_NAMESPACE,
            "liveness_listen": f"127.0.0.1:{self.liveness_port}",
            **self.operator_settings,
        }

    async def start_operator(self) -> None:
        config = self.workdir / "operator.yaml"
        config.write_text(yaml.safe_dump(self.operator_config(), sort_keys=True))
        # Agents in network namespaces of their own are dialled at addresses of SUBNET: never via a proxy.
        no_proxy = f"127.0.0.1,localhost,{SUBNET}"
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "NO_PROXY": no_proxy, "no_proxy": no_proxy}
        self.operator = await asyncio.to_thread(self._spawn_operator, config, env)
        await self._wait_operator_live()

    def _spawn_operator(self, config: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with self.operator_log.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "rmd_operator", "run", "--standalone", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    async def _wait_operator_live(self, within: float = 60.0) -> None:
        url = f"http://127.0.0.1:{self.liveness_port}/healthz"
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.operator is None or self.operator.poll() is not None:
                raise OperatorProcessError(f"operator exited:\n{self.operator_log_tail()}")
            with contextlib.suppress(OSError):
                if await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=1).status) == 200:
                    return
            await asyncio.sleep(0.2)
        raise OperatorProcessError(f"operator not live after {within:.0f}s:\n{self.operator_log_tail()}")

    def save_logs(self, dest: Path) -> None:
        """Copy the operator's, every agent's and the control plane's logs into `dest` (emptied first), for a
        failed test's artifacts."""
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            shutil.copy(self.operator_log, dest / "operator.log")
        for name, node in self.nodes.items():
            with contextlib.suppress(OSError):
                shutil.copy(node.log_path, dest / f"agent-{name}.log")
        if self.control_plane is not None:
            with contextlib.suppress(Exception):
                self.control_plane.save_logs(dest / "control-plane")

    def operator_log_tail(self, lines: int = 40) -> str:
        if not self.operator_log.exists():
            return "(no log)"
        return "\n".join(self.operator_log.read_text(errors="replace").splitlines()[-lines:])

    async def stop_operator(self, sig: int = signal.SIGTERM, grace: float = 20.0) -> None:
        """Stop the operator (SIGKILL simulates a crash)."""
        proc, self.operator = self.operator, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            await asyncio.to_thread(proc.wait, grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait)

    def _api_server(self) -> tuple[str, int]:
        url = urllib.parse.urlsplit(self.control_plane.server_url if self.control_plane else "")
        assert url.hostname and url.port, "start() first"
        return url.hostname, url.port

    async def isolate_node(self, name: str) -> AgentNetwork:
        """Restart the node's agent in a network namespace of its own (NetnsUnavailable without the
        privileges). The operator finds its new endpoint in its RmdNodeState."""
        node = self.nodes[name]
        if name in self.networks:
            return self.networks[name]
        network = await asyncio.to_thread(AgentNetwork(name, api_server=self._api_server()).create)
        self.networks[name] = network
        await node.move_agent(network)
        return network

    async def rejoin_node(self, name: str) -> None:
        """Restart the node's agent back in this network namespace and delete the one it had."""
        network = self.networks.pop(name, None)
        if network is None:
            return
        try:
            await self.nodes[name].move_agent(None)
        finally:
            await asyncio.to_thread(network.destroy)

    async def stop(self) -> None:
        await self.stop_operator()
        await asyncio.gather(*(node.stop() for node in self.nodes.values()), return_exceptions=True)
        for network in self.networks.values():  # after the agents inside them stopped
            await asyncio.to_thread(network.destroy)
        self.networks.clear()
        if self._own_control_plane and self.control_plane is not None:
            self.control_plane.stop()
            self.control_plane = None

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
