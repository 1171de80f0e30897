"""A real Kubernetes node for tests: Debian's containerd and runc plus the kubelet built by
tools/build-binaries.sh, joined to a test control plane (reference: real-kubelet.md).

    with RealNode(control_plane, workdir, "real-node-1") as node:
        node.import_images([...])
        ...  # pods bound to node.name really run
        node.restart_kubelet()

Layout. The node lives in a network namespace of its own (rmd_sim.netns.AgentNetwork): containerd, the
kubelet, the CNI bridge of its pods and the iptables rules the kubelet writes stay there. Its pods reach the
API server at the `kubernetes` Service address (10.0.0.1:443), which the namespace forwards to the API
server's relay (what kube-proxy would do); the kubelet uses the relay directly. The kubelet's root
directory is the real /var/lib/kubelet (its device-plugin socket directory cannot move); everything else
stays under `workdir`:

    containerd/{root,state,config.toml,containerd.sock}   containerd's own root, state and socket
    pod-logs/  cni/  logs/{containerd,kubelet}.log       pod logs, CNI config and leases, component logs

The kubelet runs the static CPU manager with CPU 0 reserved (systemReserved cpu 100m), the topology
manager `single-numa-node` (scope container), and device plugins; the configuration files of containerd,
CNI and the kubelet are rmd_sim.realnode.configs'. Whatever it changes on the host itself
(sysctls, kubepods cgroups, mounts, /var/lib/kubelet, /var/log/containers) is recorded before the start
and undone by `stop()` or by an interrupted run's successor (`host_state.restore_stale`), and checked by
`host_differences()`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from rmd_sim.control_plane import (
    KUBERNETES_SERVICE_IP,
    BinariesNotFound,
    ControlPlane,
    ManagedProcess,
    find_bin_dir,
)
from rmd_sim.netns import AgentNetwork, can_create_namespaces
from rmd_sim.realnode import configs, host_state, images
from rmd_sim.realnode.configs import CNI_BIN_DIR, POD_SUBNET

REQUIRED_PROGRAMS = ("containerd", "runc", "ctr", "iptables", "nsenter")


class RealNodeError(RuntimeError):
    """The real node could not start or do what was asked; the message says why (with log tails)."""


def unavailable_reason() -> str | None:
    """Why a real node cannot run on this machine (not root, programs missing), or None when it can."""
    if reason := can_create_namespaces():
        return reason
    missing = [p for p in REQUIRED_PROGRAMS if shutil.which(p) is None]
    if not (CNI_BIN_DIR / "bridge").exists():
        missing.append("containernetworking-plugins")
    missing += images.missing_tools()
    if missing:
        return f"missing: {', '.join(sorted(set(missing)))} (./dev installs them as root)"
    return None


def binaries_or_reason() -> tuple[Path | None, str]:
    """(the binary directory, "") when this machine can run a real node, else (None, why not)."""
    try:
        bin_dir = find_bin_dir()
    except BinariesNotFound as exc:
        return None, str(exc)
    reason = unavailable_reason()
    return (None, reason) if reason else (bin_dir, "")


def _wait(what: str, ready: Any, timeout: float, logs: Iterable[ManagedProcess] = ()) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for proc in logs:
            if proc.returncode() is not None:
                raise RealNodeError(f"{proc.name} exited while waiting for {what}:\n{proc.log_tail()}")
        with contextlib.suppress(Exception):
            if ready():
                return
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}:\n{p.log_tail(20)}" for p in logs)
            raise RealNodeError(f"timed out after {timeout:g}s waiting for {what}\n{tails}")
        time.sleep(0.2)


class RealNode:
    def __init__(
        self,
        control_plane: ControlPlane,
        workdir: Path,
        name: str = "real-node-1",
        *,
        feature_gates: Mapping[str, bool] | None = None,
        system_reserved_cpu: str = "100m",
    ) -> None:
        self.control_plane = control_plane
        self.workdir = Path(workdir).resolve()
        self.name = name
        self.feature_gates = dict(feature_gates or {})
        self.kubelet_binary = "kubelet"  # in the control plane's binary directory
        self.kubelet_started = 0.0  # time.monotonic() when the current kubelet process was started
        self.system_reserved_cpu = system_reserved_cpu
        self.reserved_cpus = "0"  # what the static policy reserves for system_reserved_cpu up to 1000m
        self.kubelet_dir = host_state.KUBELET_DIR  # fixed: the device plugin socket directory lives there
        self.kubelet_config = self.kubelet_dir / "config.yaml"
        self.pod_logs_dir = self.workdir / "pod-logs"
        self.logs_dir = self.workdir / "logs"
        self.containerd_address = str(self.workdir / "containerd" / "containerd.sock")
        self.network: AgentNetwork | None = None
        self.containerd: ManagedProcess | None = None
        self.kubelet: ManagedProcess | None = None
        self._snapshot: host_state.HostSnapshot | None = None
        self.sandbox_image = ""
        self.simulated_host = self.workdir / "host"  # where RealStack writes the simulated hardware

    # -- lifecycle

    def prepare(self) -> None:
        """Clean up after an interrupted run, record the host as found, and make the work directory a
        shared mount (as / is on a systemd host): mounts made under it later, such as a simulated host's FUSE
        resctrl, reach containers that mount it with HostToContainer propagation. Idempotent; start() calls
        it."""
        if self._snapshot is not None:
            return
        if reason := unavailable_reason():
            raise RealNodeError(f"a real node cannot run here: {reason}")
        host_state.restore_stale(self.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        host_state.unmount_all(self.workdir)
        for sub in ("containerd", "pod-logs", "cni", "logs"):
            path = self.workdir / sub
            if path.exists() and sub != "logs":
                shutil.rmtree(path)
            path.mkdir(parents=True, exist_ok=True)
        self._snapshot = host_state.HostSnapshot.take(self.workdir, self.containerd_address)
        self._snapshot.set_aside_kubelet_dir()
        self._snapshot.save(self.name)
        subprocess.run(["mount", "--bind", str(self.workdir), str(self.workdir)], check=True)
        subprocess.run(["mount", "--make-rshared", str(self.workdir)], check=True)

    def start(self, sandbox_image: str, timeout: float = 60.0) -> Self:
        """Start containerd and the kubelet; returns when the Node is Ready. The sandbox image is loaded into
        containerd before the kubelet starts."""
        self.sandbox_image = sandbox_image
        try:
            self.prepare()
            apiserver_port = int(self.control_plane.server_url.rsplit(":", 1)[1])
            self.network = AgentNetwork(self.name, api_server=("127.0.0.1", apiserver_port)).create()
            self._setup_network()
            self._start_containerd(timeout)
            images.import_images([sandbox_image], self.containerd_address)
            self._write_kubelet_files()
            self.start_kubelet(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the kubelet, containerd and every container; put the host back as it was. Idempotent."""
        self.stop_kubelet()
        if self.containerd is not None:
            self.containerd.stop()
            self.containerd = None
        if self._snapshot is not None:
            self._snapshot.restore()
        if self.network is not None:
            self.network.destroy()
            self.network = None
        if self._snapshot is not None:
            self._snapshot.forget(self.name)

    def host_differences(self) -> list[str]:
        """What the node left changed on the host (empty after a clean stop)."""
        return self._snapshot.differences() if self._snapshot is not None else []

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the kubelet

    def start_kubelet(
        self,
        timeout: float = 60.0,
        *,
        feature_gates: Mapping[str, bool] | None = None,
        binary: str | None = None,
    ) -> None:
        """Start (or start again) the kubelet; returns once the Node is Ready by the new kubelet's status.
        `binary` names another kubelet in the binary directory (e.g. "kubelet-1.33", an older release) and
        `feature_gates` replaces the gates; both stay for later restarts."""
        assert self.network is not None, "start() first"
        if binary is not None:
            self.kubelet_binary = binary
        if feature_gates is not None and feature_gates != self.feature_gates:
            self.feature_gates = dict(feature_gates)
            self._write_kubelet_files()
        started = time.time()
        argv = [
            *self.network.exec_prefix(),
            str(self.control_plane.bin_dir / self.kubelet_binary),
            f"--config={self.kubelet_config}",
            f"--kubeconfig={self.workdir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.kubelet_dir}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.network.address}",
            "--v=1",
        ]
        self.kubelet = ManagedProcess("kubelet", argv, self.logs_dir / "kubelet.log")
        self.kubelet_started = time.monotonic()
        self.kubelet.start()
        _wait(f"Node {self.name} Ready", lambda: self._ready_since(started), timeout, [self.kubelet])

    def stop_kubelet(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
            self.kubelet = None

    def restart_kubelet(
        self,
        timeout: float = 60.0,
        *,
        feature_gates: Mapping[str, bool] | None = None,
        binary: str | None = None,
    ) -> None:
        self.stop_kubelet()
        self.start_kubelet(timeout, feature_gates=feature_gates, binary=binary)

    def _ready_since(self, started: float) -> bool:
        out = self.control_plane.kubectl("get", "node", self.name, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        for condition in json.loads(out.stdout)["status"].get("conditions", []):
            if condition["type"] == "Ready":
                heartbeat = condition.get("lastHeartbeatTime", "")
                fresh = time.strptime(heartbeat, "%Y-%m-%dT%H:%M:%SZ") if heartbeat else None
                recent = fresh is not None and time.mktime(fresh) - time.timezone >= int(started) - 1
                return bool(condition["status"] == "True" and recent)
        return False

    # -- images

    def import_images(self, tags: Iterable[str]) -> None:
        images.import_images(tags, self.containerd_address)

    # -- setup steps

    def _in_netns(self, *cmd: str) -> None:
        assert self.network is not None
        result = subprocess.run(
            [*self.network.exec_prefix(), *cmd], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise RealNodeError(f"{' '.join(cmd)} failed in the node's namespace: {result.stderr.strip()}")

    def _setup_network(self) -> None:
        """Route the Service range to this side and forward the API server's Service address to its relay."""
        net = self.network
        assert net is not None and net.relay is not None
        relay = f"{net.host_address}:{net.relay.port}"
        self._in_netns("ip", "route", "add", "10.0.0.0/24", "via", net.host_address)
        self._in_netns("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
        for chain in ("OUTPUT", "PREROUTING"):
            self._in_netns(
                "iptables", "-t", "nat", "-A", chain, "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp",
                "--dport", "443", "-j", "DNAT", "--to-destination", relay,
            )  # fmt: skip
        # Pods' packets leave with the node's address (this side has no route back to the pod subnet).
        self._in_netns(
            "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", POD_SUBNET, "-o", "eth0", "-j", "MASQUERADE"
        )
        net.write_kubeconfig(self.control_plane.kubeconfig, self.workdir / "kubelet.kubeconfig")
        conflist = configs.cni_conflist(self.workdir / "cni" / "ipam")
        (self.workdir / "cni" / "conf").mkdir(parents=True, exist_ok=True)
        (self.workdir / "cni" / "conf" / "10-rmd.conflist").write_text(json.dumps(conflist, indent=2))

    def _start_containerd(self, timeout: float) -> None:
        assert self.network is not None
        base = self.workdir / "containerd"
        config = configs.containerd_config(
            base, self.containerd_address, self.sandbox_image, self.workdir / "cni" / "conf"
        )
        (base / "config.toml").write_text(config)
        argv = [*self.network.exec_prefix(), "containerd", f"--config={base / 'config.toml'}"]
        self.containerd = ManagedProcess("containerd", argv, self.logs_dir / "containerd.log")
        self.containerd.start()

        def serving() -> bool:
            probe = ["ctr", "--address", self.containerd_address, "version"]
            return subprocess.run(probe, capture_output=True, timeout=5, check=False).returncode == 0

        _wait("containerd", serving, timeout, [self.containerd])

    def kubelet_configuration(self) -> dict[str, Any]:
        """The KubeletConfiguration this node runs (reference: real-kubelet.md, "Kubelet configuration")."""
        return configs.kubelet_configuration(
            # Inside the node's namespace: the API server reaches it there (logs, exec) through the veth.
            address=self.network.address if self.network else "127.0.0.1",
            client_ca_file=self.control_plane.pki_dir / "ca.crt",
            containerd_address=self.containerd_address,
            system_reserved_cpu=self.system_reserved_cpu,
            pod_logs_dir=self.pod_logs_dir,
            feature_gates=self.feature_gates,
        )

    def _write_kubelet_files(self) -> None:
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        self.kubelet_config.write_text(yaml.safe_dump(self.kubelet_configuration(), sort_keys=False))
