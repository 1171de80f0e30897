"""Read the kubelet's CPU and memory manager checkpoint files from a host tree.

These files are a kubelet-internal detail, so the agent treats them as a cross-check and change trigger
next to the PodResources API, never as the primary source. A file that fails its checksum is refused
instead of half-trusted: the kubelet would refuse it too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rmd_agent.errors import CheckpointError, HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_api.kubelet.checkpoint import (
    CheckpointFormatError,
    CpuManagerState,
    MemoryManagerState,
    decode_cpu_manager_state,
    decode_memory_manager_state,
)

CPU_MANAGER_STATE = "cpu_manager_state"
MEMORY_MANAGER_STATE = "memory_manager_state"
DEFAULT_KUBELET_DIR = "var/lib/kubelet"

_State = TypeVar("_State", CpuManagerState, MemoryManagerState)


def read_cpu_manager_state(
    fs: HostFS, kubelet_dir: str = DEFAULT_KUBELET_DIR
) -> CpuManagerState | Unsupported:
    """The CPU manager's checkpoint; Unsupported if the file does not exist.

    CheckpointError (with the path and what is wrong) if the file is not a valid checkpoint;
    HostReadError if it exists but cannot be read (e.g. permissions).
    """
    return _read(fs, f"{kubelet_dir.rstrip('/')}/{CPU_MANAGER_STATE}", "CPU", decode_cpu_manager_state)


def read_memory_manager_state(
    fs: HostFS, kubelet_dir: str = DEFAULT_KUBELET_DIR
) -> MemoryManagerState | Unsupported:
    """The memory manager's checkpoint; Unsupported if the file does not exist. Errors as for CPU."""
    return _read(
        fs, f"{kubelet_dir.rstrip('/')}/{MEMORY_MANAGER_STATE}", "memory", decode_memory_manager_state
    )


def _read(fs: HostFS, rel: str, manager: str, decode: Callable[[str, str], _State]) -> _State | Unsupported:
    shown = "/" + rel.lstrip("/")  # the path as it is on the host, whatever the agent's mount point
    try:
        text = fs.read_text(rel)
    except HostReadError as exc:
        if isinstance(exc.__cause__, UnicodeDecodeError):
            raise CheckpointError(f"{shown}: not UTF-8 text, so not a kubelet checkpoint") from exc
        if not fs.exists(rel):
            # The kubelet writes this file at startup under every policy ("none" too); when it is
            # missing, the kubelet is elsewhere or too old to have this manager.
            return Unsupported(
                f"{shown} does not exist (kubelet not running on this node, another --root-dir, "
                f"or a kubelet without the {manager} manager)"
            )
        raise
    try:
        return decode(text, shown)
    except CheckpointFormatError as exc:
        raise CheckpointError(f"{exc} (not trusted)") from exc
