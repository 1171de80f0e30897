"""scheduler-plugins' kube-scheduler (NodeResourceTopologyMatch) for benchmarks: built by hand, run as the
operator configures it.

Neither sigs.k8s.io/scheduler-plugins nor its dependency github.com/k8stopologyawareschedwg/numaplacement is
served by the Go module proxy, so CI cannot build the scheduler; give this tool their sources (a checkout or a
release archive of each) and it builds the binary into the binary cache, where bench/nrt_requeue.py finds it:

    python bench/numa_scheduler.py SCHEDULER_PLUGINS_SRC NUMAPLACEMENT_SRC [--out PATH]

It builds on the Kubernetes release the test control plane is built from (tools/build-binaries.sh), so that
everything else comes from the module proxy and mostly from the Go build cache:

* every k8s.io module is replaced by that release's (the `k8s.io/kubernetes` module and its staging
  modules, the new ones included), controller-runtime is raised to the release built on the same minor;
* numaplacement is replaced by the given directory;
* plugins that do not compile against that release are left out of `cmd/scheduler` (DROPPED_PLUGINS: their
  preemption calls changed); NodeResourceTopologyMatch is not among them.

Checked with scheduler-plugins master 903da7df (2026-08-16, Kubernetes 1.35.7) on Kubernetes 1.36.3, the
combination the reference numa-scheduler-interop.md measured.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from operator_bench_common import cache_root, go_env

from rmd_operator.scheduler_objects import DEFAULT_SCHEDULER_NAME, scheduler_config
from rmd_sim.control_plane import ManagedProcess, repo_root
from rmd_sim.control_plane_components import http_get
from rmd_sim.netutil import free_port

NUMAPLACEMENT = "github.com/k8stopologyawareschedwg/numaplacement"
CONTROLLER_RUNTIME = "sigs.k8s.io/controller-runtime"
# controller-runtime's release for each Kubernetes minor (its compatibility table)
CONTROLLER_RUNTIME_FOR_MINOR = {"36": "v0.24.1"}
DROPPED_PLUGINS = ("capacityscheduling", "preemptiontoleration")
START_TIMEOUT = 60.0
Obj = dict[str, Any]


def default_binary() -> Path:
    """$RMD_NUMA_SCHEDULER, else the cached one of the Kubernetes release (a new release: a new build)."""
    cached = cache_root() / f"numa-scheduler-{kubernetes_version()}" / "kube-scheduler"
    return Path(os.environ.get("RMD_NUMA_SCHEDULER") or cached)


# -- building ----------------------------------------------------------------------------------------------


def kubernetes_version() -> str:
    """The release tools/build-binaries.sh builds the test control plane from."""
    script = (repo_root() / "tools" / "build-binaries.sh").read_text()
    found = re.search(r"^K8S_VERSION=(v\S+)", script, re.MULTILINE)
    if found is None:
        raise RuntimeError("tools/build-binaries.sh sets no K8S_VERSION")
    return found.group(1)


def go(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["go", *args], capture_output=True, text=True, check=True, cwd=cwd, env=go_env()
    ).stdout


def staging_modules(kubernetes: str, cwd: Path) -> list[str]:
    """The k8s.io modules `k8s.io/kubernetes` at that release carries in its staging directory."""
    info = json.loads(go("mod", "download", "-json", f"k8s.io/kubernetes@{kubernetes}", cwd=cwd))
    replaces = json.loads(go("mod", "edit", "-json", info["GoMod"], cwd=cwd)).get("Replace") or ()
    return sorted(r["Old"]["Path"] for r in replaces if r["New"]["Path"].startswith("./staging/"))


def module_edits(kubernetes: str, staging: list[str], numaplacement: Path) -> list[str]:
    """`go mod edit` flags: `k8s.io/kubernetes` and every staging module at the release (a replace names a
    module whatever version the source requires), numaplacement from its directory, controller-runtime at the
    release built on the same minor."""
    minor = kubernetes.split(".")[1]
    if minor not in CONTROLLER_RUNTIME_FOR_MINOR:
        raise RuntimeError(f"no controller-runtime release known for Kubernetes 1.{minor}: add it")
    staging_version = "v0." + kubernetes.removeprefix("v1.")
    return [
        f"-replace=k8s.io/kubernetes=k8s.io/kubernetes@{kubernetes}",
        *(f"-replace={path}={path}@{staging_version}" for path in staging),
        f"-replace={NUMAPLACEMENT}={numaplacement.resolve()}",
        f"-require={CONTROLLER_RUNTIME}@{CONTROLLER_RUNTIME_FOR_MINOR[minor]}",
    ]


def without_plugins(main_go: str, plugins: tuple[str, ...] = DROPPED_PLUGINS) -> str:
    """cmd/scheduler/main.go without the import and registration lines of `plugins`."""
    lines = main_go.splitlines(keepends=True)
    return "".join(line for line in lines if not any(f"{p}." in line or f'/{p}"' in line for p in plugins))


def build(source: Path, numaplacement: Path, out: Path) -> Path:
    kubernetes = kubernetes_version()
    with tempfile.TemporaryDirectory(prefix="numa-scheduler-build-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(source, src, ignore=shutil.ignore_patterns(".git"))
        staging = staging_modules(kubernetes, src)
        go("mod", "edit", *module_edits(kubernetes, staging, numaplacement), cwd=src)
        main_go = src / "cmd" / "scheduler" / "main.go"
        main_go.write_text(without_plugins(main_go.read_text()))
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        go("build", "-trimpath", "-ldflags=-s -w", "-o", str(partial), "./cmd/scheduler", cwd=src)
        partial.rename(out)
    return out


# -- running -----------------------------------------------------------------------------------------------


def configuration(kubeconfig: Path) -> Obj:
    """What the operator deploys (rmd_operator.scheduler_objects: one profile with NodeResourceTopologyMatch,
    the over-reserve cache resynced every 2 s), run outside the cluster: the admin's kubeconfig, and no leader
    election (one instance; a restarted one would wait for its predecessor's Lease)."""
    config = scheduler_config(DEFAULT_SCHEDULER_NAME, "default", "with-exclusive-resources")
    config["leaderElection"] = {"leaderElect": False}
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    return config


@dataclass
class Scheduler:
    """A scheduler process and the port of its /healthz."""

    process: ManagedProcess
    port: int

    def wait_healthy(self, within: float = START_TIMEOUT) -> None:
        """Until /healthz answers 200; RuntimeError with its log if it exits or does not answer in time."""
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate; only /healthz is read
        deadline = time.monotonic() + within
        while True:
            self.process.raise_if_exited()
            with contextlib.suppress(OSError, http.client.HTTPException):
                if http_get(self.port, "/healthz", context)[0] == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the scheduler was not healthy within {within:g} s:\n{self.process.log_tail()}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.stop()


def spawn(binary: Path, workdir: Path, kubeconfig: Path, ca_file: Path) -> Scheduler:
    """The scheduler, started (its log: workdir/scheduler.log); not yet healthy. The caller stops it."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(configuration(kubeconfig), sort_keys=False))
    port = free_port()
    proc = ManagedProcess(
        "numa-scheduler",
        [
            str(binary),
            f"--config={config}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--authentication-skip-lookup=true",
            f"--client-ca-file={ca_file}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={workdir / 'certs'}",
            "-v=2",  # every failed attempt ("Unable to schedule pod") and the cache's flushes are logged at 2
        ],
        workdir / "scheduler.log",
    )
    proc.start()
    return Scheduler(proc, port)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("scheduler_plugins", type=Path, help="scheduler-plugins source directory")
    parser.add_argument("numaplacement", type=Path, help="numaplacement source directory")
    parser.add_argument("--out", type=Path, default=default_binary())
    args = parser.parse_args()
    for path in (args.scheduler_plugins / "go.mod", args.numaplacement / "go.mod"):
        if not path.is_file():
            print(f"{path} not found: give the sources' top directories", file=sys.stderr)
            return 2
    try:
        binary = build(args.scheduler_plugins, args.numaplacement, args.out)
    except subprocess.CalledProcessError as exc:
        print(f"{' '.join(exc.cmd)} failed:\n{exc.stderr}", file=sys.stderr)
        return 1
    except (OSError, RuntimeError) as exc:  # no go command, no controller-runtime known for the release
        print(f"cannot build the scheduler: {exc}", file=sys.stderr)
        return 1
    print(binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
