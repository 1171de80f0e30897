"""CPU time of the node (/proc/stat) and of every pod and container (cgroup v2 cpu.stat, v1 cpuacct.usage).

Reading cgroups costs one small file per pod and per container, where Kepler's per-process design reads
/proc/<pid>/stat for every process on the node (reference §2.1, §8). Pod cgroups are found by walking the
kubelet's pod root a fixed two levels deep (QoS directory, pod) and named by `cgroup_paths`, so both cgroup
drivers and every QoS class are covered without knowing the kubelet's configuration.

At 500 pods of 2 containers a sample would read 1,500 files, so the reader reads each pod's file every
sample and its containers' only every `split_every` to 2 `split_every` - 1 samples, one length per pod (the
power sampler splits a pod's energy among its containers over that window, and for a snapshot calls
`read_containers`). It remembers each pod's
container directories instead of listing every pod directory (dozens of entries each on a real node) every
time, lists the QoS directories holding the pods only when their link count (2 + subdirectories, on
cgroupfs as on tmpfs) moves, and keeps the files open (`KeptFiles`): the kernel writes a cgroup file's text
afresh on every read from offset 0, so one pread(2) per file replaces an open, a read and a close with a
walk of eight directories (bench/power_overhead.py measures both on a real cgroup2 tree). A pod is listed
again when a remembered container's file is gone (it exited or restarted), when the pod's own CPU time has
grown more than its known containers' by `UNEXPLAINED_NS` since they were last read (a new container is
running), and in any case every `RELIST_EVERY` reads (a new container that has not run yet, or runs
little). A pod whose own CPU time has not moved since its containers were last read is idle, and so are
its containers: their files are not read (most pods of a real node are idle most of the time).
Containers the caller names in `skip` are listed but not read (the power sampler skips those it cannot
name, such as the sandbox: their CPU time is the pod's remainder either way).
"""

from __future__ import annotations

import errno
import os
import resource
import weakref
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from rmd_agent.errors import HostReadError, Unsupported
from rmd_agent.hostfs import HostFS, read_small
from rmd_agent.power.cgroup_paths import QoS, parse_container_dir, parse_pod_dir

USER_HZ = 100  # /proc/stat counts in USER_HZ ticks, 100 on every architecture Linux exports to userspace
CGROUP = "sys/fs/cgroup"
PROC_STAT = "proc/stat"
# Where the kubelet puts pods under a hierarchy's root: the systemd and cgroupfs drivers, and both again
# under a kubelet root (kind and other nested setups).
POD_ROOTS = ("kubepods.slice", "kubepods", "kubelet.slice/kubelet-kubepods.slice", "kubelet/kubepods")
V1_CPUACCT = ("cpu,cpuacct", "cpuacct,cpu", "cpuacct", "cpu")
_QOS_DIR_NAMES = {"burstable", "besteffort"}
UNEXPLAINED_NS = 10_000_000  # 10 ms of a pod's CPU time in no known container: list the pod again
RELIST_EVERY = 30


@dataclass(frozen=True)
class ProcStat:
    busy_ticks: int
    total_ticks: int


