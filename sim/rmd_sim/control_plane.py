"""A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) on loopback.

End-to-end tests and the demo talk to real API semantics: CRD validation, RBAC, resourceVersions, watches,
and, because kube-controller-manager runs, garbage collection of ownerReferences and namespace deletion.
The binaries come from tools/build-binaries.sh. Every component runs in its own process group, is stopped
with SIGTERM then SIGKILL, and is killed by the kernel if this process dies without cleaning up. This
module runs them and issues the certificates and kubeconfigs; the flags of each component and its
readiness probe are in rmd_sim.control_plane_components.

    with ControlPlane(find_bin_dir(), workdir) as cp:
        core = kubernetes.client.CoreV1Api(cp.api_client())
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import ctypes
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import kubernetes
import yaml
from kubernetes.client.exceptions import ApiException

from rmd_sim import control_plane_components as components
from rmd_sim import pki
from rmd_sim.control_plane_components import Component

REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
CLUSTER_NAME = "rmd-test"
ADMIN_USER = "rmd-admin"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"  # the first address of the range: the API server's own Service
IN_CLUSTER_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc")
# Garbage collection and namespace deletion are what envtest-style setups lack; the service-account
# controller creates each namespace's "default" ServiceAccount, which the (enabled) ServiceAccount admission
# plugin requires before any Pod can be created. Names from `kube-controller-manager --help`.
DEFAULT_CONTROLLERS = ("garbage-collector-controller", "namespace-controller", "serviceaccount-controller")
# What pods on a real kubelet need on top (reference: real-kubelet.md): kube-root-ca.crt in every namespace
# (the projected service-account volume mounts it), the not-ready taint of a new Node removed, and the
# workload controllers of the chart's own pods.
REAL_NODE_CONTROLLERS = (
    *DEFAULT_CONTROLLERS,
    "root-ca-certificate-publisher-controller",
    "node-lifecycle-controller",
    "daemonset-controller",
    "deployment-controller",
    "replicaset-controller",
)
CRD_FIELD_MANAGER = "rmd-control-plane"

_STOP_GRACE_SECONDS = 10.0
_POLL_SECONDS = 0.1


class BinariesNotFound(RuntimeError):
    """The control-plane binaries are not built (or RMD_BIN_DIR points at an incomplete directory)."""


class ControlPlaneError(RuntimeError):
    """A component failed to start, died, or an operation on the control plane failed."""


def repo_root() -> Path:
    """The source checkout this module lives in (sim/rmd_sim/control_plane.py -> repository root)."""
    return Path(__file__).resolve().parents[2]


def _missing_binaries(bin_dir: Path) -> list[str]:
    return [name for name in REQUIRED_BINARIES if not os.access(bin_dir / name, os.X_OK)]


def find_bin_dir() -> Path:
    """Directory with the control-plane binaries: $RMD_BIN_DIR, else what tools/build-binaries.sh built."""
    from_env = os.environ.get("RMD_BIN_DIR")
    if from_env:
        bin_dir = Path(from_env)
        if missing := _missing_binaries(bin_dir):
            raise BinariesNotFound(f"RMD_BIN_DIR={bin_dir} lacks {', '.join(missing)}")
        return bin_dir
    script = repo_root() / "tools" / "build-binaries.sh"
    hint = "run tools/build-binaries.sh (a cold build takes tens of minutes) or set RMD_BIN_DIR"
    if not script.is_file():
        raise BinariesNotFound(f"{script} not found (not a source checkout?): {hint}")
    try:
        result = subprocess.run(
            [str(script), "--print"], capture_output=True, text=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BinariesNotFound(f"{script} --print failed ({exc}): {hint}") from exc
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise BinariesNotFound(f"control-plane binaries are not built: {hint} ({result.stderr.strip()})")
    bin_dir = Path(lines[-1])
    if missing := _missing_binaries(bin_dir):
        raise BinariesNotFound(f"{bin_dir} lacks {', '.join(missing)}: {hint}")
    return bin_dir


def _free_loopback_ports(count: int) -> list[int]:
    """Ports free right now; every socket stays open until all are chosen, so the ports differ."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


