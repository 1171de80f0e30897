import dataclasses
import errno
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmd_sim.cli import main
from rmd_sim.hosttree import write_host_tree
from rmd_sim.resctrl import RESCTRL, SimResctrl, check_resctrl_tree
from rmd_sim.spec import NodeSpec

# 2 sockets x 4 cores x 2 threads: CPUs 0-15, L3 domains 0 and 1, 11-bit CBM, 4 CLOSIDs.
SMALL = NodeSpec(name="small", cores_per_socket=4, num_closids=4)
EMPTY_ROOT_SCHEMATA = "    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n"


def make(tmp_path: Path, **overrides: object) -> tuple[Path, SimResctrl]:
    root = tmp_path / "node"
    write_host_tree(dataclasses.replace(SMALL, **overrides), root)  # type: ignore[arg-type]
    return root, SimResctrl(root)


def put(root: Path, rel: str, text: str) -> None:
    path = root / RESCTRL / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def clone_group(root: Path, src: str, dst: str) -> None:
    """Create a group behind the kernel's back, as a broken tree would have it."""
    shutil.copytree(root / RESCTRL / src, root / RESCTRL / dst)


def files(root: Path) -> dict[str, str]:
    """Every resctrl file except last_cmd_status, to prove a refused operation changed nothing."""
    base = root / RESCTRL
    return {
        str(p.relative_to(base)): p.read_text()
        for p in sorted(base.rglob("*"))
        if p.is_file() and p.name != "last_cmd_status"
    }


def failing(sim: SimResctrl, rel: str, data: str) -> OSError:
    with pytest.raises(OSError) as info:
        sim.write(rel, data)
    return info.value


# -- the checker -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        NodeSpec.default(),  # the large tree is checked where test_sim_hosttree builds it
        SMALL,
        dataclasses.replace(SMALL, sparse_masks=1, mba=False, l3_cdp_capable=False),
        dataclasses.replace(SMALL, mba_mbps=True, shareable_bits="600", min_cbm_bits=2, l3_mon=False),
    ],
    ids=["default", "small", "sparse-no-mba", "mbps-shareable"],
)
def test_fresh_trees_are_valid(tmp_path: Path, spec: NodeSpec) -> None:
    write_host_tree(spec, tmp_path / "node")
    assert check_resctrl_tree(tmp_path / "node") == []


def test_unmounted_tree_has_nothing_to_check(tmp_path: Path) -> None:
    root, _ = make(tmp_path)
    shutil.rmtree(root / RESCTRL)
    assert check_resctrl_tree(root) == []


def one_violation(root: Path, *fragments: str) -> str:
    violations = check_resctrl_tree(root)
    assert len(violations) == 1, violations
    for fragment in fragments:
        assert fragment in violations[0], violations
    return violations[0]


