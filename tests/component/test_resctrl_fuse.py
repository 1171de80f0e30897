"""The FUSE-mounted simulated resctrl, driven by other processes through ordinary syscalls."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmd_api.cpuset import parse_cpu_list
from rmd_sim.hosttree import write_host_tree
from rmd_sim.resctrl import RESCTRL, check_resctrl_tree, parse_schemata_text
from rmd_sim.resctrl_fuse import (
    ResctrlMount,
    ResctrlMountError,
    add_resctrl_mount_command,
    is_mounted,
    is_writable,
)
from rmd_sim.spec import NodeSpec
from rmd_sim.stop_signals import SignalStop

CPUS = 8
SPEC = dataclasses.replace(
    NodeSpec.default(), sockets=2, cores_per_socket=2, threads_per_core=2, numa_nodes=2, num_closids=4
)

# Runs in another process: performs one syscall on the mount and prints its errno (0 on success).
SYSCALL = textwrap.dedent(
    """
    import os, sys
    op, path, *rest = sys.argv[1:]
    try:
        if op == "write":
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, rest[0].encode())
            finally:
                os.close(fd)
        elif op == "mkdir":
            os.mkdir(path)
        elif op == "rmdir":
            os.rmdir(path)
        elif op == "create":
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        elif op == "unlink":
            os.unlink(path)
        elif op == "rename":
            os.rename(path, rest[0])
        elif op == "chmod":
            os.chmod(path, 0o600)
    except OSError as exc:
        print(exc.errno)
    else:
        print(0)
    """
)


@pytest.fixture
def host(short_tmp: Path, fuse_ok: None) -> Path:
    root = short_tmp / "host"
    write_host_tree(SPEC, root)
    return root


@pytest.fixture
def mount(host: Path) -> Iterator[ResctrlMount]:
    with ResctrlMount(host) as mounted:
        yield mounted
    assert not is_mounted(host / RESCTRL)


def syscall(op: str, path: Path, *args: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", SYSCALL, op, str(path), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(done.stdout)


def sh(script: str) -> str:
    return subprocess.run(
        ["sh", "-ec", script], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def cat(path: Path) -> str:
    return sh(f"cat '{path}'")


def assert_tree_ok(mount: ResctrlMount) -> None:
    assert check_resctrl_tree(mount.backing_root) == []


def l3_masks(schemata: str) -> dict[int, int]:
    return {d: int(v, 16) for d, v in parse_schemata_text(schemata)["L3"].items()}


def test_mkdir_in_another_process_populates_the_group(mount: ResctrlMount) -> None:
    m = mount.mountpoint
    listing = sh(f"mkdir '{m}/g1' && ls '{m}/g1'").split()
    assert {"cpus", "cpus_list", "mode", "schemata", "size", "tasks", "mon_groups"} <= set(listing)
    assert "g1" in sh(f"ls '{m}'").split()
    assert cat(m / "g1/mode") == "shareable\n"
    assert cat(m / "g1/cpus_list") == "\n"
    assert l3_masks(cat(m / "g1/schemata")) == {0: 0x7FF, 1: 0x7FF}
    assert mount.sim.groups() == ["g1"]
    assert_tree_ok(mount)


def test_schemata_written_by_a_shell_reads_back_through_every_reader(mount: ResctrlMount) -> None:
    m = mount.mountpoint
    sh(f"mkdir '{m}/g1' && printf 'L3:0=f;1=f0\\n' > '{m}/g1/schemata'")
    shown = cat(m / "g1/schemata")
    assert l3_masks(shown) == {0: 0xF, 1: 0xF0}
    # Files report size 0 like kernfs; readers that trust st_size would see nothing.
    assert (m / "g1/schemata").stat().st_size == 0
    assert (m / "g1/schemata").read_text() == shown
    with open(m / "g1/schemata") as f:
        assert f.read() == shown
    assert cat(m / "info/last_cmd_status") == "ok\n"
    assert_tree_ok(mount)


def test_invalid_mask_fails_with_einval_and_last_cmd_status_says_why(mount: ResctrlMount) -> None:
    m = mount.mountpoint
    before = cat(m / "schemata")
    assert syscall("write", m / "schemata", "L3:0=5\n") == errno.EINVAL  # 101b: not contiguous
    assert "non-consecutive" in cat(m / "info/last_cmd_status")
    assert cat(m / "schemata") == before
    assert_tree_ok(mount)


def test_each_write_is_one_command_whatever_its_offset(mount: ResctrlMount) -> None:
    m = mount.mountpoint
    code = (
        f"fd = os.open('{m}/schemata', os.O_WRONLY)\nos.write(fd, b'L3:0=3\\n')\nos.write(fd, b'L3:1=c\\n')"
    )
    subprocess.run([sys.executable, "-c", f"import os\n{code}"], check=True, timeout=30)
    assert l3_masks(cat(m / "schemata")) == {0: 0x3, 1: 0xC}
    assert_tree_ok(mount)


def test_cpus_list_moves_cpus_and_rmdir_returns_them(mount: ResctrlMount) -> None:
    m = mount.mountpoint
    assert syscall("mkdir", m / "g1") == 0
    assert syscall("write", m / "g1/cpus_list", "2-3\n") == 0
    assert parse_cpu_list(cat(m / "g1/cpus_list")) == {2, 3}
    assert int(cat(m / "g1/cpus").replace(",", ""), 16) == 0b1100
    assert parse_cpu_list(cat(m / "cpus_list")) == set(range(CPUS)) - {2, 3}
    assert_tree_ok(mount)
    assert syscall("rmdir", m / "g1") == 0
    assert parse_cpu_list(cat(m / "cpus_list")) == set(range(CPUS))
    assert not (m / "g1").exists()
    assert_tree_ok(mount)


def test_closid_exhaustion_gives_enospc(mount: ResctrlMount) -> None:
    m = mount.mountpoint
    for name in ("g1", "g2", "g3"):  # num_closids=4, the root group holds one
        assert syscall("mkdir", m / name) == 0
    assert syscall("mkdir", m / "g4") == errno.ENOSPC
    assert cat(m / "info/last_cmd_status") == "Out of CLOSIDs\n"
    assert not (m / "g4").exists()
    assert_tree_ok(mount)


def test_injected_fault_reaches_the_writer(mount: ResctrlMount) -> None:
    m = mount.mountpoint
    mount.sim.inject_fault("schemata", errno.EBUSY, "simulated firmware busy", count=1)
    assert syscall("write", m / "schemata", "L3:0=ff\n") == errno.EBUSY
    assert cat(m / "info/last_cmd_status") == "simulated firmware busy\n"
    assert l3_masks(cat(m / "schemata"))[0] == 0x7FF
    assert syscall("write", m / "schemata", "L3:0=ff\n") == 0  # count=1: the retry succeeds
    assert l3_masks(cat(m / "schemata"))[0] == 0xFF
    assert_tree_ok(mount)


def test_kernfs_refusals(mount: ResctrlMount) -> None:
    m = mount.mountpoint
    assert syscall("create", m / "newfile") == errno.EACCES
    assert syscall("unlink", m / "schemata") == errno.EPERM
    assert syscall("mkdir", m / "g1") == 0
    assert syscall("rename", m / "g1", str(m / "g2")) == errno.EPERM
    assert syscall("chmod", m / "schemata") == errno.EPERM
    assert syscall("write", m / "info/last_cmd_status", "x\n") == errno.EACCES
    assert syscall("write", m / "g1/size", "x\n") == errno.EACCES
    assert syscall("mkdir", m / "info/x") == errno.EPERM
    assert syscall("rmdir", m / "info") == errno.EPERM
    assert syscall("rmdir", m / "g1") == 0
    assert sorted(os.listdir(m)) == mount.sim.listdir()
    assert_tree_ok(mount)


def test_concurrent_writers_keep_the_tree_valid(mount: ResctrlMount) -> None:
    m = mount.mountpoint
    for name in ("g1", "g2", "g3"):
        (m / name).mkdir()
    code = textwrap.dedent(
        f"""
        import threading
        from pathlib import Path
        def churn(group, cpus):
            for i in range(15):
                Path('{m}', group, 'cpus_list').write_text(cpus[i % len(cpus)] + '\\n')
        plan = {{'g1': ['0-1', '2'], 'g2': ['2-3', '4'], 'g3': ['4-5', '0']}}
        threads = [threading.Thread(target=churn, args=item) for item in plan.items()]
        for t in threads: t.start()
        for t in threads: t.join()
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    owned = [parse_cpu_list(cat(m / g / "cpus_list")) for g in ("", "g1", "g2", "g3")]
    assert sum(len(c) for c in owned) == CPUS and set().union(*owned) == set(range(CPUS))
    assert_tree_ok(mount)


