from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from rmd_agent.errors import Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.observe.resctrl import format_schemata_line, parse_schemata, read_resctrl

MakeTree = Callable[[Mapping[str, str]], Path]
R = "sys/fs/resctrl"


def mounted_files(**extra: str) -> dict[str, str]:
    files = {
        f"{R}/info/last_cmd_status": "ok\n",
        f"{R}/info/L3/cbm_mask": "7ff\n",
        f"{R}/info/L3/min_cbm_bits": "1\n",
        f"{R}/info/L3/num_closids": "16\n",
        f"{R}/info/L3/shareable_bits": "0\n",
        f"{R}/info/MB/min_bandwidth": "10\n",
        f"{R}/info/MB/bandwidth_gran": "10\n",
        f"{R}/info/MB/delay_linear": "1\n",
        f"{R}/info/MB/num_closids": "8\n",
        f"{R}/schemata": "    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n",
        f"{R}/cpus_list": "0-3\n",
        f"{R}/mode": "shareable\n",
        f"{R}/mine/schemata": "    L3:0=600;1=7ff\n    MB:0=50;1=100\n",
        f"{R}/mine/cpus_list": "\n",
        f"{R}/mine/mode": "exclusive\n",
        "proc/mounts": "sysfs /sys sysfs rw 0 0\nresctrl /sys/fs/resctrl resctrl rw,relatime,mba_MBps 0 0\n",
    }
    return files | extra


def test_mounted_tree_reads_info_and_groups(make_tree: MakeTree) -> None:
    state = read_resctrl(HostFS(make_tree(mounted_files())))
    assert not isinstance(state, Unsupported)
    assert not isinstance(state.l3, Unsupported) and not isinstance(state.mba, Unsupported)
    assert (state.l3.cbm_mask, state.l3.ways, state.l3.sparse_masks, state.l3.cdp) == (
        0x7FF,
        11,
        False,
        False,
    )
    assert state.mba.mbps and state.mba.min_bandwidth == 10
    assert state.num_closids == 8  # the kernel takes the smallest limit of the enabled resources
    assert state.root.schemata == {"L3": {0: "7ff", 1: "7ff"}, "MB": {0: "100", 1: "100"}}
    assert state.root.cpus == {0, 1, 2, 3}
    assert [(g.name, g.mode, g.schemata["L3"][0]) for g in state.groups] == [("mine", "exclusive", "600")]


def test_sparse_masks_and_missing_mba(make_tree: MakeTree) -> None:
    files = {k: v for k, v in mounted_files().items() if "/info/MB/" not in k}
    files[f"{R}/info/L3/sparse_masks"] = "1\n"
    state = read_resctrl(HostFS(make_tree(files)))
    assert not isinstance(state, Unsupported)
    assert not isinstance(state.l3, Unsupported) and state.l3.sparse_masks
    assert isinstance(state.mba, Unsupported)
    assert "info/MB is absent" in state.mba.reason


@pytest.mark.parametrize(
    ("cpuinfo", "reason"),
    [
        ("flags\t: fpu sse rdt_a cat_l3\n", "supports RDT but resctrl is not mounted"),
        ("flags\t: fpu sse\n", "no RDT allocation"),
    ],
)
def test_unmounted_reason_distinguishes_hardware_from_setup(
    make_tree: MakeTree, cpuinfo: str, reason: str
) -> None:
    result = read_resctrl(HostFS(make_tree({"proc/cpuinfo": cpuinfo})))
    assert isinstance(result, Unsupported)
    assert reason in result.reason


def test_malformed_group_is_reported_not_raised(make_tree: MakeTree) -> None:
    result = read_resctrl(HostFS(make_tree(mounted_files(**{f"{R}/mine/schemata": "garbage\n"}))))
    assert isinstance(result, Unsupported)
    assert "mine/schemata" in result.reason


def test_schemata_round_trip() -> None:
    parsed = parse_schemata("L3:1=f;0=7ff\nMB:0=100\n")
    assert parsed == {"L3": {0: "7ff", 1: "f"}, "MB": {0: "100"}}
    assert format_schemata_line("L3", parsed["L3"]) == "L3:0=7ff;1=f"
    with pytest.raises(ValueError, match="ID=VALUE"):
        parse_schemata("L3:0\n")
