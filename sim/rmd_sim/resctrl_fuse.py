"""A live, kernel-like /sys/fs/resctrl for a simulated host tree: a FUSE front end over `SimResctrl`.

The plain files `rmd_sim node` writes cannot react to a writer. `ResctrlMount(host_root)` moves the tree's
`sys/fs/resctrl` into a backing directory (`.rmd-sim/resctrl-backing`, laid out as a host root so
`SimResctrl` and `check_resctrl_tree` can read it) and mounts FUSE at `<host_root>/sys/fs/resctrl`, so any
process gets the kernel's behaviour through ordinary syscalls: mkdir populates a group, each write(2) is one
command, refusals carry the kernel's errno and fill info/last_cmd_status, rmdir returns CPUs to the root.
State lives in the backing directory, so an unmount + remount (or an agent restart) sees the same groups;
while unmounted the mount point is an empty directory, which is what an unmounted resctrl looks like.

Kernel details kept on purpose: files report size 0 (kernfs does; reads are served with direct_io so
`cat` and Python still read everything), a write(2) longer than a page is cut to one page like kernfs,
the offset of a write is ignored (resctrl parses each buffer as a whole command), O_TRUNC/truncate are
no-ops, creating, unlinking or renaming entries is refused. flock(2) is left to the kernel's local locks
(FUSE passes no flock on directories, and no flock op is registered for files), which exclude processes on
this machine just as on a real node.

Deviations: chmod/chown are refused (the kernel allows root to change modes), group names starting with "."
are refused (the backing store hides dot-files), rename does not set last_cmd_status.

libfuse claims SIGTERM/SIGHUP for its loop when they are at their default disposition: in a process that has
not set handlers, a SIGTERM then unmounts instead of killing. The CLI command installs its own handlers first.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import mmap
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

from rmd_sim.mounts import mount_points
from rmd_sim.resctrl import NON_GROUP_DIRS, RESCTRL, SimResctrl

BACKING_REL = ".rmd-sim/resctrl-backing"
PAGE_SIZE = mmap.PAGESIZE  # kernfs hands a write at most one page
MOUNT_TIMEOUT_S = 10.0
FS_NAME = "rmd-sim-resctrl"
WRITABLE_GROUP_FILES = frozenset({"schemata", "cpus", "cpus_list", "tasks", "mode"})
WRITABLE_INFO_FILES = frozenset({"info/L3_MON/max_threshold_occupancy"})


class ResctrlMountError(Exception):
    """The simulated resctrl cannot be mounted or unmounted."""


# -- pure rules --------------------------------------------------------------------------------------------


def is_writable(rel: str) -> bool:
    """Whether the kernel gives a mount file a write handler (mode 0644) rather than read-only (0444)."""
    rel = rel.strip("/")
    if rel.startswith("info/"):
        return rel in WRITABLE_INFO_FILES
    parts = rel.split("/")
    if len(parts) == 1:
        return parts[0] in WRITABLE_GROUP_FILES
    return len(parts) == 2 and parts[0] not in NON_GROUP_DIRS and parts[1] in WRITABLE_GROUP_FILES


def is_hidden(rel: str) -> bool:
    """Dot-files of the backing store (SimResctrl's atomic-replace temporaries) are not part of the mount."""
    return any(part.startswith(".") for part in rel.strip("/").split("/") if part)


def fuse_unavailable_reason() -> str | None:
    """Why FUSE mounts cannot work on this machine, or None when they can."""
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    try:  # not at the top: this module must import where mfusepy or libfuse3 is missing
        import mfusepy  # type: ignore[import-untyped]  # noqa: F401, PLC0415
    except (ImportError, OSError, AttributeError) as exc:  # mfusepy loads libfuse3 at import
        return f"mfusepy or libfuse3 is unavailable: {exc}"
    return None


def _err(code: int, rel: str = "") -> OSError:
    return OSError(code, os.strerror(code), rel)


# -- the FUSE operations -----------------------------------------------------------------------------------


@dataclass
class _Handle:
    rel: str
    snapshot: bytes | None = None  # the content as of the read at offset 0, like a seq_file buffer


class ResctrlOperations:
    """mfusepy operations presenting a SimResctrl. Paths arrive as "/grp/schemata".

    Only the methods defined here are registered with libfuse; flock/lock are deliberately absent so the
    kernel handles locks locally. Every call is serialised by one lock: the simulated kernel reads and
    rewrites the whole tree per operation.
    """

    use_ns = True  # times in nanoseconds (mfusepy warns about float seconds otherwise)

    def __init__(self, sim: SimResctrl) -> None:
        self.sim = sim
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._handles: dict[int, _Handle] = {}
        self._next_fh = 1

    def _rel(self, path: str | None) -> str:
        if (
            path is None
        ):  # libfuse may pass no path for an open handle whose file is gone (e.g. a rmdir'ed group)
            raise _err(errno.ENOENT, "(removed)")
        rel = path.strip("/")
        if is_hidden(rel):
            raise _err(errno.ENOENT, rel)
        return rel

    # lifecycle

    def init(self, path: str) -> None:
        self.ready.set()

    # lookups and reads

    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        rel = self._rel(path)
        with self._lock:
            st = os.lstat(self.sim.path(rel))
        if stat.S_ISDIR(st.st_mode):
            mode, size = stat.S_IFDIR | 0o755, st.st_size
        else:
            mode, size = stat.S_IFREG | (0o644 if is_writable(rel) else 0o444), 0  # kernfs: size 0
        return {
            "st_mode": mode,
            "st_nlink": st.st_nlink,
            "st_size": size,
            "st_uid": st.st_uid,
            "st_gid": st.st_gid,
            "st_atime": st.st_atime_ns,
            "st_mtime": st.st_mtime_ns,
            "st_ctime": st.st_ctime_ns,
        }

    def readdir(self, path: str, fh: int) -> list[str]:
        rel = self._rel(path)
        with self._lock:
            if not self.sim.path(rel).is_dir():
                raise _err(errno.ENOTDIR, rel)
            return [".", "..", *self.sim.listdir(rel)]

    def open(self, path: str, flags: int) -> int:
        rel = self._rel(path)
        with self._lock:
            target = self.sim.path(rel)
            if not target.exists():
                raise _err(errno.ENOENT, rel)
            if flags & os.O_ACCMODE != os.O_RDONLY and not is_writable(rel):
                raise _err(errno.EACCES, rel)  # kernfs_fop_open: no write handler
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = _Handle(rel)
            return fh

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        rel = self._rel(path)
        with self._lock:
            handle = self._handles.setdefault(fh, _Handle(rel))
            if offset == 0 or handle.snapshot is None:
                handle.snapshot = self.sim.path(rel).read_bytes()
            return handle.snapshot[offset : offset + size]

    def release(self, path: str, fh: int) -> int:
        with self._lock:
            self._handles.pop(fh, None)
        return 0

    # commands

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        rel = self._rel(path)
        chunk = data[:PAGE_SIZE]  # a short write: the writer sends the rest as the next command
        with self._lock:
            return self.sim.write(rel, chunk)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        rel = self._rel(path)
        with self._lock:
            target = self.sim.path(rel)
            if target.is_dir():
                raise _err(errno.EISDIR, rel)
            if not target.exists():
                raise _err(errno.ENOENT, rel)
        if not is_writable(rel):
            raise _err(errno.EACCES, rel)
        return 0  # O_TRUNC / `>` redirection: sysfs-like files ignore it

    def mkdir(self, path: str, mode: int) -> int:
        rel = path.strip("/")
        if rel.rpartition("/")[2].startswith("."):
            raise _err(errno.EINVAL, rel)  # would collide with the backing store's hidden files
        with self._lock:
            self.sim.mkdir(rel)
        return 0

    def rmdir(self, path: str) -> int:
        rel = self._rel(path)
        with self._lock:
            self.sim.rmdir(rel)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._rel(path)
        return 0  # `touch` on an existing file succeeds and changes nothing

    # what kernfs refuses

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        raise _err(errno.EACCES, path)  # a kernfs directory has no ->create

    def mknod(self, path: str, mode: int, dev: int) -> int:
        raise _err(errno.EPERM, path)

    def unlink(self, path: str) -> int:
        raise _err(errno.EPERM, path)

    def rename(self, old: str, new: str) -> int:
        raise _err(errno.EPERM, old)  # resctrl renames only MON groups, which are not modelled

    def symlink(self, target: str, source: str) -> int:
        raise _err(errno.EPERM, target)

    def link(self, target: str, source: str) -> int:
        raise _err(errno.EPERM, target)

    def chmod(self, path: str, mode: int) -> int:
        raise _err(errno.EPERM, path)

    def chown(self, path: str, uid: int, gid: int) -> int:
        raise _err(errno.EPERM, path)


# -- mounts ------------------------------------------------------------------------------------------------


def is_mounted(path: Path) -> bool:
    """Whether something is mounted exactly at `path` (read from /proc/self/mountinfo, no stat of it)."""
    wanted = os.path.realpath(path)
    try:
        return wanted in mount_points()
    except OSError:
        return os.path.ismount(wanted)


def unmount(path: Path, *, lazy: bool = False) -> None:
    """Unmount a FUSE mount: fusermount3 (or umount when it is missing); ResctrlMountError if it fails."""
    if shutil.which("fusermount3"):
        cmd = ["fusermount3", "-u", *(["-z"] if lazy else []), str(path)]
    else:
        cmd = ["umount", *(["-l"] if lazy else []), str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ResctrlMountError(f"{' '.join(cmd)} failed: {done.stderr.strip() or done.returncode}")


def _symlink(link: Path, target: Path) -> None:
    relative = os.path.relpath(target, link.parent)
    if link.is_symlink() and os.readlink(link) == relative:
        return
    if link.is_symlink():
        link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(relative)


def prepare_backing(host_root: Path) -> Path:
    """Move the tree's resctrl into the backing root on first use; return the backing root.

    The backing root holds sys/fs/resctrl plus links to the host's sys/devices (online CPUs, cache sizes)
    and proc (mount options), which is all SimResctrl and check_resctrl_tree read.
    """
    backing = host_root / BACKING_REL
    source, kept = host_root / RESCTRL, backing / RESCTRL
    source_has_tree = source.is_dir() and any(source.iterdir())
    if not kept.is_dir():
        if not source_has_tree:
            raise ResctrlMountError(
                f"{source} holds no resctrl tree to serve (does the node spec say resctrl_mounted: false?)"
            )
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(source, kept)  # a rename: both live under the host root
    elif source_has_tree:
        raise ResctrlMountError(
            f"both {source} and the backing copy {kept} hold a resctrl tree; remove one of them"
        )
    source.mkdir(exist_ok=True)
    _symlink(backing / "sys/devices", host_root / "sys/devices")
    _symlink(backing / "proc", host_root / "proc")
    return backing


class ResctrlMount:
    """A SimResctrl served by FUSE at `<host_root>/sys/fs/resctrl` from a background thread.

    Use as a context manager, or start()/stop(). `.sim` is the simulated kernel (inject faults, read state),
    `.backing_root` the host-root-shaped directory to give check_resctrl_tree.
    """

    def __init__(self, host_root: Path) -> None:
        root = Path(host_root).resolve()
        if root == Path("/"):
            raise ResctrlMountError("refusing host root /: that is the real /sys/fs/resctrl")
        self.host_root = root
        self.mountpoint = root / RESCTRL
        self.backing_root = root / BACKING_REL
        self._sim: SimResctrl | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def sim(self) -> SimResctrl:
        if self._sim is None:
            raise ResctrlMountError("not started")
        return self._sim

    @property
    def serving(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            raise ResctrlMountError(f"{self.mountpoint} is already served by this ResctrlMount")
        reason = fuse_unavailable_reason()
        if reason:
            raise ResctrlMountError(f"cannot mount {self.mountpoint}: {reason}")
        self._clear_stale_mount()
        self.backing_root = prepare_backing(self.host_root)
        self._sim = SimResctrl(self.backing_root)  # ENODEV before mounting if the tree is broken
        ops = ResctrlOperations(self._sim)
        self._error = None
        self._thread = threading.Thread(target=self._serve, args=(ops,), name=FS_NAME, daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # a test that forgets stop() must not leave a dead mount behind
        try:
            self._wait_ready(ops)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Unmount and wait for the serving thread; safe to call twice.

        A busy mount (a process has its cwd or an open file inside) is detached lazily, like `umount -l`:
        it leaves the mount table at once and the thread keeps serving the old users until they let go.
        """
        thread, self._thread = self._thread, None
        if thread is None:
            return
        atexit.unregister(self.stop)
        problems, lazy = [], False
        if is_mounted(self.mountpoint):
            try:
                unmount(self.mountpoint)
            except ResctrlMountError as exc:
                problems.append(str(exc))
                lazy = True
                try:
                    unmount(self.mountpoint, lazy=True)
                except ResctrlMountError as lazy_exc:
                    problems.append(str(lazy_exc))
        thread.join(0.5 if lazy else MOUNT_TIMEOUT_S)
        if is_mounted(self.mountpoint):
            raise ResctrlMountError(f"could not unmount {self.mountpoint}: {'; '.join(problems)}")

    def _serve(self, ops: ResctrlOperations) -> None:
        import mfusepy  # noqa: PLC0415  # loads libfuse3: only when a mount is served

        try:
            mfusepy.FUSE(
                ops,
                str(self.mountpoint),
                foreground=True,
                nothreads=True,
                fsname=FS_NAME,
                subtype=FS_NAME,
                direct_io=True,  # size-0 files: reads must bypass the page cache
                attr_timeout=0,  # SimResctrl's state changes behind the kernel's back (tests call .sim)
                entry_timeout=0,
                negative_timeout=0,
            )
        except BaseException as exc:
            self._error = exc

    def _wait_ready(self, ops: ResctrlOperations) -> None:
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not ops.ready.wait(0.02):
            if not self.serving:
                raise ResctrlMountError(f"mounting {self.mountpoint} failed: {self._error or 'no reason'}")
            if time.monotonic() > deadline:
                raise ResctrlMountError(f"mounting {self.mountpoint} timed out")
        if not is_mounted(self.mountpoint):
            raise ResctrlMountError(f"{self.mountpoint} answered FUSE init but is not in the mount table")

    def _clear_stale_mount(self) -> None:
        """A mount left by a crashed server answers ENOTCONN: lazily unmount it. A live one is refused."""
        if not is_mounted(self.mountpoint):
            return
        try:
            os.stat(self.mountpoint)
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                raise
            unmount(self.mountpoint, lazy=True)
            return
        raise ResctrlMountError(f"{self.mountpoint} is already mounted (another resctrl-mount is serving it)")


# -- command line ------------------------------------------------------------------------------------------


def add_resctrl_mount_command(subparsers: Any) -> None:
    """Register `resctrl-mount` on argparse subparsers; sets `run(args) -> int` like rmd_sim.cli's."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "resctrl-mount",
        help="serve a simulated host tree's sys/fs/resctrl with kernel behaviour (FUSE) until SIGTERM",
    )
    parser.add_argument("--host-root", type=Path, required=True, help="the simulated host tree")
    parser.set_defaults(run=run_resctrl_mount_command)


def run_resctrl_mount_command(args: argparse.Namespace) -> int:
    stopped = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    # Set before mounting, so libfuse does not take SIGTERM/SIGHUP for itself.
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {sig: signal.signal(sig, on_signal) for sig in handled}
    try:
        with ResctrlMount(args.host_root) as mount:
            print(f"serving {mount.mountpoint} (state in {mount.backing_root}); SIGTERM unmounts", flush=True)
            while not stopped.wait(0.5):
                if not mount.serving:
                    print(f"rmd_sim resctrl-mount: {mount.mountpoint} was unmounted", file=sys.stderr)
                    return 1
    except (ResctrlMountError, OSError) as exc:
        print(f"rmd_sim resctrl-mount: {exc}", file=sys.stderr)
        return 2
    finally:
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
    return 0
