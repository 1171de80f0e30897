"""What makes the exporter refresh: kubelet state files changing, PodResources answers changing.

* The kubelet rewrites `cpu_manager_state`, `memory_manager_state` and
  `device-plugins/kubelet_internal_checkpoint` by writing a temp file and renaming it over the old one, so
  the *directories* are watched (inotify CREATE / MOVED_TO / CLOSE_WRITE, matched by basename), as NFD
  does. inotify is reached through ctypes (no dependency); where it is unavailable, or the directory does
  not exist yet, the files' identity (inode, size, mtime) is polled instead.
* The pods' directories (nrt/pod_qos.py `pod_directories`): the kubelet's pod cgroup parents and its pod
  log directory are watched the same way for entries coming and going. A pod is in `List` from its
  admission, but only pods with exclusive resources change a state file; every pod gets a cgroup and a log
  directory when it starts and loses them when it is gone, and that is also when its QoS class (for the
  with-exclusive-resources fingerprint) becomes known.
  Each entry's path is also noted in an `EntryLog`, so the exporter reads the QoS classes of just those
  pods again (nrt/pod_qos.py `update`).
* A directory that does not exist yet (no device plugin ever registered: `device-plugins`) is awaited by the
  inotify watch of its parent when that is watched anyway, and polled only otherwise: a 2 s stat poll of
  such a directory was a fifth of an idle exporter's wake-ups.
* Only where those directories cannot be found (no kubelet pod cgroup under the host's /sys/fs/cgroup),
  PodResources `List` and the pods' QoS classes are polled instead and compared by content. Polling List
  was most of an idle exporter's CPU (a List of 500 pods, every 2 s).

Each only fires a RefreshTrigger; the exporter coalesces whatever fired while it was busy into one refresh.
The reasons tell it what to read again (exporter `stale_inputs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import struct
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

from rmd_agent.errors import KubeletUnavailable
from rmd_agent.kubelet.podresources import PodResources

log = logging.getLogger(__name__)

STATE_FILES = ("cpu_manager_state", "memory_manager_state", "device-plugins/kubelet_internal_checkpoint")

_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_FILE_CHANGED = _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE  # a state file replaced or written
_ENTRY_CHANGED = _IN_CREATE | _IN_DELETE | _IN_MOVED_FROM | _IN_MOVED_TO  # a pod directory came or went
_WATCH_MASK = _FILE_CHANGED | _ENTRY_CHANGED | _IN_DELETE_SELF | _IN_MOVE_SELF
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name


class RefreshTrigger:
    """Reasons to refresh, collected until the exporter takes them (so a burst becomes one refresh)."""

    def __init__(self) -> None:
        self._reasons: set[str] = set()
        self._event = asyncio.Event()

    def fire(self, reason: str) -> None:
        self._reasons.add(reason)
        self._event.set()

    def take(self) -> frozenset[str]:
        """The reasons collected so far, cleared."""
        reasons = frozenset(self._reasons)
        self._reasons.clear()
        self._event.clear()
        return reasons

    async def wait(self, seconds: float | None) -> frozenset[str]:
        """Wait until something fires (or `seconds` pass: empty set) and take the reasons."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), seconds)
        return self.take()


class EntryLog:
    """The directory entries that came or went since the last take(), for updating what was read from them
    instead of reading it all again. Incomplete (take() None: read it all) until the first take(), and
    whenever a change was seen without its name (polling, a queue overflow, the watches rebuilt)."""

    def __init__(self) -> None:
        self._entries: set[Path] = set()
        self._complete = False

    def add(self, entry: Path) -> None:
        self._entries.add(entry)

    def lost(self) -> None:
        self._complete = False

    def take(self) -> set[Path] | None:
        """The entries noted since the last take, or None when some change may be missing from them."""
        entries = self._entries if self._complete else None
        self._entries, self._complete = set(), True
        return entries


# --- inotify -----------------------------------------------------------------------------------------------


class InotifyUnavailable(OSError):
    pass


