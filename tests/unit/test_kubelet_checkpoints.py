"""The agent's checkpoint readers: where they look, and how a missing, tampered or unreadable file shows."""

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from rmd_agent.errors import CheckpointError, HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.checkpoints import read_cpu_manager_state, read_memory_manager_state
from rmd_api.kubelet.checkpoint import (
    MemoryBlock,
    MemoryTable,
    NumaNodeMemoryState,
    encode_cpu_manager_state_v2,
    encode_memory_manager_state,
)

MakeTree = Callable[[Mapping[str, str]], Path]
CPU_FILE = "var/lib/kubelet/cpu_manager_state"
MEMORY_FILE = "var/lib/kubelet/memory_manager_state"
ENTRIES = {"1b4e28ba-2fa1-11d2-883f-0016d3cca427": {"app": "2-3"}}


def test_reads_a_valid_cpu_manager_state(make_tree: MakeTree) -> None:
    root = make_tree({CPU_FILE: encode_cpu_manager_state_v2("static", "0-1,4-7", ENTRIES)})
    state = read_cpu_manager_state(HostFS(root))
    assert not isinstance(state, Unsupported)
    assert (state.policy_name, state.default_cpu_set, state.entries) == ("static", "0-1,4-7", ENTRIES)
    assert state.format_version == "v2"


def test_missing_cpu_manager_state_is_unsupported_with_the_host_path(make_tree: MakeTree) -> None:
    state = read_cpu_manager_state(HostFS(make_tree({})))
    assert isinstance(state, Unsupported)
    assert state.reason.startswith("/var/lib/kubelet/cpu_manager_state does not exist (kubelet not running")


def test_tampered_cpu_manager_state_is_not_trusted(make_tree: MakeTree) -> None:
    text = encode_cpu_manager_state_v2("static", "0-1,4-7", ENTRIES).replace('"2-3"', '"2-4"')
    root = make_tree({CPU_FILE: text})
    with pytest.raises(CheckpointError) as caught:
        read_cpu_manager_state(HostFS(root))
    message = str(caught.value)
    assert message.startswith("/var/lib/kubelet/cpu_manager_state: checksum mismatch: file says ")
    assert message.endswith("(not trusted)")


def test_cpu_manager_state_that_is_not_text_is_not_trusted(make_tree: MakeTree) -> None:
    root = make_tree({})
    (root / "var/lib/kubelet").mkdir(parents=True)
    (root / CPU_FILE).write_bytes(b'{"policyName":"\xff"}')
    with pytest.raises(CheckpointError, match="cpu_manager_state: not UTF-8 text"):
        read_cpu_manager_state(HostFS(root))


def test_an_unreadable_checkpoint_is_a_host_read_error_not_unsupported(make_tree: MakeTree) -> None:
    root = make_tree({})
    (root / CPU_FILE).mkdir(parents=True)  # a directory: exists, but cannot be read as a file
    with pytest.raises(HostReadError):
        read_cpu_manager_state(HostFS(root))


def test_kubelet_dir_is_configurable(make_tree: MakeTree) -> None:
    root = make_tree({"data/kubelet/cpu_manager_state": encode_cpu_manager_state_v2("none", "0-3", {})})
    state = read_cpu_manager_state(HostFS(root), "/data/kubelet/")
    assert not isinstance(state, Unsupported)
    assert state.default_cpu_set == "0-3"
    missing = read_cpu_manager_state(HostFS(root))
    assert isinstance(missing, Unsupported)


def test_reads_a_valid_memory_manager_state(make_tree: MakeTree) -> None:
    node = NumaNodeMemoryState(1, {"memory": MemoryTable(8 << 30, 1 << 30, 7 << 30, 1 << 30, 6 << 30)}, (0,))
    blocks = (MemoryBlock((0,), "memory", 1 << 30),)
    text = encode_memory_manager_state("Static", {0: node}, {"pod": {"app": blocks}})
    state = read_memory_manager_state(HostFS(make_tree({MEMORY_FILE: text})))
    assert not isinstance(state, Unsupported)
    assert (state.policy_name, state.machine_state, state.entries) == (
        "Static",
        {0: node},
        {"pod": {"app": blocks}},
    )


def test_missing_and_tampered_memory_manager_state(make_tree: MakeTree) -> None:
    missing = read_memory_manager_state(HostFS(make_tree({})))
    assert isinstance(missing, Unsupported)
    assert "/var/lib/kubelet/memory_manager_state does not exist" in missing.reason
    text = encode_memory_manager_state("Static", {}, {}).replace("Static", "None")
    with pytest.raises(CheckpointError, match=r"^/var/lib/kubelet/memory_manager_state: checksum mismatch"):
        read_memory_manager_state(HostFS(make_tree({MEMORY_FILE: text})))