# --- processes --------------------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _child_setup(parent_pid: int) -> Callable[[], None]:
    """Runs in the child between fork and exec: die with the parent even if it is SIGKILLed.

    PDEATHSIG fires when the *thread* that forked exits, so start control planes from a long-lived thread
    (pytest fixtures and the CLI run in the main thread).
    """

    def setup() -> None:
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return setup


class ManagedProcess:
    """One component: started in its own process group, output appended to its log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self._log.write(f"### {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self._popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Only a prctl and a getppid run in the child; no locks are taken, so threads are no hazard.
            preexec_fn=_child_setup(os.getpid()),  # noqa: PLW1509
        )
        _running.add(self)

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen else None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def raise_if_exited(self) -> None:
        code = self.returncode()
        if code is not None:
            raise ControlPlaneError(
                f"{self.name} exited with status {code}; last lines of {self.log_path}:\n{self.log_tail()}"
            )

    def stop(self, grace: float = _STOP_GRACE_SECONDS) -> None:
        popen = self._popen
        if popen is not None:
            pgid = popen.pid  # start_new_session: the child leads its own group
            if popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGTERM)
                try:
                    popen.wait(grace)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pgid, signal.SIGKILL)
                    popen.wait()
            # Anything the component forked and left behind in its group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        _running.discard(self)


_running: set[ManagedProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_running):
        proc.stop(grace=2.0)


# --- waiting for a component ------------------------------------------------------------------------------


def _wait_until(proc: ManagedProcess, ready: Callable[[], bool], deadline: float, what: str) -> None:
    while True:
        proc.raise_if_exited()
        with contextlib.suppress(OSError, http.client.HTTPException):
            if ready():
                return
        if time.monotonic() > deadline:
            raise ControlPlaneError(
                f"{proc.name} not {what} in time; last lines of {proc.log_path}:\n{proc.log_tail()}"
            )
        time.sleep(_POLL_SECONDS)


# --- kubeconfig -------------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig_dict(server_url: str, ca_pem: bytes, user: str, client: pki.KeyPair) -> dict[str, Any]:
    """A self-contained kubeconfig (certificates inline) with cluster and context named CLUSTER_NAME."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server_url, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert_pem),
                    "client-key-data": _b64(client.key_pem),
                },
            }
        ],
        "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": CLUSTER_NAME,
    }


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


# --- CRDs -------------------------------------------------------------------------------------------------