def parse_proc_stat(text: str) -> ProcStat:
    """The aggregate `cpu` line: total = user+nice+system+idle+iowait+irq+softirq+steal (guest time is
    already inside user and nice); busy = total - idle - iowait."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = [int(v) for v in line.split()[1:9]]
            if len(fields) < 5:
                break
            fields += [0] * (8 - len(fields))
            total = sum(fields)
            return ProcStat(total - fields[3] - fields[4], total)
    raise ValueError("no aggregate 'cpu' line in /proc/stat")


def read_proc_stat(fs: HostFS) -> ProcStat:
    text = fs.read_text(PROC_STAT)
    try:
        return parse_proc_stat(text)
    except ValueError as exc:
        raise HostReadError(PROC_STAT, str(exc)) from None


class PodCpu(NamedTuple):  # a tuple: 500 are made per sample
    uid: str
    qos: QoS
    usage_ns: int  # the pod cgroup: its containers, the sandbox and anything else in it
    # id -> (runtime, usage ns); None when they were not read this time (CgroupCpuReader.split_every)
    containers: dict[str, tuple[str, int]] | None = None
    unread: tuple[str, ...] = ()  # ids of containers present but not read (CgroupCpuReader.skip)


@dataclass(frozen=True)
class PodCpuReading:
    pods: dict[str, PodCpu]
    complete: bool  # False when the pod root could not be listed: absent pods may still be running
    unreadable: frozenset[str] = frozenset()  # pods seen but not read (keep their last values)
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodRoot:
    version: int
    hierarchy: str  # relative to the host root: sys/fs/cgroup (v2) or sys/fs/cgroup/cpu,cpuacct (v1)
    root: str  # the kubelet's pod root under `hierarchy`, e.g. kubepods.slice


def find_pod_root(fs: HostFS) -> PodRoot | Unsupported:
    """The cgroup directory holding the kubelet's pods, in the hierarchy that accounts CPU time."""
    if fs.exists(f"{CGROUP}/cgroup.controllers"):
        hierarchies = [(2, CGROUP)]
    else:
        hierarchies = [(1, f"{CGROUP}/{name}") for name in V1_CPUACCT if fs.is_dir(f"{CGROUP}/{name}")]
        if not hierarchies:
            return Unsupported(f"no cgroup v2 mount and no v1 cpuacct hierarchy under /{CGROUP}")
    for version, hierarchy in hierarchies:
        for root in POD_ROOTS:
            if fs.is_dir(f"{hierarchy}/{root}"):
                return PodRoot(version, hierarchy, root)
    return Unsupported(f"no kubelet pod cgroup ({' or '.join(POD_ROOTS)}) under /{hierarchies[0][1]}")


class KeptFiles:
    """Small kernel files kept open between samples and read with pread(2) at offset 0.

    Only for files the kernel (or whatever stands in for it) updates in place: a file replaced by rename
    would be read stale through the old descriptor. A removed cgroup's open file fails with ENODEV; that,
    like a failed open, is raised as FileNotFoundError (and the file is closed). The caller closes the
    files it no longer reads with `forget` (a pod gone, a container no longer listed). At most `budget`
    files are kept (half the soft open-files limit by default); past that a file is opened for each read.
    """

    def __init__(self, budget: int | None = None) -> None:
        self.budget = default_budget() if budget is None else budget
        self._fds: dict[str, int] = {}
        weakref.finalize(self, _close_all, self._fds)  # a reader dropped without close()

    def read(self, path: str) -> bytes:
        fd = self._fds.get(path, -1)
        if fd < 0:
            if len(self._fds) >= self.budget:
                return read_small(path)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                self.budget = len(self._fds)  # out of descriptors: keep no more, read the rest as before
                return read_small(path)
            self._fds[path] = fd
        try:
            return os.pread(fd, 4096, 0)
        except OSError as exc:
            del self._fds[path]
            os.close(fd)
            if exc.errno in (errno.ENODEV, errno.ENOENT, errno.ESTALE):
                raise FileNotFoundError(exc.errno, exc.strerror, path) from None
            raise

    def forget(self, paths: Iterable[str]) -> None:
        """Close these files, if open."""
        for path in paths:
            fd = self._fds.pop(path, -1)
            if fd >= 0:
                os.close(fd)

    def close(self) -> None:
        _close_all(self._fds)

    def __len__(self) -> int:
        return len(self._fds)


def _close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()


MAX_KEPT_FILES = 65_536