class _Inotify:
    """A non-blocking inotify instance; `events()` parses what one read returned."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name, use_errno=True)
            self._add = libc.inotify_add_watch
            init = libc.inotify_init1
        except (OSError, AttributeError) as exc:
            raise InotifyUnavailable(f"no inotify in the C library: {exc}") from exc
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.fd = int(init(_IN_NONBLOCK | _IN_CLOEXEC))
        if self.fd < 0:
            code = ctypes.get_errno()
            raise InotifyUnavailable(code, f"inotify_init1: {os.strerror(code)}")
        self.dirs: dict[int, Path] = {}

    def watch(self, directory: Path) -> None:
        wd = int(self._add(self.fd, os.fsencode(directory), _WATCH_MASK))
        if wd < 0:
            code = ctypes.get_errno()
            raise InotifyUnavailable(code, f"inotify_add_watch {directory}: {os.strerror(code)}")
        self.dirs[wd] = directory

    def read(self) -> list[tuple[Path | None, int, str]]:
        """(watched directory, mask, name) of the pending events; [] when there are none."""
        try:
            data = os.read(self.fd, 64 * 1024)
        except BlockingIOError:
            return []
        events = []
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
            offset += _EVENT.size + length
            events.append((self.dirs.get(wd), mask, os.fsdecode(raw.rstrip(b"\0"))))
            if mask & _IN_IGNORED:
                self.dirs.pop(wd, None)
        return events

    def close(self) -> None:
        os.close(self.fd)


Watched = Mapping[Path, frozenset[str] | None]  # directory -> basenames to react to; None: any entry


def _watched(kubelet_dir: Path, files: Iterable[str]) -> dict[Path, frozenset[str] | None]:
    """Directory -> basenames to react to."""
    dirs: dict[Path, set[str]] = {}
    for rel in files:
        path = kubelet_dir / rel
        dirs.setdefault(path.parent, set()).add(path.name)
    return {d: frozenset(names) for d, names in dirs.items()}


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _listing(path: Path) -> frozenset[str] | None:
    try:
        return frozenset(os.listdir(path))
    except OSError:
        return None


async def _poll(
    probes: Mapping[str, Callable[[], object]],
    fire: Callable[[str], None],
    interval: float,
    until: Callable[[], bool],
    entries: EntryLog | None = None,
) -> None:
    """Fire a probe's reason when its answer changes (what changed is not named: `entries` is told so);
    return once `until()` holds."""
    last = {reason: probe() for reason, probe in probes.items()}
    while not until():
        await asyncio.sleep(interval)
        for reason, probe in probes.items():
            now = probe()
            if now != last[reason]:
                last[reason] = now
                if entries is not None:
                    entries.lost()
                fire(reason)


def _probes(dirs: Watched, prefix: str) -> dict[str, Callable[[], object]]:
    """What polling compares: each watched file's identity, each watched directory's entries."""
    probes: dict[str, Callable[[], object]] = {}
    for directory, names in dirs.items():
        if names is None:
            probes[f"{prefix}:{directory}"] = functools.partial(_listing, directory)
        else:
            for name in sorted(names):
                probes[f"{prefix}:{name}"] = functools.partial(_stamp, directory / name)
    return probes


async def watch_kubelet_state(
    kubelet_dir: Path,
    trigger: RefreshTrigger,
    poll_interval: float,
    files: Iterable[str] = STATE_FILES,
) -> None:
    """Fire `trigger` whenever one of the kubelet's state files is replaced or written; runs until cancelled.

    Directories that exist are watched with inotify (or polled if inotify cannot be used); files in
    directories that do not exist yet (no device plugin ever registered, kubelet not started) are polled
    until the directory appears, and then the watches are set up again.
    """
    await watch_directories(_watched(Path(kubelet_dir), files), trigger, poll_interval, "kubelet-state")


async def watch_pod_directories(
    dirs: Iterable[Path], trigger: RefreshTrigger, poll_interval: float, entries: EntryLog | None = None
) -> None:
    """Fire `trigger` ("pods") whenever an entry comes or goes in one of `dirs`: the kubelet's pod cgroups
    and pod log directories, which appear when a pod starts and go when it is gone; each entry (its path)
    is noted in `entries`. Until cancelled."""
    await watch_directories(dict.fromkeys(dirs), trigger, poll_interval, "pods", entries)


async def watch_directories(
    dirs: Watched,
    trigger: RefreshTrigger,
    poll_interval: float,
    prefix: str,
    entries: EntryLog | None = None,
) -> None:
    """The watches of watch_kubelet_state and watch_pod_directories; reasons start with `prefix`.

    An absent directory whose parent is watched is awaited by that watch (its creation rebuilds the
    watches); others are polled until one appears."""
    while True:
        present = {d: names for d, names in dirs.items() if d.is_dir()}
        absent = {d: names for d, names in dirs.items() if d not in present}
        unwatched = {d: names for d, names in absent.items() if d.parent not in present}
        tasks = []
        if present:
            watch = _watch_present(
                present, trigger, poll_interval, frozenset(absent), prefix, entries=entries
            )
            tasks.append(asyncio.create_task(watch))
        if unwatched:
            poll = _poll(
                _probes(unwatched, prefix), trigger.fire, poll_interval, _any_exists(unwatched), entries
            )
            tasks.append(asyncio.create_task(poll))
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if entries is not None:
            entries.lost()
        trigger.fire(f"{prefix}:layout")


def _any_exists(dirs: Iterable[Path]) -> Callable[[], bool]:
    candidates = tuple(dirs)
    return lambda: any(d.is_dir() for d in candidates)


async def _watch_present(
    dirs: Watched,
    trigger: RefreshTrigger,
    poll_interval: float,
    awaited: frozenset[Path],
    prefix: str,
    *,
    entries: EntryLog | None = None,
) -> None:
    """inotify on existing directories until one disappears or an awaited one appears in them; if inotify
    is unavailable, polling until an awaited one appears (for ever when none is awaited)."""
    try:
        await _watch_with_inotify(dirs, trigger, awaited, prefix, entries)
    except InotifyUnavailable as exc:
        log.info("watching %s by polling every %gs: %s", prefix, poll_interval, exc)
        until = _any_exists(awaited) if awaited else lambda: False
        await _poll(_probes(dirs, prefix), trigger.fire, poll_interval, until, entries)


async def _watch_with_inotify(
    dirs: Watched,
    trigger: RefreshTrigger,
    awaited: frozenset[Path] = frozenset(),
    prefix: str = "kubelet-state",
    entries: EntryLog | None = None,
) -> None:
    """Returns when a watched directory goes away or one of `awaited` is created in a watched one (the
    watches must then be rebuilt); InotifyUnavailable if inotify cannot be used."""
    inotify = _Inotify()
    loop = asyncio.get_running_loop()
    relayout = asyncio.Event()

    def on_readable() -> None:
        for directory, mask, name in inotify.read():
            names = dirs.get(directory) if directory is not None else frozenset()
            appeared = directory is not None and directory / name in awaited
            if mask & _IN_Q_OVERFLOW:
                if entries is not None:
                    entries.lost()
                trigger.fire(f"{prefix}:overflow")
            elif mask & (_IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED) or appeared:
                relayout.set()
            elif names is None and mask & _ENTRY_CHANGED:
                if entries is not None and directory is not None:
                    entries.add(directory / name)
                trigger.fire(f"{prefix}:{directory}")
            elif names is not None and name in names and mask & _FILE_CHANGED:
                trigger.fire(f"{prefix}:{name}")

    try:
        for directory in dirs:
            inotify.watch(directory)
        loop.add_reader(inotify.fd, on_readable)
        # What came or went before the watches were in place is named nowhere: the next reading is a full one.
        if entries is not None:
            entries.lost()
        if any(d.is_dir() for d in awaited):  # created between the caller's look and the watches
            relayout.set()
        try:
            await relayout.wait()
        finally:
            loop.remove_reader(inotify.fd)
    finally:
        inotify.close()


# --- PodResources ------------------------------------------------------------------------------------------


def pods_key(pods: Iterable[PodResources]) -> tuple[PodResources, ...]:
    """The List answer in a canonical order, so equal answers compare equal (the client gives unchanged pods
    the same objects, so comparing them mostly compares identities)."""
    return tuple(sorted(pods, key=lambda p: (p.namespace, p.name)))


async def poll_pod_resources(
    list_pods: Callable[[], Awaitable[list[PodResources]]], trigger: RefreshTrigger, interval: float
) -> None:
    """Call `list_pods` every `interval` seconds, fire `trigger` when the answer changes; until cancelled."""
    last: tuple[PodResources, ...] | None = None
    failing = False
    while True:
        try:
            current = pods_key(await list_pods())
        except KubeletUnavailable as exc:
            if not failing:
                log.warning("PodResources polling: %s", exc)
            failing = True
        else:
            if failing:
                log.info("PodResources polling works again")
                trigger.fire("podresources:recovered")
            failing = False
            if last is not None and current != last:
                trigger.fire("podresources")
            last = current
        await asyncio.sleep(interval)


# --- pod QoS classes ---------------------------------------------------------------------------------------


async def poll_pod_qos(
    read_classes: Callable[[], Mapping[tuple[str, str], object]], trigger: RefreshTrigger, interval: float
) -> None:
    """Call `read_classes` every `interval` seconds and fire `trigger` when its answer changes."""
    last: dict[tuple[str, str], object] | None = None
    while True:
        current = dict(read_classes())
        if last is not None and current != last:
            trigger.fire("pod-qos")
        last = current
        await asyncio.sleep(interval)
