"""A network of its own for one simulated node's agent: a Linux network namespace joined to this one by a veth
pair, so that a test can cut the node off the network for real (and let it back on).

    with AgentNetwork("worker-node-3", api_server=("127.0.0.1", 6443)) as net:
        ...  # run the agent with net.exec_prefix(), listening on net.address
        net.cut()       # the node's end of the link goes down: packets both ways are dropped
        net.restore()

Layout (addresses from 10.250.0.0/16, this process's own test subnet, one /30 per network):

    this namespace                               the node's namespace
    <host_ifname>  <host_address>/30  ==veth==  eth0  <address>/30    (+ lo)
    TcpRelay on <host_address>:<relay_port>  ->  the API server on loopback

The API server listens on 127.0.0.1 only, which the node's namespace cannot reach; the relay forwards to it,
and `write_kubeconfig` rewrites a kubeconfig to go through the relay while still checking the API server's
certificate for "localhost" (tls-server-name). Cutting the link takes down the node's end of the veth: the
route here stays (marked linkdown), so connections time out as on a real partition instead of failing fast or
leaking out through the default route.

Needs CAP_NET_ADMIN and CAP_SYS_ADMIN (`can_create_namespaces`). Namespaces are named
`rmdsim-<pid>-<n>`; `remove_stale` deletes those whose process is gone (a run that was killed), and deleting
a namespace deletes its veth pair with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import os
import re
import shutil
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml
from pyroute2 import IPRoute, NetNS, netns

SUBNET = ipaddress.IPv4Network("10.250.0.0/16")  # the pool the /30s come from
NETNS_DIR = Path("/run/netns")
_PREFIX = "rmdsim-"
_NAME = re.compile(r"rmdsim-(\d+)-(\d+)")
_NS_IFNAME = "eth0"
_counter = itertools.count()


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be created here (no privileges, or no `nsenter`)."""


def can_create_namespaces() -> str | None:
    """None when this process can create network namespaces and veth pairs, else why not."""
    if shutil.which("nsenter") is None:
        return "nsenter (util-linux) is not installed"
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
                net_admin, sys_admin = 1 << 12, 1 << 21
                if caps & net_admin and caps & sys_admin:
                    return None
                return "CAP_NET_ADMIN and CAP_SYS_ADMIN are needed (run as root)"
    return "cannot read this process's capabilities"


def remove_stale() -> list[str]:
    """Delete the namespaces this module made in processes that no longer exist; returns their names."""
    removed = []
    for name in netns.listnetns():
        match = _NAME.fullmatch(name)
        if match is None or Path(f"/proc/{match.group(1)}").exists():
            continue
        with contextlib.suppress(OSError):
            netns.remove(name)
            removed.append(name)
    return removed


def _subnet(index: int) -> ipaddress.IPv4Network:
    """The index-th /30 of this process (spread over SUBNET by pid so concurrent runs rarely collide)."""
    blocks = SUBNET.num_addresses // 4
    start = (os.getpid() * 64) % blocks
    base = int(SUBNET.network_address) + 4 * ((start + index) % blocks)
    return ipaddress.IPv4Network(f"{ipaddress.IPv4Address(base)}/30")


class TcpRelay:
    """Forwards every TCP connection accepted on (host, port) to `target`, on an event loop of its own thread
    (so it keeps relaying whatever the caller's loop is doing)."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.host = host
        self.target = target
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"relay-{host}", daemon=True)
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    def start(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.get_running_loop().create_task(self._pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                dst.close()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


class AgentNetwork:
    """A network namespace with one veth link to this namespace and a relay to the API server (see the
    module docstring). `create()`/`destroy()`, or use it as a context manager."""

    def __init__(self, label: str, *, api_server: tuple[str, int]) -> None:
        self.label = label
        index = next(_counter)
        self.name = f"{_PREFIX}{os.getpid()}-{index}"
        self.host_ifname = f"rmv{os.getpid() % 100000}x{index}"[:15]
        net = _subnet(index)
        self.host_address, self.address = (str(a) for a in net.hosts())
        self.prefixlen = net.prefixlen
        self.api_server = api_server
        self.relay: TcpRelay | None = None
        self._created = False

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    def exec_prefix(self) -> list[str]:
        """Prepended to a command line, runs the command inside the namespace (nothing else changes)."""
        return ["nsenter", f"--net={self.path}", "--"]

    def create(self) -> Self:
        reason = can_create_namespaces()
        if reason is not None:
            raise NetnsUnavailable(reason)
        remove_stale()
        try:
            netns.create(self.name)
            self._created = True
            with IPRoute() as ipr:
                ipr.link(
                    "add",
                    ifname=self.host_ifname,
                    kind="veth",
                    peer={"ifname": _NS_IFNAME, "net_ns_fd": self.name},
                )
                (index,) = ipr.link_lookup(ifname=self.host_ifname)
                ipr.addr("add", index=index, address=self.host_address, prefixlen=self.prefixlen)
                ipr.link("set", index=index, state="up")
            with NetNS(self.name) as ns:
                for ifname in ("lo", _NS_IFNAME):
                    (index,) = ns.link_lookup(ifname=ifname)
                    if ifname == _NS_IFNAME:
                        ns.addr("add", index=index, address=self.address, prefixlen=self.prefixlen)
                    ns.link("set", index=index, state="up")
            self.relay = TcpRelay(self.host_address, self.api_server).start()
        except BaseException:
            self.destroy()
            raise
        return self

    def _set_link(self, state: str) -> None:
        with NetNS(self.name) as ns:
            (index,) = ns.link_lookup(ifname=_NS_IFNAME)
            ns.link("set", index=index, state=state)

    def cut(self) -> None:
        """Take the node's end of the link down: nothing gets through either way until `restore()`."""
        self._set_link("down")

    def restore(self) -> None:
        self._set_link("up")

    def write_kubeconfig(self, source: Path, dest: Path) -> Path:
        """`source` rewritten to reach the API server through the relay (certificate still checked)."""
        assert self.relay is not None, "create() first"
        config: dict[str, Any] = yaml.safe_load(source.read_text())
        for cluster in config.get("clusters") or ():
            cluster["cluster"]["server"] = f"https://{self.host_address}:{self.relay.port}"
            cluster["cluster"]["tls-server-name"] = "localhost"
        dest.write_text(yaml.safe_dump(config, sort_keys=False))
        dest.chmod(0o600)
        return dest

    def destroy(self) -> None:
        """Stop the relay, delete the namespace (its veth pair goes with it). Safe to call twice."""
        if self.relay is not None:
            self.relay.stop()
            self.relay = None
        if self._created:
            with contextlib.suppress(OSError):
                netns.remove(self.name)
            self._created = False
        with IPRoute() as ipr, contextlib.suppress(Exception):
            for index in ipr.link_lookup(ifname=self.host_ifname):
                ipr.link("del", index=index)

    def __enter__(self) -> Self:
        return self.create()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()
