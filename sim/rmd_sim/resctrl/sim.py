"""The simulated kernel: `SimResctrl` performs mkdir/rmdir/write on a host tree the way the kernel does (the
pure `ops` on the state read from the tree, then only the changed files written back), and can be told to fail
chosen operations (`Fault`)."""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import os
import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from rmd_sim.resctrl.checker import read_resctrl_state
from rmd_sim.resctrl.model import NON_GROUP_DIRS, RESCTRL, ResctrlState
from rmd_sim.resctrl.ops import (
    KernelReject,
    op_mkdir,
    op_rmdir,
    op_write_cpus,
    op_write_mode,
    op_write_schemata,
    op_write_tasks,
)
from rmd_sim.resctrl.render import render_bit_usage, render_group_files
from rmd_sim.resctrl.tree import (
    TreeProblem,
    list_groups,
    parse_schemata_text,
    read_file,
    read_info,
    read_l3_sizes,
)


@dataclass(eq=False)
class Fault:
    """Make the next `count` matching operations fail like the kernel: OSError(errno) + last_cmd_status.

    `path_glob` is matched (fnmatch, `*` crosses `/`) against the path relative to the mount, e.g.
    "*/schemata", "schemata" (the root group's), "grp1". `op` is "write", "mkdir", "rmdir" or "*".
    `count=None` fails every matching operation until the fault is cleared.
    """

    path_glob: str
    errno: int
    message: str = ""
    count: int | None = 1
    op: str = "write"

    def matches(self, op: str, rel: str) -> bool:
        return self.op in ("*", op) and fnmatch.fnmatchcase(rel, self.path_glob)