def default_budget() -> int:
    """Half the soft open-files limit (less a margin), so the rest of the agent keeps the other half."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_KEPT_FILES
    return min(MAX_KEPT_FILES, max(0, int(soft) // 2 - 64))


def _parse_usage_ns(data: bytes, version: int) -> int:
    if version == 1:
        return int(data)  # cpuacct.usage is in nanoseconds
    # cpu.stat starts with "usage_usec <n>"
    first, _, _ = data.partition(b"\n")
    key, _, value = first.partition(b" ")
    if key != b"usage_usec":
        for line in data.splitlines():
            if line.startswith(b"usage_usec "):
                value = line.split()[1]
                break
        else:
            raise ValueError("no usage_usec in cpu.stat")
    return int(value) * 1000


def _subdirs(path: str) -> list[str]:
    with os.scandir(path) as entries:
        return [e.name for e in entries if e.is_dir(follow_symlinks=False)]


@dataclass
class _KnownPod:
    """A pod directory as last listed: its containers' ids, runtimes and usage files; the pod's and the read
    containers' summed CPU time when its containers were last read; reads since the listing and since the
    containers were last read (by a sample or `read_containers`)."""

    uid: str
    qos: QoS
    usage_path: str
    containers: list[tuple[str, str, str]]  # (id, runtime, usage file)
    pod_ns: int = 0
    containers_ns: int = 0
    reads: int = 0
    since_split: int = 0
    # the containers are read every split_every + slot reads: pods get different slots, so their reads
    # spread over the samples however they were brought into step (the agent's start, a scrape)
    slot: int = 0
    # the last read of the containers: read, unread
    last: tuple[dict[str, tuple[str, int]], tuple[str, ...]] = field(default_factory=lambda: ({}, ()))
    # False after a listing made for unexplained CPU time found no new container (it is the unread ones'):
    # no more listings for that until the next periodic one
    check_unexplained: bool = True


class CgroupCpuReader:
    """Reads pod CPU time on every `read()`, and the pods' containers' every `split_every` reads (and on
    `read_containers`), unless `containers` is off; finds the pod root on first use."""

    def __init__(self, fs: HostFS, split_every: int = 1, *, containers: bool = True) -> None:
        self.fs = fs
        self.split_every = split_every
        self.containers = containers
        self.root: PodRoot | None = None
        self.status: Unsupported | None = Unsupported("pod cgroups not looked for yet")
        self._known: dict[str, _KnownPod] = {}  # pod directory -> as last listed
        self._pod_names: dict[str, tuple[str, QoS] | None] = {}  # directory name -> parse_pod_dir
        self.listings = 0  # pod directories listed, for tests and the benchmark
        self.files = KeptFiles()
        self.skip: frozenset[str] = frozenset()  # container ids listed but not read
        self._reads = 0
        self._listed: tuple[list[tuple[str, str, QoS]], dict[str, int]] | None = None  # pods, link counts
        self._relist_dirs = False  # a pod was found gone: list the directories again

    def discover(self) -> Unsupported | None:
        self._known = {}
        self._listed = None
        self.files.close()
        found = find_pod_root(self.fs)
        if isinstance(found, Unsupported):
            self.root, self.status = None, found
            return found
        self.root, self.status = found, None
        return None

    def _pod(self, name: str, parents: tuple[str, ...]) -> tuple[str, QoS] | None:
        key = f"{'/'.join(parents)}/{name}"
        if key not in self._pod_names:
            self._pod_names[key] = parse_pod_dir(name, parents)
        return self._pod_names[key]

    def _pod_dirs(self, base: str, errors: list[str]) -> list[tuple[str, str, QoS]]:
        """(directory, uid, QoS) of every pod. Listed again only when a listed directory's link count
        (2 + its subdirectories, on cgroupfs as on tmpfs) has changed, a pod was found gone, or every
        RELIST_EVERY reads: three stat(2)s instead of listing 500 entries."""
        assert self.root is not None
        self._reads += 1
        listed = self._listed
        if listed is not None and not self._relist_dirs and self._reads % RELIST_EVERY:
            try:
                if all(os.stat(path).st_nlink == links for path, links in listed[1].items()):
                    return listed[0]
            except OSError:
                pass  # listing says what is wrong
        self._relist_dirs = False
        parents = tuple(self.root.root.split("/"))
        root_dir = os.path.join(base, self.root.root)
        links = {root_dir: os.stat(root_dir).st_nlink}  # before listing: a change during it shows next time
        top = _subdirs(root_dir)  # OSError: the caller's
        pod_dirs: list[tuple[str, str, QoS]] = []
        for name in top:
            rel = f"{self.root.root}/{name}"
            pod = self._pod(name, parents)
            if pod is not None:
                pod_dirs.append((rel, *pod))
            elif name in _QOS_DIR_NAMES or name.endswith(("-burstable.slice", "-besteffort.slice")):
                path = os.path.join(base, rel)
                try:
                    links[path] = os.stat(path).st_nlink
                    children = _subdirs(path)
                except OSError as exc:
                    errors.append(f"{rel}: {exc.strerror}")
                    links[path] = -1  # list it again next time
                    continue
                for child in children:
                    pod = self._pod(child, (*parents, name))
                    if pod is not None:
                        pod_dirs.append((f"{rel}/{child}", *pod))
        if len(self._pod_names) > 4 * len(pod_dirs) + 64:  # forget names of pods long gone
            self._pod_names = {}
        # a filesystem without subdirectory link counts (fewer than 2) is listed every time
        self._listed = (pod_dirs, links) if min(links.values()) >= 2 else None
        return pod_dirs

    def _list(self, pod_path: str, uid: str, qos: QoS, before: _KnownPod | None = None) -> _KnownPod:
        """The pod directory listed (the files of containers `before` knew and it does not are closed)."""
        assert self.root is not None
        usage_file = "cpu.stat" if self.root.version == 2 else "cpuacct.usage"
        if not self.containers:  # pods only
            return _KnownPod(uid, qos, f"{pod_path}/{usage_file}", [])
        self.listings += 1
        containers = []
        for child in _subdirs(pod_path):
            parsed = parse_container_dir(child)
            if parsed is not None:
                containers.append((parsed[1], parsed[0], f"{pod_path}/{child}/{usage_file}"))
        known = _KnownPod(uid, qos, f"{pod_path}/{usage_file}", containers)
        if before is not None:
            listed = {path for _cid, _runtime, path in containers}
            self.files.forget([path for _c, _r, path in before.containers if path not in listed])
            known.slot = before.slot
        return known

    def _read_containers(
        self, known: _KnownPod, version: int
    ) -> tuple[dict[str, tuple[str, int]], tuple[str, ...]] | None:
        """The known containers' CPU time and the ids skipped, or None when one of them is gone (list the
        pod again)."""
        out: dict[str, tuple[str, int]] = {}
        unread: list[str] = []
        skip = self.skip
        try:
            for cid, runtime, path in known.containers:
                if cid in skip:
                    unread.append(cid)
                    self.files.forget((path,))  # read before it was skipped
                else:
                    out[cid] = (runtime, _parse_usage_ns(self.files.read(path), version))
        except FileNotFoundError:
            return None
        return out, tuple(unread)

    def _read_listed(
        self, known: _KnownPod, version: int
    ) -> tuple[dict[str, tuple[str, int]], tuple[str, ...]] | None:
        """`_read_containers` of a fresh listing, whose files nobody else would close if the read fails."""
        try:
            return self._read_containers(known, version)
        except (OSError, ValueError):
            self.files.forget([path for _cid, _runtime, path in known.containers])
            raise

    def _read_pod(
        self, pod_path: str, known: _KnownPod, fresh: bool, split: bool
    ) -> tuple[_KnownPod, PodCpu]:
        """One pod's CPU time, and its containers' when `split` (or `fresh`: just listed) unless the pod has
        not moved since they were last read. Raises FileNotFoundError when the pod is gone."""
        assert self.root is not None
        version = self.root.version
        usage = _parse_usage_ns(self.files.read(known.usage_path), version)
        skip = self.skip
        if not fresh and (
            not split
            or (
                usage == known.pod_ns
                and tuple(c for c, _runtime, _path in known.containers if c in skip) == known.last[1]
            )
        ):
            # containers not due, or the pod idle since they were read (its CPU time counts theirs, so none
            # of them ran): their files stay open, unread
            known.reads += 1
            if not split:
                known.since_split += 1
                return known, PodCpu(known.uid, known.qos, usage)
            known.since_split = 0  # idle: what was read last is what they hold
            return known, PodCpu(known.uid, known.qos, usage, *known.last)
        read = self._read_listed(known, version) if fresh else self._read_containers(known, version)
        if not fresh and (
            read is None
            or (
                known.check_unexplained
                and (usage - known.pod_ns) - (_total(read[0]) - known.containers_ns) > UNEXPLAINED_NS
            )
        ):
            before = {c for c, _runtime, _path in known.containers}
            known = self._list(pod_path, known.uid, known.qos, known)
            known.check_unexplained = read is None or before != {c for c, _r, _p in known.containers}
            fresh = True
            read = self._read_listed(known, version)
        if read is None:  # a container exited between listing and reading
            known = self._list(pod_path, known.uid, known.qos, known)
            read = self._read_listed(known, version) or ({}, ())
        containers, unread = read
        known.pod_ns, known.containers_ns = usage, _total(containers)
        known.last = read
        known.since_split = 0
        if not fresh:
            known.reads += 1
        return known, PodCpu(known.uid, known.qos, usage, containers, unread)

    def read(self) -> PodCpuReading:
        if self.root is None and self.discover() is not None:
            return PodCpuReading({}, complete=False, errors=(str(self.status),))
        assert self.root is not None
        base = str(self.fs.path(self.root.hierarchy))
        pods: dict[str, PodCpu] = {}
        unreadable: set[str] = set()
        errors: list[str] = []
        try:
            pod_dirs = self._pod_dirs(base, errors)
        except OSError as exc:
            where = f"/{self.root.hierarchy}/{self.root.root}"
            self.root = None  # rediscover next time: the kubelet may have been reconfigured
            self._known = {}
            self._listed = None
            self.files.close()
            return PodCpuReading({}, complete=False, errors=(f"{where}: {exc.strerror}",))
        known_before, self._known = self._known, {}
        every, containers = self.split_every, self.containers
        read, version = self.files.read, self.root.version
        for rel, uid, qos in pod_dirs:
            known = known_before.get(rel)
            try:
                if (
                    known is not None
                    and known.reads + 1 < RELIST_EVERY
                    and (not containers or known.since_split + 1 < every + known.slot)
                ):  # most pods, most samples: the pod's own file only
                    pod = PodCpu(uid, qos, _parse_usage_ns(read(known.usage_path), version))
                    known.reads += 1
                    known.since_split += 1
                    self._known[rel] = known
                    pods[uid] = pod
                    continue
                pod_path = f"{base}/{rel}"
                fresh = known is None or known.reads + 1 >= RELIST_EVERY
                if fresh:
                    # a pod seen for the first time starts at a staggered point of the relist cycle, so pods
                    # that appeared together (the agent's start) are not all listed in one sample
                    new = known is None
                    known = self._list(pod_path, uid, qos, known)
                    if new:
                        known.reads = len(self._known) % RELIST_EVERY
                        known.slot = len(self._known) % every
                assert known is not None
                split = containers and known.since_split + 1 >= every + known.slot
                known, pod = self._read_pod(pod_path, known, fresh and containers, split)
            except FileNotFoundError:
                self._relist_dirs = True
                continue  # the pod went away between listing and reading
            except (OSError, ValueError) as exc:
                unreadable.add(uid)
                errors.append(f"{rel}: {getattr(exc, 'strerror', None) or exc}")
                continue
            self._known[rel] = known
            pods[uid] = pod
        for rel, known in known_before.items():  # gone, or unreadable now: open again when read again
            if rel not in self._known:
                self.files.forget([known.usage_path, *(path for _c, _r, path in known.containers)])
        return PodCpuReading(pods, True, frozenset(unreadable), tuple(errors))

    def read_containers(self, uids: Collection[str]) -> dict[str, PodCpu]:
        """The listed pods among `uids` read now with their containers (those gone or unreadable left
        out), outside the sampling cycle: for a caller that needs every container's share up to now."""
        if self.root is None or not uids or not self.containers:
            return {}
        base = str(self.fs.path(self.root.hierarchy))
        wanted = set(uids)
        out: dict[str, PodCpu] = {}
        for rel, known in list(self._known.items()):
            if known.uid not in wanted:
                continue
            reads = known.reads
            try:
                known, pod = self._read_pod(f"{base}/{rel}", known, fresh=False, split=True)
            except (OSError, ValueError):
                continue  # the next sample sees why
            known.reads = reads  # not a sample: the relist cycle counts samples
            self._known[rel] = known
            out[known.uid] = pod
        return out


def _total(containers: dict[str, tuple[str, int]]) -> int:
    return sum(usage for _runtime, usage in containers.values())