def load_crds(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every document of the given YAML files; anything but a CustomResourceDefinition is an error."""
    crds = []
    for path in paths:
        for doc in yaml.safe_load_all(Path(path).read_text()):
            if doc is None:
                continue
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
                raise ControlPlaneError(
                    f"{path}: expected only CustomResourceDefinition documents, got {kind}"
                )
            crds.append(doc)
    return crds


def _crd_condition(crd: Any, kind: str) -> tuple[str, str] | None:
    conditions = (crd.status.conditions if crd.status else None) or []
    for condition in conditions:
        if condition.type == kind:
            return condition.status, condition.message or ""
    return None


# --- the control plane ------------------------------------------------------------------------------------


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager in `workdir`, listening on free loopback ports.

    `crds` are applied after the API server is ready and before kube-controller-manager starts, so its
    garbage collector watches them from the start (otherwise it discovers new resources only every 30 s).
    """

    def __init__(
        self,
        bin_dir: Path,
        workdir: Path,
        *,
        crds: Iterable[Path] = (),
        controllers: Sequence[str] = DEFAULT_CONTROLLERS,
        scheduler: bool = False,
        start_timeout: float = 120.0,
    ) -> None:
        self.bin_dir = Path(bin_dir)
        self.workdir = Path(workdir)
        self.logs_dir = self.workdir / "logs"
        self.pki_dir = self.workdir / "pki"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.startup_seconds: float | None = None
        self._crds = list(crds)
        self._controllers = list(controllers)
        self._scheduler = scheduler  # the real kube-scheduler, for simulated clusters whose pods need binding
        self._start_timeout = start_timeout
        self._ca: pki.CertificateAuthority | None = None
        self._apiserver_port: int | None = None
        self._processes: list[ManagedProcess] = []

    # -- lifecycle

    @property
    def server_url(self) -> str:
        if self._apiserver_port is None:
            raise ControlPlaneError("control plane not started")
        return f"https://127.0.0.1:{self._apiserver_port}"

    @property
    def running(self) -> bool:
        return bool(self._processes) and all(p.returncode() is None for p in self._processes)

    def start(self) -> None:
        if self._processes:
            raise ControlPlaneError("control plane already started")
        if missing := _missing_binaries(self.bin_dir):
            raise BinariesNotFound(f"{self.bin_dir} lacks {', '.join(missing)}: run tools/build-binaries.sh")
        began = time.monotonic()
        deadline = began + self._start_timeout
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        try:
            etcd_port, etcd_peer_port, apiserver_port, kcm_port, scheduler_port = _free_loopback_ports(5)
            self._apiserver_port = apiserver_port
            self._write_pki()
            self._run(
                components.etcd(CLUSTER_NAME, self.workdir / "etcd", etcd_port, etcd_peer_port), deadline
            )
            self._run(
                components.kube_apiserver(
                    self.pki_dir, apiserver_port, etcd_port, self.server_url, SERVICE_CLUSTER_IP_RANGE
                ),
                deadline,
            )
            if self._crds:
                self.apply_crds(self._crds, timeout=max(1.0, deadline - time.monotonic()))
            self._run(
                components.kube_controller_manager(self.workdir, self.pki_dir, kcm_port, self._controllers),
                deadline,
            )
            if self._scheduler:
                self._run(components.kube_scheduler(self.workdir, self.pki_dir, scheduler_port), deadline)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Stop in reverse start order (controllers before the API server before etcd); idempotent."""
        for proc in reversed(self._processes):
            proc.stop()
        self._processes.clear()

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def controllers(self) -> list[str]:
        """The kube-controller-manager controllers this control plane runs."""
        return list(self._controllers)

    def mark_logs(self, text: str) -> None:
        """Append a marker line (e.g. "test X starts") to every component log, to find a test's lines."""
        for proc in self._processes:
            with proc.log_path.open("a") as log:
                log.write(f"### {text}\n")

    def pids(self) -> dict[str, int]:
        return {p.name: p.pid for p in self._processes if p.pid is not None}

    def check_alive(self) -> None:
        """Raise ControlPlaneError with the log tail of any component that has died since start."""
        for proc in self._processes:
            proc.raise_if_exited()

    # -- certificates and components (rmd_sim.control_plane_components)

    def _write_pki(self) -> None:
        self._ca = ca = pki.CertificateAuthority(f"{CLUSTER_NAME}-ca")
        # Also the in-cluster names: pods on a real node reach the API server at the `kubernetes` Service's
        # cluster IP (the real node's namespace forwards it here, as kube-proxy would).
        serving = ca.issue_server(
            "kube-apiserver",
            dns_names=["localhost", *IN_CLUSTER_NAMES],
            ip_addresses=["127.0.0.1", KUBERNETES_SERVICE_IP],
        )
        self.pki_dir.mkdir(parents=True, exist_ok=True)
        (self.pki_dir / "ca.crt").write_bytes(ca.cert_pem)
        (self.pki_dir / "apiserver.crt").write_bytes(serving.cert_pem)
        _write_private(self.pki_dir / "apiserver.key", serving.key_pem)
        # What the API server presents to kubelets (logs, exec); real kubelets trust this CA for clients.
        kubelet_client = ca.issue_client("kube-apiserver-kubelet-client", ["system:masters"])
        (self.pki_dir / "kubelet-client.crt").write_bytes(kubelet_client.cert_pem)
        _write_private(self.pki_dir / "kubelet-client.key", kubelet_client.key_pem)
        # One RSA key: the API server signs service-account tokens with it and verifies them with it.
        _write_private(self.pki_dir / "service-account.key", pki.service_account_key_pem())
        _write_private(self.kubeconfig, self._kubeconfig_yaml(ADMIN_USER, ["system:masters"]))
        # The controller manager gets its own identity so its requests are distinguishable in logs; it is
        # in system:masters because the garbage collector must be able to delete any kind of object.
        _write_private(
            self.workdir / "controller-manager.kubeconfig",
            self._kubeconfig_yaml("system:kube-controller-manager", ["system:masters"]),
        )
        _write_private(
            self.workdir / "scheduler.kubeconfig", self._kubeconfig_yaml("system:kube-scheduler", [])
        )

    def _kubeconfig_yaml(self, user: str, groups: Sequence[str]) -> bytes:
        if self._ca is None:
            raise ControlPlaneError("control plane not started")
        client = self._ca.issue_client(user, groups)
        config = kubeconfig_dict(self.server_url, self._ca.cert_pem, user, client)
        return yaml.safe_dump(config, sort_keys=False).encode()

    def _run(self, component: Component, deadline: float) -> None:
        """Start the component and wait until its probe says it is up (or the deadline passes)."""
        name = component.name
        proc = ManagedProcess(
            name, [str(self.bin_dir / name), *component.args], self.logs_dir / f"{name}.log"
        )
        self._processes.append(proc)
        proc.start()
        _wait_until(proc, component.ready, deadline, component.ready_state)

    # -- clients

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A kubernetes.client.ApiClient for the admin (or `kubeconfig`'s user); never through a proxy.

        Close it after use (`with cp.api_client() as api:`).
        """
        configuration = kubernetes.client.Configuration()
        configuration.proxy = None  # set explicitly: otherwise HTTPS_PROXY from the environment is used
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]  # the loader module has no annotations
            config_file=str(kubeconfig or self.kubeconfig), client_configuration=configuration
        )
        return kubernetes.client.ApiClient(configuration=configuration)

    def kubeconfig_for(self, user: str, groups: Sequence[str] = (), path: Path | None = None) -> Path:
        """A kubeconfig authenticating as `user` in `groups` (client certificate); RBAC decides the rest.

        For a ServiceAccount identity use user "system:serviceaccount:<ns>:<name>" with groups
        ["system:serviceaccounts", "system:serviceaccounts:<ns>"].
        """
        if path is None:
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
            path = self.workdir / "users" / f"{safe}.kubeconfig"
        _write_private(path, self._kubeconfig_yaml(user, groups))
        return path

    def impersonating_kubeconfig(
        self, user: str, extra: Mapping[str, Sequence[str]] | None = None, path: Path | None = None
    ) -> Path:
        """The admin's kubeconfig acting as `user` with `extra` (kubectl's `as` and `as-user-extra`): the API
        server authorises and records each request as that user, as for the user's own credentials (e.g. a
        ServiceAccount's pod-bound token, which carries its node as an extra). The API server adds a
        ServiceAccount's groups itself."""
        if path is None:
            label = "-".join([user, *(v for values in (extra or {}).values() for v in values)])
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
            path = self.workdir / "users" / f"as-{safe}.kubeconfig"
        config = yaml.safe_load(self.kubeconfig.read_text())
        acting = config["users"][0]["user"]
        acting["as"] = user
        if extra:
            acting["as-user-extra"] = {key: list(values) for key, values in extra.items()}
        _write_private(path, yaml.safe_dump(config, sort_keys=False).encode())
        return path

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the bundled kubectl as admin."""
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            env=self.env(),
        )

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG for this control plane and loopback exempted from any proxy."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        no_proxy = ",".join(filter(None, [env.get("NO_PROXY", ""), "127.0.0.1,localhost"]))
        env["NO_PROXY"] = env["no_proxy"] = no_proxy
        return env

    # -- CRDs

    def apply_crds(self, paths: Iterable[Path], timeout: float = 60.0) -> list[str]:
        """Server-side apply every CRD in `paths`, then wait until each is Established; returns their names.

        The garbage collector notices resources of CRDs applied after start only on its next discovery
        pass (every 30 s); pass `crds=` to the constructor when tests rely on GC of custom resources.
        """
        crds = load_crds(paths)
        deadline = time.monotonic() + timeout
        with self.api_client() as api:
            ext = kubernetes.client.ApiextensionsV1Api(api)
            names = []
            for crd in crds:
                name = crd["metadata"]["name"]
                try:
                    ext.patch_custom_resource_definition(
                        name=name,
                        body=crd,
                        field_manager=CRD_FIELD_MANAGER,
                        force=True,
                        _content_type="application/apply-patch+yaml",
                    )
                except ApiException as exc:
                    raise ControlPlaneError(f"applying CRD {name} failed: {exc.status} {exc.body}") from exc
                names.append(name)
            for name in names:
                while True:
                    current = ext.read_custom_resource_definition(name)
                    names_accepted = _crd_condition(current, "NamesAccepted")
                    if names_accepted is not None and names_accepted[0] == "False":
                        raise ControlPlaneError(f"CRD {name} names not accepted: {names_accepted[1]}")
                    established = _crd_condition(current, "Established")
                    if established is not None and established[0] == "True":
                        break
                    if time.monotonic() > deadline:
                        raise ControlPlaneError(
                            f"CRD {name} not Established within {timeout} s: {established}"
                        )
                    time.sleep(_POLL_SECONDS)
        return names

    # -- logs

    def save_logs(self, dest: Path) -> Path:
        """Copy every component's log to `dest` (created); safe to call while the control plane runs."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        if self.logs_dir.is_dir():
            for log in self.logs_dir.iterdir():
                shutil.copy2(log, dest / log.name)
        return dest


# --- command line -----------------------------------------------------------------------------------------


def _crd_files(paths: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(path.glob("*.yaml")) if path.is_dir() else [path])
    return files


def add_control_plane_command(subparsers: Any) -> None:
    """Register `control-plane` on an argparse subparsers object; `args.run(args) -> int` runs it."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "control-plane",
        help="run a local etcd + kube-apiserver + kube-controller-manager until Ctrl-C",
        description="Start a Kubernetes control plane on loopback, print its kubeconfig, wait for Ctrl-C.",
    )
    _add_arguments(parser)
    parser.set_defaults(run=run_control_plane_command)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep state, kubeconfig and logs here (default: a temp dir, removed on exit)",
    )
    parser.add_argument(
        "--bin-dir", type=Path, help="binaries (default: $RMD_BIN_DIR or tools/build-binaries.sh)"
    )
    parser.add_argument(
        "--crds", type=Path, action="append", default=[], metavar="PATH",
        help="CRD file or directory of *.yaml to apply before controllers start (repeatable)",
    )  # fmt: skip


def run_control_plane_command(args: argparse.Namespace) -> int:
    try:
        bin_dir = args.bin_dir or find_bin_dir()
    except BinariesNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        if args.workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rmd-control-plane-")))
        else:
            workdir = args.workdir.resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        stopped = threading.Event()
        # SIGTERM ends the wait like Ctrl-C does, so `kill <pid>` also cleans up.
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        cp = ControlPlane(bin_dir, workdir, crds=_crd_files(args.crds))
        print(f"starting control plane in {workdir} ...", file=sys.stderr)
        try:
            stack.enter_context(cp)
        except (ControlPlaneError, BinariesNotFound) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"control plane ready in {cp.startup_seconds:.1f} s at {cp.server_url}")
        print(f"kubeconfig: {cp.kubeconfig}")
        print(f"logs:       {cp.logs_dir}")
        print(f"export KUBECONFIG={cp.kubeconfig}")
        print(f"kubectl:    {cp.bin_dir / 'kubectl'}")
        print("Ctrl-C to stop", flush=True)
        try:
            while not stopped.wait(1.0):
                cp.check_alive()
        except KeyboardInterrupt:
            pass
        except ControlPlaneError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print("stopping", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rmd-control-plane", description=__doc__.splitlines()[0] if __doc__ else None
    )
    _add_arguments(parser)
    return run_control_plane_command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
