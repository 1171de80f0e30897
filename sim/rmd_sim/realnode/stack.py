"""The product installed on a real node the way a user installs it: images built from the Containerfiles and
imported into the node's containerd, then `helm install` of charts/rmd with the real helm.

    with RealStack(bin_dir, workdir) as stack:     # control plane, simulated hardware, real node, chart
        stack.kubectl("get", "pods", "-A")

Only the hardware this machine lacks is simulated: the agent pod gets the simulated host's sys/ and proc/
(agent.hostPaths.simulatedHost, test only) and the node's real kubelet directory, pod logs and cgroups.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import yaml

from rmd_api.names import CACHE_WAYS_RESOURCE as CACHE_WAYS
from rmd_sim.control_plane import REAL_NODE_CONTROLLERS, ControlPlane, repo_root
from rmd_sim.realnode import images
from rmd_sim.realnode.node import RealNode, RealNodeError
from rmd_sim.realnode.simhost import SimulatedHost

log = logging.getLogger(__name__)

RELEASE = "rmd"
RELEASE_NAMESPACE = "rmd-system"
T = TypeVar("T")
Obj = dict[str, Any]


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.5) -> T:
    """Poll until `probe` returns something truthy; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = probe()
        except Exception as exc:  # a probe may fail while things settle; report the last failure
            last = exc
        else:
            if result:
                return result
            last = result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


