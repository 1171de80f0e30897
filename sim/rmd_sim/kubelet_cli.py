"""The simulated kubelet as a process: `python -m rmd_sim kubelet` (or `python -m rmd_sim.kubelet_cli`).

It serves PodResources (and device plugin Registration) for a host tree (rmd_sim.kubelet) and, with a
kubeconfig, is a node of that API server (rmd_sim.kubelet_api). Kept apart from both so that kubelet_api
can build on kubelet without kubelet needing kubelet_api back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rmd_api.cpuset import parse_cpu_list
from rmd_sim.devicemanager import PLUGIN_DIR_REL
from rmd_sim.kubelet import SOCKET_REL, CpuManagerPolicy, SimKubelet
from rmd_sim.kubelet_api import KubeletNode, api_client_from_kubeconfig


async def serve_kubelet(
    host_root: Path,
    *,
    reserved_cpus: Iterable[int] | None = None,
    cpu_manager_policy: CpuManagerPolicy | None = None,
    socket_path: Path | None = None,
    device_plugins: bool = True,
    get_enabled: bool = True,
    kubeconfig: Path | None = None,
    node_name: str = "",
    node_labels: Mapping[str, str] | None = None,
    node_ip: str = "127.0.0.1",
    ready: asyncio.Event | None = None,
) -> None:
    """Serve PodResources (and device plugin Registration) for a host tree until cancelled; with a
    kubeconfig, also be node `node_name` of that API server (rmd_sim.kubelet_api). `ready` is set once the
    socket accepts calls and, in API mode, the Node is registered."""
    kubelet = SimKubelet.from_host_tree(
        Path(host_root),
        reserved_cpus=reserved_cpus,
        cpu_manager_policy=cpu_manager_policy,
        socket_path=socket_path,
        device_plugins=device_plugins,
        get_enabled=get_enabled,
    )
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(kubelet)
        if kubeconfig is not None:
            api = stack.enter_context(api_client_from_kubeconfig(kubeconfig))
            node = KubeletNode(kubelet, api, node_name, labels=node_labels, node_ip=node_ip)
            await stack.enter_async_context(node)
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()  # forever; cancellation stops the server


def add_kubelet_command(subparsers: Any) -> None:
    """Register `kubelet` on argparse subparsers; sets `run(args) -> int` like rmd_sim.cli's commands."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "kubelet", help="serve the kubelet PodResources API for a simulated host tree"
    )
    _add_arguments(parser)
    parser.set_defaults(run=run_kubelet_command)


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host-root", type=Path, required=True, help="the simulated host tree")
    parser.add_argument("--socket", type=Path, default=None, help=f"default: <host root>/{SOCKET_REL}")
    parser.add_argument(
        "--reserved-cpus",
        default=None,
        help="cpu list, e.g. 0,4; default: reservedSystemCPUs of the tree's config",
    )
    parser.add_argument("--cpu-manager-policy", choices=["static", "none"], default=None)
    parser.add_argument(
        "--no-device-plugins",
        dest="device_plugins",
        action="store_false",
        help=f"do not serve device plugin Registration on <host root>/{PLUGIN_DIR_REL}/kubelet.sock",
    )
    parser.add_argument(
        "--get-disabled",
        dest="get_enabled",
        action="store_false",
        help="answer PodResources Get like a kubelet whose KubeletPodResourcesGet feature gate is off "
        '(UNKNOWN "PodResources API Get method disabled"; the default before Kubernetes 1.34)',
    )
    api = parser.add_argument_group("API server mode (be a node: register it, run the pods bound to it)")
    api.add_argument("--kubeconfig", type=Path, default=None, help="the API server and credentials")
    api.add_argument("--node-name", default="", help="the Node to register (required with --kubeconfig)")
    api.add_argument(
        "--node-label",
        dest="node_labels",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of the Node (repeatable)",
    )
    api.add_argument("--node-ip", default="127.0.0.1", help="the Node's InternalIP and the pods' hostIP")


def run_kubelet_command(args: argparse.Namespace) -> int:
    reserved = parse_cpu_list(args.reserved_cpus) if args.reserved_cpus is not None else None
    if args.kubeconfig is not None and not args.node_name:
        raise SystemExit("--node-name is required with --kubeconfig")

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve_kubelet(
                args.host_root,
                reserved_cpus=reserved,
                cpu_manager_policy=args.cpu_manager_policy,
                socket_path=args.socket,
                device_plugins=args.device_plugins,
                get_enabled=args.get_enabled,
                kubeconfig=args.kubeconfig,
                node_name=args.node_name,
                node_labels=dict(args.node_labels),
                node_ip=args.node_ip,
            )

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rmd_sim.kubelet_cli", description="simulated kubelet PodResources server"
    )
    _add_arguments(parser)
    return run_kubelet_command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