def test_state_survives_unmount_and_remount(host: Path) -> None:
    m = host / RESCTRL
    with ResctrlMount(host) as first:
        assert syscall("mkdir", m / "g1") == 0
        assert syscall("write", m / "g1/cpus_list", "4-5\n") == 0
        assert syscall("write", m / "g1/schemata", "L3:1=3\n") == 0
    assert not is_mounted(m)
    assert list(m.iterdir()) == []  # unmounted resctrl: an empty directory
    assert check_resctrl_tree(first.backing_root) == []
    with ResctrlMount(host) as second:
        assert parse_cpu_list(cat(m / "g1/cpus_list")) == {4, 5}
        assert l3_masks(cat(m / "g1/schemata"))[1] == 0x3
        assert second.sim.groups() == ["g1"]
        assert_tree_ok(second)
    assert not is_mounted(m)


def test_flock_on_the_mount_directory_excludes_other_processes(mount: ResctrlMount) -> None:
    m = mount.mountpoint
    lock = "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)"
    holder_code = f"{lock}; fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.readline()"
    probe_code = textwrap.dedent(
        f"""
        {lock}
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print('busy')
        else:
            print('free')
        """
    )

    def probe() -> str:
        return subprocess.run(
            [sys.executable, "-c", probe_code, str(m)], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()

    assert probe() == "free"
    with subprocess.Popen(
        [sys.executable, "-c", holder_code, str(m)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdin is not None
            assert holder.stdout.readline().strip() == "locked"
            assert probe() == "busy"
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.wait(timeout=30) == 0
        finally:
            holder.kill()
    assert probe() == "free"


def test_host_root_slash_is_refused() -> None:
    with pytest.raises(ResctrlMountError, match="refusing"):
        ResctrlMount(Path("/"))


def test_tree_without_resctrl_is_refused(short_tmp: Path, fuse_ok: None) -> None:
    root = short_tmp / "host"
    write_host_tree(dataclasses.replace(SPEC, resctrl_mounted=False), root)
    with pytest.raises(ResctrlMountError, match="no resctrl tree"):
        ResctrlMount(root).start()
    assert not is_mounted(root / RESCTRL)


def test_second_mount_of_a_served_tree_is_refused(mount: ResctrlMount) -> None:
    with pytest.raises(ResctrlMountError, match="already mounted"):
        ResctrlMount(mount.host_root).start()
    assert mount.serving and cat(mount.mountpoint / "mode") == "shareable\n"


CLI = textwrap.dedent(
    """
    import argparse, sys
    from rmd_sim.resctrl_fuse import add_resctrl_mount_command
    parser = argparse.ArgumentParser()
    add_resctrl_mount_command(parser.add_subparsers(required=True))
    args = parser.parse_args(sys.argv[1:])
    sys.exit(args.run(args))
    """
)


def serve_in_cli(host: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLI, "resctrl-mount", "--host-root", str(host)],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_cli_serves_until_sigterm_then_unmounts(host: Path) -> None:
    m = host / RESCTRL
    with serve_in_cli(host) as server:
        try:
            assert server.stdout is not None
            assert server.stdout.readline().startswith("serving ")
            assert is_mounted(m)
            assert syscall("mkdir", m / "g1") == 0
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=30) == 0
        finally:
            if server.poll() is None:
                server.kill()
    assert not is_mounted(m)
    assert (host / ".rmd-sim/resctrl-backing" / RESCTRL / "g1/schemata").is_file()


def test_add_resctrl_mount_command_registers_the_subcommand() -> None:
    parser = argparse.ArgumentParser()
    add_resctrl_mount_command(parser.add_subparsers())
    args = parser.parse_args(["resctrl-mount", "--host-root", "/tmp/x"])
    assert args.host_root == Path("/tmp/x") and callable(args.run)


@pytest.mark.parametrize(
    ("rel", "writable"),
    [
        ("schemata", True),
        ("g1/cpus_list", True),
        ("g1/size", False),
        ("info/last_cmd_status", False),
        ("info/L3_MON/max_threshold_occupancy", True),
        ("mon_data/mon_L3_00/llc_occupancy", False),
        ("mon_groups/schemata", False),
    ],
)
def test_file_modes_follow_the_kernel(rel: str, writable: bool) -> None:
    assert is_writable(rel) is writable


def test_mount_left_by_a_killed_server_is_replaced(host: Path) -> None:
    m = host / RESCTRL
    with serve_in_cli(host) as server:
        assert server.stdout is not None
        assert server.stdout.readline().startswith("serving ")
        assert syscall("mkdir", m / "g1") == 0
        server.kill()  # no unmount: the mount stays, answering ENOTCONN
    assert is_mounted(m)
    with pytest.raises(OSError) as stale:
        os.stat(m)
    assert stale.value.errno == errno.ENOTCONN
    try:
        with ResctrlMount(host) as mount:
            assert mount.sim.groups() == ["g1"]
            assert "g1" in sh(f"ls '{m}'").split()
    finally:
        if is_mounted(m):
            subprocess.run(["fusermount3", "-u", "-z", str(m)], check=False)
    assert not is_mounted(m)


def test_busy_mount_is_detached_lazily(host: Path) -> None:
    m = host / RESCTRL
    mount = ResctrlMount(host)
    mount.start()
    code = "import sys; print('in', flush=True); sys.stdin.readline(); print(open('mode').read(), end='')"
    with subprocess.Popen(
        [sys.executable, "-c", code], cwd=m, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as user:
        try:
            assert user.stdout is not None and user.stdin is not None
            assert user.stdout.readline() == "in\n"
            mount.stop()  # fusermount3 -u fails with EBUSY; the lazy unmount detaches it
            assert not is_mounted(m)
            user.stdin.write("\n")
            user.stdin.flush()
            assert user.stdout.read() == "shareable\n"  # the old user is still served
            assert user.wait(timeout=30) == 0
        finally:
            user.kill()


def test_mounts_leave_handlers_set_before_them_alone(host: Path, tmp_path: Path) -> None:
    """libfuse takes SIGTERM for its loop only when it is at the default disposition: the demo's own handler,
    set first, gets the signal, and every mount keeps serving until the demo unmounts it."""
    with SignalStop(tmp_path, keep=True) as stops, ResctrlMount(host) as mount:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stops.signum == signal.SIGTERM
        assert "schemata" in os.listdir(mount.mountpoint)
        assert mount.serving and is_mounted(mount.mountpoint)
