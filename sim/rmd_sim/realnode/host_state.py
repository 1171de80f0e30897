"""What a real kubelet and containerd change on the host, recorded before a run and put back after it.

A real node runs in a network namespace of its own (its iptables chains, CNI bridge and links die with it) and
keeps its files under its work directory; what is left on the host itself (reference: real-kubelet.md):

* sysctls the kubelet sets at start (`kernel.panic`, `kernel.panic_on_oops`, `vm.overcommit_memory`, ...);
* the `kubepods` cgroup trees it makes in every cgroup hierarchy;
* mounts under the work directory (the kubelet's bind mount of its root dir, volumes, sandboxes' /dev/shm,
  container root file systems), which outlive the processes that made them;
* runc shims (they outlive containerd) and the containers they hold;
* symlinks in /var/log/containers (a path the kubelet does not let us move);
* its root directory /var/lib/kubelet: the device manager's socket directory is fixed there
  (/var/lib/kubelet/device-plugins), so the node uses the real path, and a directory found there is moved
  aside for the run and put back after it.

`HostSnapshot.take()` records the before state; `restore()` undoes the differences; `differences()` lists what
still differs (a test asserts it is empty). The record is also written to a file, so a run that was killed is
cleaned up by the next one (`restore_stale`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rmd_sim.mounts import mount_points

# Sysctls the kubelet sets (pkg/kubelet/cm setupKernelTunables); saved and restored whatever their values.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTAINER_LOGS = Path("/var/log/containers")
RECORD_DIR = Path("/run/rmd-sim")
KUBELET_DIR = Path("/var/lib/kubelet")
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _read_sysctl(name: str) -> str | None:
    try:
        return (Path("/proc/sys") / name).read_text().strip()
    except OSError:
        return None


def _hierarchies() -> list[Path]:
    """Every cgroup hierarchy mount point (v1 controllers and the unified one), or the v2 root."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]
    return sorted(p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink())


def kubepods_cgroups() -> list[Path]:
    """The kubelet's pod cgroup trees present now (cgroupfs and systemd driver names)."""
    found = []
    for hierarchy in _hierarchies():
        for name in ("kubepods", "kubepods.slice"):
            if (hierarchy / name).is_dir():
                found.append(hierarchy / name)
    return found


def mounts_under(path: Path) -> list[str]:
    """Mount points at or under `path`, deepest first."""
    prefix = str(path.resolve())
    points = {p for p in mount_points() if p == prefix or p.startswith(prefix + "/")}
    return sorted(points, key=lambda p: (-p.count("/"), p))


def unmount_all(path: Path) -> None:
    """Detach every mount under `path` (lazy: a mount still in use leaves the table at once)."""
    for _ in range(5):  # a detached parent can reveal mounts that were hidden under it
        points = mounts_under(path)
        if not points:
            return
        for point in points:
            _libc.umount2(point.encode(), _MNT_DETACH)


def _pids_in(tree: Path) -> set[int]:
    pids: set[int] = set()
    for procs in tree.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(line) for line in procs.read_text().split())
    return pids