class RealStack:
    """Control plane + simulated hardware + real node + the chart installed. `start()`/`stop()`."""

    def __init__(self, bin_dir: Path, workdir: Path, node_name: str = "real-node-1") -> None:
        self.repo = repo_root()
        self.workdir = Path(workdir)
        self.control_plane = ControlPlane(
            bin_dir,
            self.workdir / "cp",
            crds=sorted((self.repo / "crds").glob("*.yaml")),
            controllers=REAL_NODE_CONTROLLERS,
            scheduler=True,
        )
        self.node = RealNode(self.control_plane, self.workdir / "node", node_name)
        self.host = SimulatedHost(self.node.simulated_host)
        self.image_tags: dict[str, str] = {}
        self.installed = False

    # -- lifecycle

    def start(self, *, install: bool = True) -> Self:
        started = time.monotonic()
        try:
            tags = {
                "pause": images.pause_image(),
                "busybox": images.busybox_image(),
                "agent": images.product_image("agent", self.repo),
                "operator": images.product_image("operator", self.repo),
            }
            self.image_tags = tags
            log.info("images ready after %.0fs", time.monotonic() - started)
            self.control_plane.start()
            self.node.prepare()  # the simulated host lives in the node's shared work directory
            self.host.start()
            self.node.start(tags["pause"])
            self.node.import_images([tags["busybox"], tags["agent"], tags["operator"]])
            log.info("node %s ready after %.0fs", self.node.name, time.monotonic() - started)
            if install:
                self.install()
                log.info("chart installed and Ready after %.0fs", time.monotonic() - started)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.installed:
            self.helm(
                "uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait", "--timeout", "60s", check=False
            )
            self.installed = False
        self.node.stop()  # its containers gone, the simulated host's resctrl has no users left
        self.host.stop()
        self.control_plane.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the chart

    def values(self) -> dict[str, Any]:
        """Helm values for this node: local images (never pulled), the node's paths, the simulated host."""
        node = self.node
        repository, _, tag = self.image_tags["agent"].rpartition(":")
        op_repository, _, op_tag = self.image_tags["operator"].rpartition(":")
        return {
            "image": {"pullPolicy": "Never"},
            "agent": {
                "image": {"repository": repository, "tag": tag},
                "nodeSelector": {"kubernetes.io/hostname": node.name},
                "hostPaths": {
                    "kubeletDir": str(node.kubelet_dir),
                    "kubeletConfig": str(node.kubelet_config),
                    "stateDir": str(node.workdir / "agent-state"),
                    "podLogsDir": str(node.pod_logs_dir),
                    "simulatedHost": str(self.host.root),
                },
                "settings": {"log_format": "json", "log_level": "debug"},
            },
            "operator": {"image": {"repository": op_repository, "tag": op_tag}},
            # The control plane applied every crds/*.yaml already, wao-core's two included; the chart would
            # refuse to take over CRDs it did not create (docs/telemetry.md).
            "nodeTelemetry": {"installCRDs": False},
        }

    def install(self, timeout: str = "300s") -> None:
        values = self.workdir / "values.yaml"
        values.write_text(yaml.safe_dump(self.values(), sort_keys=False))
        chart = str(self.repo / "charts" / "rmd")
        result = self.helm(
            "install", RELEASE, chart, "-n", RELEASE_NAMESPACE, "--create-namespace", "-f", str(values),
            "--wait", "--timeout", timeout, check=False,
        )  # fmt: skip
        self.installed = True
        if result.returncode != 0:
            raise RealNodeError(f"helm install failed: {result.stderr.strip()}\n{self.describe_pods()}")
        # helm's --wait counts a DaemonSet ready while maxUnavailable pods are not: wait for every pod.
        self.wait_pods_ready()
        # and for the Node to offer the agent's cache ways (the kubelet's next status after the registration)
        wait_for(f"Node {self.node.name} to offer {CACHE_WAYS}", self.node_cache_ways, timeout=60)

    def node_cache_ways(self) -> int:
        """The Node's allocatable cache ways (0 while it shows none)."""
        node = self.get_json("node", self.node.name) or {}
        return int(node.get("status", {}).get("allocatable", {}).get(CACHE_WAYS, "0"))

    def wait_pods_ready(self, namespace: str = RELEASE_NAMESPACE, timeout: str = "180s") -> None:
        waited = self.kubectl(
            "wait",
            "pods",
            "--all",
            "-n",
            namespace,
            "--for=condition=Ready",
            f"--timeout={timeout}",
            check=False,
        )
        if waited.returncode != 0:
            raise RealNodeError(
                f"pods in {namespace} not Ready: {waited.stderr.strip()}\n{self.describe_pods()}"
            )

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [
            str(self.control_plane.bin_dir / "helm"),
            f"--kubeconfig={self.control_plane.kubeconfig}",
            *args,
        ]
        return subprocess.run(
            cmd, capture_output=True, text=True, check=check, timeout=600, env=self.control_plane.env()
        )

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.control_plane.kubectl(*args, check=check)

    # -- what the tests and the demo run there

    def create_namespace(self, name: str) -> None:
        """Create it and wait for what its pods mount: the kube-root-ca.crt ConfigMap and the default
        ServiceAccount. (A pod created sooner can find its projected token volume "not registered" in the
        kubelet, which then retries with a backoff that grows past a minute.)"""
        self.kubectl("create", "namespace", name)
        wait_for(
            f"namespace {name} ready for pods",
            lambda: (
                self.get_json("configmap", "-n", name, "kube-root-ca.crt")
                and self.get_json("serviceaccount", "-n", name, "default")
            ),
            timeout=30,
        )

    def delete_namespace(self, name: str, timeout: float = 120.0) -> None:
        """Delete it and wait until it is gone: its pods terminated, their CPUs and devices free again."""
        self.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")
        wait_for(f"namespace {name} gone", lambda: self.get_json("namespace", name) is None, timeout=timeout)

    def container(self, name: str, resources: dict[str, str], limits: dict[str, str] | None = None) -> Obj:
        """A busybox container that sleeps (the local image, never pulled); limits default to resources."""
        return {
            "name": name,
            "image": self.image_tags["busybox"],
            "imagePullPolicy": "Never",
            "command": ["sleep", "3600"],
            "resources": {"requests": resources, "limits": resources if limits is None else limits},
        }

    def pod(
        self, name: str, namespace: str, *containers: Obj, init: tuple[Obj, ...] = (), **meta: Any
    ) -> Obj:
        spec: Obj = {"terminationGracePeriodSeconds": 1, "containers": list(containers)}
        if init:
            spec["initContainers"] = list(init)
        metadata = {"name": name, "namespace": namespace, **meta}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}

    def cache_pod(self, name: str, namespace: str, *, ways: int = 2) -> Obj:
        """The seed's pod (pod-guaranteed-cache.yaml): Guaranteed, whole CPUs, the ways as a limit, and its
        `<container>_cache_min` annotation; one CPU, as this node has one to give."""
        resources = {"cpu": "1", "memory": "64Mi", CACHE_WAYS: str(ways)}
        return self.pod(
            name, namespace, self.container("app", resources), annotations={"app_cache_min": str(ways)}
        )

    def wait_nothing_held(self, timeout: float = 60.0) -> None:
        """Wait until the node's NodeResourceTopology shows every exclusive CPU and cache way free again.

        A test that measures what a pod takes starts from here: what an earlier test held (its pods deleted,
        its kubelet restarted) is released and published a moment later, and a baseline read before that is
        wrong for good."""

        def free() -> bool:
            nrt = self.get_json("noderesourcetopology", self.node.name)
            found = {
                r["name"]: r
                for zone in (nrt or {}).get("zones", [])
                for r in zone["resources"]
                if r["name"] in ("cpu", CACHE_WAYS)
            }
            # A kubelet that has just restarted offers no ways until the plugin registers again: zero of zero
            # free is no baseline.
            ways = self.node_cache_ways()
            return (
                len(found) == 2
                and all(r["available"] == r["allocatable"] for r in found.values())
                and ways > 0
                and int(found[CACHE_WAYS]["allocatable"]) == ways
            )

        wait_for("every exclusive CPU and cache way free in the NodeResourceTopology", free, timeout)

    def workload_entry(self, namespace: str, name: str) -> Obj:
        """This node's entry in the RmdWorkload's status ({} while there is none)."""
        workload = self.get_json("rmdworkload", "-n", namespace, name) or {}
        states = (workload.get("status") or {}).get("workloadStates") or {}
        entry: Obj = states.get(self.node.name) or {}
        return entry

    def wait_applied(self, namespace: str, name: str, timeout: float = 90.0) -> Obj:
        """Wait until this node's agent applied the RmdWorkload (entry Successful); returns the entry."""

        def applied() -> Obj | None:
            entry = self.workload_entry(namespace, name)
            return entry if entry.get("status") == "Successful" else None

        return wait_for(f"RmdWorkload {namespace}/{name} Successful on {self.node.name}", applied, timeout)

    def get_json(self, *args: str) -> Any:
        """`kubectl get ... -o json`, parsed; None when the object does not exist."""
        out = self.kubectl("get", *args, "-o", "json", check=False)
        if out.returncode != 0:
            if "NotFound" in out.stderr:
                return None
            raise RealNodeError(out.stderr)
        return json.loads(out.stdout)

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """`kubectl create` of one object; returns it as created."""
        path = self.workdir / f"manifest-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(manifest))
        created: dict[str, Any] = json.loads(self.kubectl("create", "-f", str(path), "-o", "json").stdout)
        path.unlink()
        return created

    def describe_pods(self, namespace: str = RELEASE_NAMESPACE) -> str:
        """Each pod's phase, container states and last log lines (what a user would look at)."""
        pods = json.loads(self.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
        lines = []
        for pod in pods:
            name = pod["metadata"]["name"]
            lines.append(
                f"{name}: {pod['status'].get('phase')} {json.dumps(pod['status'].get('containerStatuses'))}"
            )
            logs = self.kubectl("logs", "-n", namespace, name, "--tail=15", "--all-containers", check=False)
            lines.append(logs.stdout + logs.stderr)
        events = self.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)
        return "\n".join([*lines, events.stdout])