def test_checker_rejects_mask_outside_cbm_mask(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    put(root, "g/schemata", "L3:0=fff;1=7ff\nMB:0=100;1=100\n")
    one_violation(root, "group 'g'", "L3 domain 0", "fff", "cbm_mask 7ff")


def test_checker_rejects_non_contiguous_mask_unless_sparse(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    put(root, "g/schemata", "L3:0=7ff;1=505\nMB:0=100;1=100\n")
    one_violation(root, "group 'g'", "domain 1", "505", "non-consecutive")
    put(root, "info/L3/sparse_masks", "1\n")
    assert check_resctrl_tree(root) == []


def test_checker_rejects_too_few_bits(tmp_path: Path) -> None:
    root, sim = make(tmp_path, min_cbm_bits=2)
    sim.mkdir("g")
    put(root, "g/schemata", "L3:0=1;1=7ff\nMB:0=100;1=100\n")
    one_violation(root, "group 'g'", "domain 0", "min_cbm_bits=2")
    put(root, "g/schemata", "L3:0=0;1=7ff\nMB:0=100;1=100\n")
    one_violation(root, "group 'g'", "domain 0", "empty")


def test_checker_rejects_more_groups_than_closids(tmp_path: Path) -> None:
    root, sim = make(tmp_path, num_closids=2)
    sim.mkdir("a")
    clone_group(root, "a", "b")
    one_violation(root, "3 control groups", "num_closids=2")


def test_checker_takes_the_smallest_num_closids(tmp_path: Path) -> None:
    root, sim = make(tmp_path, num_closids=4)
    sim.mkdir("a")
    put(root, "info/MB/num_closids", "1\n")
    one_violation(root, "2 control groups", "num_closids=1")


def test_checker_rejects_exclusive_group_overlapping_root(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    put(root, "g/schemata", "L3:0=3;1=3\nMB:0=100;1=100\n")
    put(root, "g/mode", "exclusive\n")
    violations = check_resctrl_tree(root)
    assert len(violations) == 2  # one per domain
    assert all("group 'g' is exclusive" in v and "root group mask 7ff" in v for v in violations)
    put(root, "schemata", "L3:0=7fc;1=7fc\nMB:0=100;1=100\n")
    assert check_resctrl_tree(root) == []


def test_checker_rejects_exclusive_group_on_shareable_bits(tmp_path: Path) -> None:
    root, sim = make(tmp_path, shareable_bits="600")
    sim.mkdir("g")
    put(root, "schemata", "L3:0=0ff;1=0ff\nMB:0=100;1=100\n")
    put(root, "g/schemata", "L3:0=700;1=100\nMB:0=100;1=100\n")
    put(root, "g/mode", "exclusive\n")
    one_violation(root, "group 'g' is exclusive", "domain 0", "shareable_bits 600")


def test_checker_rejects_cpu_in_two_groups_or_none(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    put(root, "g/cpus_list", "2-3\n")
    put(root, "g/cpus", "0000c\n")
    violations = check_resctrl_tree(root)
    assert violations == [
        "cpu 2 is in more than one group: root group, group 'g'",
        "cpu 3 is in more than one group: root group, group 'g'",
    ]
    put(root, "g/cpus_list", "\n")
    put(root, "g/cpus", "00000\n")
    put(root, "cpus_list", "1-15\n")
    put(root, "cpus", "0fffe\n")
    one_violation(root, "cpu 0 is in no group")


def test_checker_rejects_cpus_and_cpus_list_disagreeing(tmp_path: Path) -> None:
    root, _ = make(tmp_path)
    put(root, "cpus", "0fffe\n")
    one_violation(root, "root group", "cpus 0fffe", "disagree")


def test_checker_rejects_missing_and_unknown_domains(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    put(root, "g/schemata", "L3:0=7ff\nMB:0=100;1=100\n")
    one_violation(root, "group 'g'", "L3 lacks domain 1")
    put(root, "g/schemata", "L3:0=7ff;1=7ff;2=7ff\nMB:0=100;1=100\n")
    one_violation(root, "group 'g'", "L3 domain 2 is not a domain")
    put(root, "g/schemata", "L3:0=7ff;1=7ff\n")
    one_violation(root, "group 'g'", "no MB line")


def test_checker_rejects_mb_values(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    put(root, "g/schemata", "L3:0=7ff;1=7ff\nMB:0=5;1=100\n")
    one_violation(root, "group 'g'", "MB domain 0", "outside [10,100]")
    put(root, "g/schemata", "L3:0=7ff;1=7ff\nMB:0=100;1=15\n")
    one_violation(root, "group 'g'", "MB domain 1", "bandwidth_gran=10")


def test_checker_accepts_mbps_values_in_mbps_mode(tmp_path: Path) -> None:
    root, sim = make(tmp_path, mba_mbps=True)
    sim.mkdir("g")
    put(root, "g/schemata", "L3:0=7ff;1=7ff\nMB:0=5;1=12345\n")
    assert check_resctrl_tree(root) == []


def test_checker_rejects_unknown_mode_and_garbage(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    put(root, "g/mode", "bogus\n")
    one_violation(root, "group 'g'", "mode 'bogus'")
    put(root, "g/mode", "shareable\n")
    put(root, "g/schemata", "garbage\n")
    one_violation(root, "group 'g'", "schemata")


def test_checker_rejects_task_in_two_groups(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    put(root, "tasks", "42\n")
    put(root, "g/tasks", "42\n")
    one_violation(root, "task 42", "root group, group 'g'")


def test_cli_check_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, sim = make(tmp_path)
    assert main(["check", str(root)]) == 0
    sim.mkdir("g")
    put(root, "g/schemata", "L3:0=5;1=7ff\nMB:0=100;1=100\n")
    assert main(["check", str(root)]) == 1
    assert "non-consecutive" in capsys.readouterr().out


# -- the simulated kernel: mkdir / rmdir -----------------------------------------------------------


def test_mkdir_creates_a_group_with_the_kernel_defaults(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    g = root / RESCTRL / "g"
    assert (g / "schemata").read_text() == EMPTY_ROOT_SCHEMATA  # everything not held exclusively
    assert (g / "cpus_list").read_text() == "\n"
    assert (g / "cpus").read_text() == "0000\n"
    assert (g / "mode").read_text() == "shareable\n"
    assert (g / "tasks").read_text() == ""
    assert (g / "mon_groups").is_dir()
    assert (g / "mon_data/mon_L3_01/llc_occupancy").read_text() == "0\n"
    assert sim.last_cmd_status == "ok"
    assert sim.groups() == ["g"]
    assert check_resctrl_tree(root) == []


def test_new_group_gets_the_lowest_run_of_non_exclusive_bits(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("ex")
    sim.write("ex/schemata", "L3:0=0f0;1=700\n")
    sim.write("schemata", "L3:0=00f;1=0ff\n")
    sim.write("ex/mode", "exclusive\n")
    sim.mkdir("g")
    # domain 0: free bits 00f and 700 -> lowest run 00f; domain 1: everything but 700 -> 0ff
    assert sim.read("g/schemata") == "    L3:0=00f;1=0ff\n    MB:0=100;1=100\n"
    assert check_resctrl_tree(root) == []


def test_mkdir_without_free_closid_is_enospc(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    for name in ("a", "b", "c"):  # num_closids=4 and the root holds CLOSID 0
        sim.mkdir(name)
    with pytest.raises(OSError) as info:
        sim.mkdir("d")
    assert info.value.errno == errno.ENOSPC
    assert sim.last_cmd_status == "Out of CLOSIDs"
    assert not (root / RESCTRL / "d").exists()
    sim.rmdir("b")
    sim.mkdir("d")  # the CLOSID came back
    assert sim.groups() == ["a", "c", "d"]


def test_mkdir_when_every_bit_is_exclusive_is_enospc(tmp_path: Path) -> None:
    _, sim = make(tmp_path)
    sim.mkdir("ex")
    sim.write("ex/schemata", "L3:0=7fe;1=7fe\n")
    sim.write("schemata", "L3:0=001;1=001\n")
    sim.write("ex/mode", "exclusive\n")
    sim.write("mode", "exclusive\n")  # the root group may be exclusive too
    with pytest.raises(OSError) as info:
        sim.mkdir("g")
    assert info.value.errno == errno.ENOSPC
    assert sim.last_cmd_status == "No space on L3:0"
    assert sim.groups() == ["ex"]


def test_mkdir_and_rmdir_refusals(tmp_path: Path) -> None:
    _, sim = make(tmp_path)
    sim.mkdir("g")
    cases = [
        (sim.mkdir, "g", errno.EEXIST),
        (sim.mkdir, "info", errno.EEXIST),
        (sim.mkdir, "g/mon_groups/m", errno.EPERM),
        (sim.rmdir, "/", errno.EBUSY),
        (sim.rmdir, "info", errno.EPERM),
        (sim.rmdir, "nope", errno.ENOENT),
        (sim.rmdir, "schemata", errno.ENOTDIR),
    ]
    for op, name, err in cases:
        with pytest.raises(OSError) as info:
            op(name)
        assert info.value.errno == err, (op.__name__, name)


def test_rmdir_returns_cpus_and_tasks_to_the_root(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    sim.write("g/cpus_list", "4-7\n")
    sim.write("g/tasks", "321\n")
    assert sim.read("cpus_list") == "0-3,8-15\n"
    sim.rmdir("g")
    assert sim.read("cpus_list") == "0-15\n"
    assert sim.read("cpus") == "ffff\n"
    assert sim.read("tasks") == "321\n"
    assert not (root / RESCTRL / "g").exists()
    assert check_resctrl_tree(root) == []


# -- the simulated kernel: schemata ----------------------------------------------------------------


def test_partial_schemata_write_merges_and_rounds_mb(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    assert sim.write("g/schemata", "L3:1=3\n") == len("L3:1=3\n")
    sim.write("g/schemata", "  MB:0=55\n")
    assert sim.read("g/schemata") == "    L3:0=7ff;1=003\n    MB:0= 60;1=100\n"
    sizes = sim.read("g/size").splitlines()
    per_bit = SMALL.l3_bytes // 11
    assert sizes == [f"    L3:0={11 * per_bit};1={2 * per_bit}", "    MB:0=60;1=100"]
    assert sim.last_cmd_status == "ok"
    assert check_resctrl_tree(root) == []


@pytest.mark.parametrize(
    ("data", "status"),
    [
        ("L3:0=5\n", "The mask 5 has non-consecutive 1-bits"),
        ("L3:0=800\n", "Mask out of range"),
        ("L3:0=0\n", "Mask out of range"),
        ("L3:0=zz\n", "Non-hex character in the mask zz"),
        ("L3:0=3;0=3\n", "Duplicate domain 0"),
        ("L3:0=3\nL3:0=7\n", "Duplicate domain 0"),
        ("L3:9=3\n", "ok"),  # an unknown domain fails without a message in the kernel
        ("L3 0=3\n", "Missing ':'"),
        ("L3:\n", "Missing 'L3' value"),
        ("\n", "Missing ':'"),
        ("L2:0=3\n", "Unknown or unsupported resource name 'L2'"),
        ("L3:x=3\n", "Missing '=' or non-numeric domain"),
        ("L3:0=3;;1=3\n", "Missing '=' or non-numeric domain"),
        ("MB:0=5\n", "MB value 5 out of range [10,100]"),
        ("MB:0=101\n", "MB value 101 out of range [10,100]"),
        ("MB:0=abc\n", "Invalid MB value abc"),
        ("L3:0=3\nL3:1=5\n", "The mask 5 has non-consecutive 1-bits"),  # all or nothing
    ],
)
def test_invalid_schemata_is_einval_with_the_kernel_message(tmp_path: Path, data: str, status: str) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    before = files(root)
    err = failing(sim, "g/schemata", data)
    assert err.errno == errno.EINVAL
    assert sim.last_cmd_status == status
    assert files(root) == before


def test_schemata_without_trailing_newline_keeps_the_old_status(tmp_path: Path) -> None:
    _, sim = make(tmp_path)
    failing(sim, "schemata", "L3:0=5\n")
    err = failing(sim, "schemata", "L3:0=3")
    assert err.errno == errno.EINVAL
    assert sim.last_cmd_status == "The mask 5 has non-consecutive 1-bits"  # rejected before the reset
    assert sim.read("schemata") == EMPTY_ROOT_SCHEMATA


def test_min_cbm_bits_and_sparse_masks(tmp_path: Path) -> None:
    _, sim = make(tmp_path / "a", min_cbm_bits=2)
    failing(sim, "schemata", "L3:0=1\n")
    assert sim.last_cmd_status == "Need at least 2 bits in the mask"
    root, sim = make(tmp_path / "b", sparse_masks=1)
    sim.write("schemata", "L3:0=505\n")
    assert sim.read("schemata").startswith("    L3:0=505;")
    assert check_resctrl_tree(root) == []


def test_mbps_mode_takes_raw_values(tmp_path: Path) -> None:
    _, sim = make(tmp_path, mba_mbps=True)
    sim.write("schemata", "MB:0=2048\n")
    assert "MB:0=2048;1=4294967295" in sim.read("schemata")


# -- the simulated kernel: exclusive mode ----------------------------------------------------------


def test_exclusive_mode_rules(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("ex")
    sim.mkdir("other")
    sim.write("ex/schemata", "L3:0=3;1=3\n")
    err = failing(sim, "ex/mode", "exclusive\n")
    assert (err.errno, sim.last_cmd_status) == (errno.EINVAL, "Schemata overlaps")
    sim.write("schemata", "L3:0=7f0;1=7f0\n")
    sim.write("other/schemata", "L3:0=7f0;1=7f0\n")
    sim.write("ex/mode", "exclusive\n")
    assert sim.read("ex/mode") == "exclusive\n"
    assert sim.read("info/L3/bit_usage") == "0=SSSSSSS00EE;1=SSSSSSS00EE\n"
    failing(sim, "schemata", "L3:0=7fe\n")
    assert sim.last_cmd_status == "Overlaps with exclusive group"
    failing(sim, "ex/schemata", "L3:0=18\n")
    assert sim.last_cmd_status == "Overlaps with other group"
    sim.write("ex/schemata", "L3:0=c\n")  # unused bits are fine
    assert sim.read("info/L3/bit_usage") == "0=SSSSSSSEE00;1=SSSSSSS00EE\n"
    assert check_resctrl_tree(root) == []


def test_exclusive_mode_must_avoid_shareable_bits(tmp_path: Path) -> None:
    _, sim = make(tmp_path, shareable_bits="600")
    sim.mkdir("g")
    sim.write("schemata", "L3:0=0ff;1=0ff\n")
    sim.write("g/schemata", "L3:0=700;1=700\n")
    failing(sim, "g/mode", "exclusive\n")
    assert sim.last_cmd_status == "Schemata overlaps"
    assert sim.read("info/L3/bit_usage") == "0=XXSSSSSSSSS;1=XXSSSSSSSSS\n"  # X: hardware and software share
    sim.write("g/schemata", "L3:0=100\n")
    assert sim.read("info/L3/bit_usage") == "0=HHSSSSSSSSS;1=XXSSSSSSSSS\n"  # H: only hardware uses them


@pytest.mark.parametrize(
    ("group", "data", "status"),
    [
        ("g", "bogus\n", "Unknown or unsupported mode"),
        ("g", "pseudo-locksetup\n", "Pseudo-locking not supported"),
        ("", "pseudo-locksetup\n", "Cannot pseudo-lock default group"),
    ],
)
def test_mode_refusals(tmp_path: Path, group: str, data: str, status: str) -> None:
    _, sim = make(tmp_path)
    sim.mkdir("g")
    err = failing(sim, f"{group}/mode" if group else "mode", data)
    assert (err.errno, sim.last_cmd_status) == (errno.EINVAL, status)
    assert failing(sim, "g/mode", "shareable").errno == errno.EINVAL  # no trailing newline


# -- the simulated kernel: cpus, cpus_list, tasks --------------------------------------------------


def test_cpus_move_between_groups(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("a")
    sim.mkdir("b")
    sim.write("a/cpus_list", "0-3")
    sim.write("b/cpus_list", "2-5\n")
    assert sim.read("a/cpus_list") == "0-1\n"
    assert sim.read("b/cpus_list") == "2-5\n"
    assert sim.read("cpus_list") == "6-15\n"
    sim.write("b/cpus", "10\n")  # hex mask: CPU 4 only; 2, 3 and 5 go back to the root
    assert sim.read("b/cpus_list") == "4\n"
    assert sim.read("b/cpus") == "0010\n"
    assert sim.read("cpus_list") == "2-3,5-15\n"
    sim.write("cpus_list", "0-15\n")  # the root may take CPUs back
    assert sim.read("a/cpus_list") == "\n" and sim.read("b/cpus_list") == "\n"
    assert check_resctrl_tree(root) == []


@pytest.mark.parametrize(
    ("rel", "data", "err", "status"),
    [
        ("cpus_list", "0-7\n", errno.EINVAL, "Can't drop CPUs from default group"),
        ("g/cpus_list", "1-\n", errno.EINVAL, "Bad CPU list/mask"),
        ("g/cpus_list", "16\n", errno.ERANGE, "Bad CPU list/mask"),
        ("g/cpus", "xyz\n", errno.EINVAL, "Bad CPU list/mask"),
        ("g/cpus", "10000\n", errno.EOVERFLOW, "Bad CPU list/mask"),
    ],
)
def test_cpus_refusals(tmp_path: Path, rel: str, data: str, err: int, status: str) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    before = files(root)
    assert failing(sim, rel, data).errno == err
    assert sim.last_cmd_status == status
    assert files(root) == before


def test_offline_cpus_cannot_be_assigned(tmp_path: Path) -> None:
    root = tmp_path / "node"
    write_host_tree(SMALL, root)
    (root / "sys/devices/system/cpu/online").write_text("0-14\n")
    put(root, "cpus_list", "0-14\n")
    put(root, "cpus", "7fff\n")
    sim = SimResctrl(root)
    sim.mkdir("g")
    failing(sim, "g/cpus_list", "15\n")
    assert sim.last_cmd_status == "Can only assign online CPUs"


def test_tasks_move_between_groups(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("a")
    sim.mkdir("b")
    sim.write("a/tasks", "100\n")
    sim.write("a/tasks", "7")
    sim.write("b/tasks", "100\n")
    assert (sim.read("a/tasks"), sim.read("b/tasks")) == ("7\n", "100\n")
    assert failing(sim, "a/tasks", "abc\n").errno == errno.EINVAL
    assert check_resctrl_tree(root) == []


def test_read_only_missing_and_directory_paths(tmp_path: Path) -> None:
    _, sim = make(tmp_path)
    sim.mkdir("g")
    assert failing(sim, "g/size", "1\n").errno == errno.EACCES
    assert failing(sim, "info/L3/cbm_mask", "1\n").errno == errno.EACCES
    assert failing(sim, "nope/schemata", "L3:0=3\n").errno == errno.ENOENT
    assert failing(sim, "g", "x\n").errno == errno.EISDIR
    sim.write("info/L3_MON/max_threshold_occupancy", "4096\n")
    assert sim.read("info/L3_MON/max_threshold_occupancy") == "4096\n"


def test_sim_refuses_an_unmounted_tree(tmp_path: Path) -> None:
    root = tmp_path / "node"
    write_host_tree(dataclasses.replace(SMALL, resctrl_mounted=False), root)
    with pytest.raises(OSError) as info:
        SimResctrl(root)
    assert info.value.errno == errno.ENODEV


def test_sim_refuses_to_work_on_a_broken_tree(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    put(root, "schemata", "L3:0=5;1=7ff\nMB:0=100;1=100\n")
    with pytest.raises(OSError) as info:
        sim.mkdir("g")
    assert info.value.errno == errno.EIO
    assert "non-consecutive" in str(info.value)


# -- fault mode ------------------------------------------------------------------------------------


def test_injected_fault_fails_the_next_matching_write_only(tmp_path: Path) -> None:
    root, sim = make(tmp_path)
    sim.mkdir("g")
    sim.inject_fault("*/schemata", errno.EIO, "injected: firmware said no")
    before = files(root)
    sim.write("schemata", "L3:0=7fe\n")  # the root's schemata does not match */schemata
    before["schemata"] = sim.read("schemata")
    before["size"] = sim.read("size")
    before["info/L3/bit_usage"] = sim.read("info/L3/bit_usage")
    err = failing(sim, "g/schemata", "L3:0=3\n")
    assert err.errno == errno.EIO
    assert sim.last_cmd_status == "injected: firmware said no"
    assert files(root) == before
    sim.write("g/schemata", "L3:0=3\n")
    assert sim.read("g/schemata").startswith("    L3:0=003;")
    assert sim.last_cmd_status == "ok"
    assert sim.pending_faults == ()


def test_fault_counts_and_persistent_faults(tmp_path: Path) -> None:
    _, sim = make(tmp_path)
    sim.mkdir("g")
    sim.inject_fault("g/cpus_list", errno.EBUSY, "busy", count=2)
    for _ in range(2):
        assert failing(sim, "g/cpus_list", "1\n").errno == errno.EBUSY
    sim.write("g/cpus_list", "1\n")
    sim.inject_fault("*", errno.EIO, "", count=None)
    for _ in range(3):
        assert failing(sim, "g/mode", "exclusive\n").errno == errno.EIO
        assert sim.last_cmd_status == "ok"  # an empty message reads as the kernel's "ok"
    sim.clear_faults()
    sim.write("g/tasks", "5\n")


def test_faults_on_mkdir_and_rmdir(tmp_path: Path) -> None:
    root, _ = make(tmp_path)
    sim = SimResctrl(root, faults=[])
    sim.inject_fault("cos*", errno.ENOSPC, "Out of CLOSIDs", op="mkdir")
    with pytest.raises(OSError) as info:
        sim.mkdir("cos1")
    assert info.value.errno == errno.ENOSPC and sim.last_cmd_status == "Out of CLOSIDs"
    assert not (root / RESCTRL / "cos1").exists()
    sim.mkdir("cos1")
    sim.inject_fault("cos1", errno.EBUSY, "", op="rmdir")
    with pytest.raises(OSError):
        sim.rmdir("cos1")
    assert sim.groups() == ["cos1"]


# -- any sequence of operations keeps the tree valid -----------------------------------------------

NAMES = st.sampled_from(["a", "b", "c", "d"])
TARGETS = st.sampled_from(["", "a", "b", "c"])
RUNS = st.builds(lambda low, n: ((1 << n) - 1) << low, st.integers(0, 10), st.integers(1, 5))
MASKS = st.one_of(RUNS, RUNS, st.integers(0, 0xFFF))  # mostly contiguous, so writes often succeed
DOMAIN_VALUES = st.one_of(
    st.tuples(st.just("L3"), st.integers(0, 2), MASKS),
    st.tuples(st.just("MB"), st.integers(0, 2), st.integers(0, 120)),
)
OPS = st.one_of(
    st.tuples(st.just("mkdir"), NAMES),
    st.tuples(st.just("rmdir"), NAMES),
    st.tuples(st.just("schemata"), TARGETS, st.lists(DOMAIN_VALUES, min_size=1, max_size=3)),
    st.tuples(st.just("cpus_list"), TARGETS, st.frozensets(st.integers(0, 8), max_size=4)),
    st.tuples(st.just("mode"), TARGETS, st.sampled_from(["shareable", "exclusive", "exclusive", "x"])),
    st.tuples(st.just("tasks"), TARGETS, st.integers(-1, 4)),
    st.tuples(
        st.just("fault"), st.sampled_from(["*/schemata", "a*", "b/mode"]), st.sampled_from(["write", "mkdir"])
    ),
)
# 8 CPUs keeps each example's tree small; min_cbm_bits=2 and shareable bits make refusals common.
PROPERTY_SPECS = [
    NodeSpec(name="p1", cores_per_socket=2, num_closids=4),
    NodeSpec(name="p2", cores_per_socket=2, num_closids=3, min_cbm_bits=2, shareable_bits="600"),
    NodeSpec(name="p3", cores_per_socket=2, num_closids=4, sparse_masks=1, mba=False),
]


def apply(sim: SimResctrl, op: tuple[object, ...]) -> None:
    kind = op[0]
    if kind == "mkdir":
        sim.mkdir(str(op[1]))
    elif kind == "rmdir":
        sim.rmdir(str(op[1]))
    elif kind == "fault":
        sim.inject_fault(str(op[1]), errno.EIO, "injected", op=str(op[2]))
    else:
        group, value = str(op[1]), op[2]
        rel = f"{group}/{kind}" if group else str(kind)
        if kind == "schemata":
            assert isinstance(value, list)
            text = "".join(
                f"{res}:{dom}={val:x}\n" if res == "L3" else f"{res}:{dom}={val}\n" for res, dom, val in value
            )
        elif kind == "cpus_list":
            assert isinstance(value, frozenset)
            text = ",".join(str(c) for c in sorted(value)) + "\n"
        else:
            text = f"{value}\n"
        sim.write(rel, text)


@pytest.fixture(scope="module")
def property_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tree per spec, with a pristine copy of its resctrl mount to reset from between examples."""
    nodes = {}
    for spec in PROPERTY_SPECS:
        root = tmp_path_factory.mktemp(spec.name)
        write_host_tree(spec, root)
        shutil.copytree(root / RESCTRL, root / "pristine-resctrl")
        nodes[spec.name] = root
    return nodes


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec_name=st.sampled_from([s.name for s in PROPERTY_SPECS]),
    carve=st.booleans(),
    ops=st.lists(OPS, max_size=30),
)
def test_any_operation_sequence_leaves_a_valid_tree(
    property_nodes: dict[str, Path], spec_name: str, carve: bool, ops: list[tuple[object, ...]]
) -> None:
    root = property_nodes[spec_name]
    shutil.rmtree(root / RESCTRL)
    shutil.copytree(root / "pristine-resctrl", root / RESCTRL)
    sim = SimResctrl(root)
    sim.mkdir("a")  # start with groups, so that writes to them are not mostly ENOENT
    sim.mkdir("b")
    if carve:  # leave a's ways to a alone, so that "exclusive" can succeed and constrain later writes
        sim.write("schemata", "L3:0=7f;1=7f\n")
        sim.write("b/schemata", "L3:0=3f;1=3f\n")
        sim.write("a/schemata", "L3:0=180;1=180\n")
    for op in ops:
        before = files(root)
        try:
            apply(sim, op)
        except OSError:
            assert files(root) == before, op  # a refused operation changes nothing but last_cmd_status
        assert check_resctrl_tree(root) == [], op