def _put(path: Path, text: str) -> None:
    """Replace a file atomically, so a concurrent reader (or a FUSE front end) never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _norm(rel: str) -> str:
    return rel.strip("/")


class SimResctrl:
    """The kernel side of /sys/fs/resctrl over a host tree at `root` (the directory that holds `sys/`).

    Paths are relative to the mount ("schemata", "grp/cpus_list", "info/last_cmd_status"); a leading "/" is
    ignored, so a FUSE front end can pass its paths through. Every refused operation raises OSError with the
    kernel's errno; operations are serialised by a lock. Reads are plain reads of the tree.
    """

    def __init__(self, root: Path, faults: Iterable[Fault] = ()) -> None:
        self.root = Path(root)
        self.dir = self.root / RESCTRL
        try:
            info = read_info(self.root)
            domains = parse_schemata_text(read_file(self.dir / "schemata")).get("L3", {})
        except (TreeProblem, ValueError) as exc:
            raise OSError(errno.ENODEV, str(exc), str(self.dir)) from None
        self.info = dataclasses.replace(info, l3_cache_bytes=read_l3_sizes(self.root, domains))
        self._faults = list(faults)
        self._lock = threading.RLock()

    # faults

    def inject_fault(
        self, path_glob: str, err: int, message: str = "", count: int | None = 1, op: str = "write"
    ) -> Fault:
        fault = Fault(path_glob, err, message, count, op)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def pending_faults(self) -> tuple[Fault, ...]:
        return tuple(self._faults)

    def _trip_fault(self, op: str, rel: str) -> None:
        for fault in self._faults:
            if fault.matches(op, rel):
                if fault.count is not None:
                    fault.count -= 1
                    if fault.count <= 0:
                        self._faults.remove(fault)
                self._set_status(fault.message)
                raise OSError(fault.errno, os.strerror(fault.errno), rel)

    # reads

    def path(self, rel: str) -> Path:
        """The backing file of a mount path (for stat/readdir in a front end)."""
        return self.dir / _norm(rel)

    def read(self, rel: str) -> str:
        return self.path(rel).read_text()

    def listdir(self, rel: str = "") -> list[str]:
        return sorted(p.name for p in self.path(rel).iterdir() if not p.name.startswith("."))

    def groups(self) -> list[str]:
        return list_groups(self.root)

    def state(self) -> ResctrlState:
        with self._lock:
            return self._load()

    @property
    def last_cmd_status(self) -> str:
        return self.read("info/last_cmd_status").strip()

    # operations

    def mkdir(self, name: str) -> None:
        rel = _norm(name)
        with self._lock:
            self._trip_fault("mkdir", rel)
            target = self.dir / rel
            if target.exists():
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), rel)
            if "/" in rel or not rel:
                parent_exists = target.parent.is_dir()
                err = errno.EPERM if parent_exists else errno.ENOENT
                raise OSError(err, os.strerror(err), rel)  # only top-level control groups are modelled
            if "\n" in rel:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), rel)
            state = self._load()
            self._set_status("")
            new = self._apply(lambda: op_mkdir(state, rel), rel)
            target.mkdir()
            self._make_group_dirs(target)
            self._sync(new)

    def rmdir(self, name: str) -> None:
        rel = _norm(name)
        with self._lock:
            self._trip_fault("rmdir", rel)
            target = self.dir / rel
            if not rel:
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), rel)
            if not target.is_dir():
                err = errno.ENOTDIR if target.exists() else errno.ENOENT
                raise OSError(err, os.strerror(err), rel)
            if "/" in rel or rel in NON_GROUP_DIRS:
                raise OSError(errno.EPERM, os.strerror(errno.EPERM), rel)
            state = self._load()
            new = op_rmdir(state, rel)
            shutil.rmtree(target)
            self._sync(new)

    def write(self, rel_path: str, data: str | bytes) -> int:
        """Write `data` to a mount file the way `write(2)` does; returns the byte count written."""
        rel = _norm(rel_path)
        raw = data.encode() if isinstance(data, str) else data
        with self._lock:
            self._trip_fault("write", rel)
            target = self.dir / rel
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), rel)
            if not target.is_file():
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), rel)
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), rel) from None
            parts = rel.split("/")
            if parts[0] == "info":
                self._write_info(rel, text)
                return len(raw)
            group, filename = ("", parts[0]) if len(parts) == 1 else (parts[0], parts[1])
            if len(parts) > 2 or filename not in ("schemata", "cpus", "cpus_list", "tasks", "mode"):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), rel)  # read-only kernfs files
            state = self._load()
            new = self._apply(lambda: self._dispatch(state, group, filename, text), rel)
            self._sync(new)
            return len(raw)

    # internals

    @staticmethod
    def _dispatch(state: ResctrlState, group: str, filename: str, text: str) -> ResctrlState:
        if filename == "schemata":
            return op_write_schemata(state, group, text)
        if filename == "mode":
            return op_write_mode(state, group, text)
        if filename == "tasks":
            return op_write_tasks(state, group, text)
        return op_write_cpus(state, group, text, as_list=filename == "cpus_list")

    def _apply(self, op: Callable[[], ResctrlState], rel: str) -> ResctrlState:
        """Run a kernel operation; on refusal set last_cmd_status like the kernel and raise its errno."""
        try:
            new = op()
        except KernelReject as reject:
            if reject.status is not None:
                self._set_status(reject.status)
            raise OSError(reject.errno, os.strerror(reject.errno), rel) from None
        self._set_status("")
        return new

    def _write_info(self, rel: str, text: str) -> None:
        if rel != "info/L3_MON/max_threshold_occupancy":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), rel)
        try:
            value = int(text.strip(), 0)
        except ValueError:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), rel) from None
        if not 0 <= value <= max(self.info.l3_cache_bytes.values(), default=0):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), rel)
        _put(self.dir / rel, f"{value}\n")

    def _load(self) -> ResctrlState:
        try:
            return read_resctrl_state(self.root, self.info)
        except TreeProblem as exc:
            raise OSError(errno.EIO, f"resctrl tree is inconsistent: {exc}", str(self.dir)) from None

    def _set_status(self, message: str) -> None:
        text = message if message.endswith("\n") else message + "\n"
        _put(self.dir / "info/last_cmd_status", text if message.strip() else "ok\n")

    def _make_group_dirs(self, target: Path) -> None:
        """mon_groups/ and mon_data/ of a new group, mirroring the root's monitoring domains and events."""
        (target / "mon_groups").mkdir()
        root_mon = self.dir / "mon_data"
        if root_mon.is_dir():
            for domain_dir in root_mon.iterdir():
                (target / "mon_data" / domain_dir.name).mkdir(parents=True)
                for event in domain_dir.iterdir():
                    (target / "mon_data" / domain_dir.name / event.name).write_text("0\n")

    def _sync(self, state: ResctrlState) -> None:
        """Write the files whose rendering changed, and the derived info/L3/bit_usage."""
        for name, group in state.groups.items():
            base = self.dir / name if name else self.dir
            for filename, text in render_group_files(state, group).items():
                path = base / filename
                if not path.is_file() or path.read_text() != text:
                    _put(path, text)
        bit_usage = self.dir / "info/L3/bit_usage"
        if bit_usage.parent.is_dir():
            text = render_bit_usage(state)
            if not bit_usage.is_file() or bit_usage.read_text() != text:
                _put(bit_usage, text)