def kill_processes(containerd_address: str, cgroups: list[Path]) -> None:
    """SIGKILL the runc shims of one containerd and every process in the given cgroup trees."""
    victims: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = proc.joinpath("cmdline").read_bytes().split(b"\0")
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and containerd_address.encode() in argv:
                victims.add(int(proc.name))
    for tree in cgroups:
        victims |= _pids_in(tree)
    victims.discard(os.getpid())
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def remove_cgroup_tree(tree: Path, timeout: float = 10.0) -> None:
    """rmdir the tree depth first; waits while killed processes are still leaving their cgroups."""
    deadline = time.monotonic() + timeout
    while tree.exists():
        dirs = sorted((p for p in tree.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for directory in [*dirs, tree]:
            with contextlib.suppress(OSError):
                directory.rmdir()
        if not tree.exists() or time.monotonic() > deadline:
            return
        time.sleep(0.1)


@dataclass
class HostSnapshot:
    """The host's state before a real node starts (see the module docstring)."""

    sysctls: dict[str, str | None]
    kubepods: list[str]
    container_logs: list[str] | None  # None: /var/log/containers did not exist
    kubelet_dir_saved: str | None = None  # where a /var/lib/kubelet found at the start was moved
    workdir: str = ""
    containerd_address: str = ""
    owner_pid: int = field(default_factory=os.getpid)

    @classmethod
    def take(cls, workdir: Path, containerd_address: str) -> HostSnapshot:
        logs = sorted(p.name for p in CONTAINER_LOGS.iterdir()) if CONTAINER_LOGS.is_dir() else None
        return cls(
            sysctls={name: _read_sysctl(name) for name in SYSCTLS},
            kubepods=[str(p) for p in kubepods_cgroups()],
            container_logs=logs,
            workdir=str(workdir),
            containerd_address=containerd_address,
        )

    def set_aside_kubelet_dir(self) -> None:
        """Move a /var/lib/kubelet found now out of the way (restore() puts it back)."""
        if KUBELET_DIR.exists() and self.kubelet_dir_saved is None:
            saved = KUBELET_DIR.with_name(f"kubelet.rmd-saved-{os.getpid()}")
            KUBELET_DIR.rename(saved)
            self.kubelet_dir_saved = str(saved)

    # -- the record file, for runs that were killed

    def record_path(self, name: str) -> Path:
        return RECORD_DIR / f"realnode-{name}.json"

    def save(self, name: str) -> None:
        RECORD_DIR.mkdir(parents=True, exist_ok=True)
        self.record_path(name).write_text(json.dumps(asdict(self)))

    def forget(self, name: str) -> None:
        self.record_path(name).unlink(missing_ok=True)

    # -- undo

    def restore(self) -> None:
        """Kill what is left of the node, unmount, remove new cgroups and log links, put the sysctls back."""
        new_cgroups = [p for p in kubepods_cgroups() if str(p) not in self.kubepods]
        kill_processes(self.containerd_address, new_cgroups)
        unmount_all(Path(self.workdir))
        unmount_all(KUBELET_DIR)
        shutil.rmtree(KUBELET_DIR, ignore_errors=True)
        if self.kubelet_dir_saved is not None and Path(self.kubelet_dir_saved).exists():
            Path(self.kubelet_dir_saved).rename(KUBELET_DIR)
        for tree in new_cgroups:
            remove_cgroup_tree(tree)
        if self.container_logs is None:
            if CONTAINER_LOGS.is_dir():
                for entry in CONTAINER_LOGS.iterdir():
                    entry.unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    CONTAINER_LOGS.rmdir()
        elif CONTAINER_LOGS.is_dir():
            for entry in CONTAINER_LOGS.iterdir():
                if entry.name not in self.container_logs:
                    entry.unlink(missing_ok=True)
        for name, value in self.sysctls.items():
            if value is not None and _read_sysctl(name) != value:
                with contextlib.suppress(OSError):
                    (Path("/proc/sys") / name).write_text(value)

    def differences(self) -> list[str]:
        """What differs from the snapshot now (empty when the host is as found)."""
        now = HostSnapshot.take(Path(self.workdir), self.containerd_address)
        diffs = [
            f"sysctl {name}: {self.sysctls[name]} -> {value}"
            for name, value in now.sysctls.items()
            if value != self.sysctls[name]
        ]
        if now.kubepods != self.kubepods:
            diffs.append(f"kubepods cgroups: {self.kubepods} -> {now.kubepods}")
        if now.container_logs != self.container_logs:
            diffs.append(f"{CONTAINER_LOGS}: {self.container_logs} -> {now.container_logs}")
        for path in (Path(self.workdir), KUBELET_DIR):
            if mounts := mounts_under(path):
                diffs.append(f"mounts left under {path}: {mounts}")
        if KUBELET_DIR.exists() != (self.kubelet_dir_saved is not None):
            diffs.append(f"{KUBELET_DIR} {'left behind' if KUBELET_DIR.exists() else 'not put back'}")
        return diffs


def restore_stale(name: str) -> bool:
    """Restore the host after an earlier run of real node `name` whose process is gone; True if it did."""
    path = RECORD_DIR / f"realnode-{name}.json"
    try:
        snapshot = HostSnapshot(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return False
    if Path(f"/proc/{snapshot.owner_pid}").exists() and snapshot.owner_pid != os.getpid():
        return False  # still running elsewhere: not ours to clean
    snapshot.restore()
    snapshot.forget(name)
    return True
