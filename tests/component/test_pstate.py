"""The P-state plugin on simulated host trees (cpufreq files, simulated branch counters) and on this host."""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import errno
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import rmd_agent.pstate.counters as counters_mod
from rmd_agent.errors import Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.pstate import (
    CpufreqControl,
    CpufreqWriteError,
    FileCounters,
    FreqLimits,
    PerfEventCounters,
    PStateConflict,
    PStateController,
    PStateState,
    probe_pstate,
)
from rmd_agent.pstate.cpufreq_control import write_sysfs
from rmd_agent.pstate.policy import frequency_steps
from rmd_sim import perf
from rmd_sim.hosttree import write_host_tree
from rmd_sim.spec import NodeSpec

SPEC = NodeSpec.default()
STEPS = frequency_steps(SPEC.cpufreq_min_khz, SPEC.cpufreq_max_khz)
TOP = FreqLimits.pinned(SPEC.cpufreq_max_khz)
POLICIES = "sys/devices/system/cpu/cpufreq"
BUSY, QUIET = 5.0, 0.5  # branch-miss per cent on either side of the threshold below
THRESHOLD = 2.0
BRANCHES = 200_000  # per sample, well above the idle floor


def make_host(root: Path, spec: NodeSpec = SPEC, *, counters: bool = True) -> Path:
    write_host_tree(spec, root)  # simulated trees come with counters
    if not counters:
        shutil.rmtree(perf.perf_dir(root))
    return root


@pytest.fixture
def host(short_tmp: Path) -> Path:
    return make_host(short_tmp / "host")


def snapshot(root: Path) -> dict[str, str]:
    """Every cpufreq file of the tree with its content."""
    return {
        str(p.relative_to(root)): p.read_text() for p in sorted((root / POLICIES).rglob("*")) if p.is_file()
    }


def limits(root: Path, cpu: int) -> FreqLimits:
    base = root / POLICIES / f"policy{cpu}"
    return FreqLimits(
        int((base / "scaling_min_freq").read_text()), int((base / "scaling_max_freq").read_text())
    )


def controller(root: Path, *, interval: float = 3600.0, down_after: int = 2) -> PStateController:
    """A controller on the simulated counters; with the default interval, tests step the monitor by hand."""
    fs = HostFS(root)
    return PStateController(fs, FileCounters.for_host(fs), interval=interval, down_after=down_after)


def load(root: Path, cpu_ratios: dict[int, float]) -> None:
    for cpu, ratio in cpu_ratios.items():
        perf.advance(root, cpu, BRANCHES, ratio)


async def wait_until(cond: Callable[[], bool]) -> None:
    """Poll a file-state condition (nothing to wait on but the files) for up to 10 s."""
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met within 10 s")


# -- the monitor ---------------------------------------------------------------------------------------


async def test_monitor_raises_busy_cores_and_lowers_quiet_ones(host: Path) -> None:
    ctl = controller(host, down_after=2)
    before = {cpu: limits(host, cpu) for cpu in (4, 5)}
    result = await ctl.apply("ns/w", frozenset({4, 5}), THRESHOLD, True)
    assert result.state is PStateState.APPLIED and result.status == "applied"
    monitor = ctl.monitor("ns/w")
    assert monitor is not None

    load(host, {4: BUSY, 5: QUIET})
    monitor.step()
    assert limits(host, 4) == TOP  # busy: pinned to the top at once
    assert limits(host, 5) == before[5]  # quiet once: held (hysteresis)

    load(host, {4: BUSY, 5: QUIET})
    monitor.step()
    assert limits(host, 4) == TOP
    assert limits(host, 5) == FreqLimits.pinned(STEPS[-2])  # quiet down_after times: one step down

    for _ in range(len(STEPS)):
        load(host, {4: QUIET, 5: QUIET})
        monitor.step()
    assert limits(host, 4) == FreqLimits.pinned(STEPS[0])
    assert limits(host, 5) == FreqLimits.pinned(STEPS[0])

    load(host, {4: QUIET, 5: BUSY})
    monitor.step()
    assert limits(host, 5) == TOP
    assert monitor.decisions[5].ratio_pct == pytest.approx(BUSY, rel=1e-3)
    await ctl.close()


async def test_the_loop_follows_a_live_load(host: Path) -> None:
    ctl = controller(host, interval=0.02, down_after=3)
    assert (await ctl.apply("ns/live", frozenset({7}), THRESHOLD, True)).state is PStateState.APPLIED
    busy = asyncio.create_task(
        perf.keep_loaded(host, [7], branches_per_tick=BRANCHES, ratio_pct=BUSY, tick_s=0.005)
    )
    await wait_until(lambda: limits(host, 7) == TOP)
    busy.cancel()
    quiet = asyncio.create_task(
        perf.keep_loaded(host, [7], branches_per_tick=BRANCHES, ratio_pct=QUIET, tick_s=0.005)
    )
    await wait_until(lambda: limits(host, 7).max_khz < SPEC.cpufreq_max_khz)
    quiet.cancel()
    await ctl.close()
    assert limits(host, 7) == FreqLimits(SPEC.cpufreq_min_khz, SPEC.cpufreq_max_khz)


async def test_removal_restores_every_touched_file(host: Path) -> None:
    original = snapshot(host)
    ctl = controller(host, down_after=1)
    await ctl.apply("ns/a", frozenset({2, 3}), THRESHOLD, True)
    await ctl.apply("ns/b", frozenset({8}), THRESHOLD, True)
    for key, ratios in (("ns/a", {2: BUSY, 3: QUIET}), ("ns/b", {8: QUIET})):
        load(host, ratios)
        monitor = ctl.monitor(key)
        assert monitor is not None
        monitor.step()
    assert (limits(host, 2), limits(host, 3), limits(host, 8)) == (
        TOP,
        FreqLimits.pinned(STEPS[-2]),
        FreqLimits.pinned(STEPS[-2]),
    )
    changed = {path for path, text in snapshot(host).items() if original[path] != text}
    # CPU 2's max already was the top, so only its min is written
    assert changed == {f"{POLICIES}/policy2/scaling_min_freq"} | {
        f"{POLICIES}/policy{cpu}/{name}"
        for cpu in (3, 8)
        for name in ("scaling_min_freq", "scaling_max_freq")
    }
    await ctl.remove("ns/a")
    after_a = snapshot(host)
    assert {p for p in after_a if after_a[p] != original[p]} == {
        f"{POLICIES}/policy8/scaling_min_freq",
        f"{POLICIES}/policy8/scaling_max_freq",
    }
    await ctl.remove("ns/b")
    assert snapshot(host) == original
    assert ctl.control.originals == {}


async def test_close_restores_everything_and_releases_counters(host: Path) -> None:
    original = snapshot(host)
    released: list[int] = []
    fs = HostFS(host)

    class Recording(FileCounters):
        def release(self, cpu: int) -> None:
            released.append(cpu)

    ctl = PStateController(fs, Recording(fs.path(perf.PERF_DIR)), interval=3600, down_after=1)
    await ctl.apply("ns/a", frozenset({1, 9}), THRESHOLD, True)
    load(host, {1: BUSY, 9: BUSY})
    monitor = ctl.monitor("ns/a")
    assert monitor is not None
    monitor.step()
    assert snapshot(host) != original
    await ctl.close()
    assert snapshot(host) == original
    assert sorted(set(released)) == [1, 9]


async def test_apply_is_idempotent_replaces_on_change_and_refuses_overlaps(host: Path) -> None:
    original = snapshot(host)
    ctl = controller(host, down_after=1)
    await ctl.apply("ns/a", frozenset({4}), THRESHOLD, True)
    first = ctl.monitor("ns/a")
    await ctl.apply("ns/a", frozenset({4}), THRESHOLD, True)
    assert ctl.monitor("ns/a") is first

    load(host, {4: BUSY})
    assert first is not None
    first.step()
    assert limits(host, 4) == TOP
    # a new ratio replaces the monitor, writing back what the old one changed first
    await ctl.apply("ns/a", frozenset({4}), THRESHOLD * 2, True)
    assert ctl.monitor("ns/a") is not first
    assert snapshot(host) == original

    with pytest.raises(PStateConflict, match="CPU"):
        await ctl.apply("ns/b", frozenset({4, 5}), THRESHOLD, True)
    await ctl.close()


async def test_monitoring_off_changes_nothing(host: Path) -> None:
    original = snapshot(host)
    ctl = controller(host)
    result = await ctl.apply("ns/off", frozenset({4}), THRESHOLD, False)
    assert result.state is PStateState.OFF
    assert result.status == "off"
    assert ctl.monitor("ns/off") is None
    await ctl.close()
    assert snapshot(host) == original


# -- never half-applied --------------------------------------------------------------------------------


def failing_writer(bad: Path, after: list[Path]) -> Callable[[Path, str], None]:
    """Writes like sysfs, but fails with EINVAL on `bad`; records every successful write in `after`."""

    def write(path: Path, text: str) -> None:
        if path.resolve() == bad.resolve():
            raise OSError(errno.EINVAL, "Invalid argument")
        write_sysfs(path, text)
        after.append(path)

    return write


def test_a_failed_write_is_rolled_back(host: Path) -> None:
    original = snapshot(host)
    written: list[Path] = []
    bad = host / POLICIES / "policy6" / "scaling_min_freq"
    control = CpufreqControl(HostFS(host), writer=failing_writer(bad, written))
    low = FreqLimits.pinned(STEPS[1])
    with pytest.raises(CpufreqWriteError, match="cpu6/cpufreq/scaling_min_freq"):
        control.set_limits({4: low, 5: low, 6: low})
    assert written, "the writes before the failing one happened, so the rollback was exercised"
    assert snapshot(host) == original
    assert control.originals == {}


async def test_a_scaling_file_that_is_a_directory_leaves_everything_as_it_was(host: Path) -> None:
    broken = host / POLICIES / "policy5" / "scaling_min_freq"
    broken.unlink()
    broken.mkdir()
    original = snapshot(host)
    ctl = controller(host)
    result = await ctl.apply("ns/w", frozenset({4, 5}), THRESHOLD, True)
    assert result.state is PStateState.UNSUPPORTED
    assert "scaling_min_freq" in result.reason
    assert result.status.startswith("unsupported: ")
    await ctl.close()
    assert snapshot(host) == original


async def test_a_write_failing_while_monitoring_is_reported_and_rolled_back(host: Path) -> None:
    original = snapshot(host)
    bad = host / POLICIES / "policy4" / "scaling_min_freq"
    control = CpufreqControl(HostFS(host), writer=failing_writer(bad, []))
    fs = HostFS(host)
    ctl = PStateController(fs, FileCounters.for_host(fs), interval=3600, down_after=1, control=control)
    await ctl.apply("ns/w", frozenset({4, 5}), THRESHOLD, True)
    monitor = ctl.monitor("ns/w")
    assert monitor is not None
    load(host, {4: BUSY, 5: BUSY})
    monitor.step()
    assert monitor.last_error is not None and "scaling_min_freq" in monitor.last_error
    assert limits(host, 4) == FreqLimits(SPEC.cpufreq_min_khz, SPEC.cpufreq_max_khz)  # unchanged
    assert limits(host, 5) == TOP  # the other core is not held back by it
    load(host, {4: BUSY, 5: BUSY})
    monitor.step()  # the monitor keeps sampling after a failed write
    assert monitor.last_error is not None
    await ctl.close()
    assert snapshot(host) == original


def test_writes_keep_min_at_most_max_at_every_step(host: Path) -> None:
    def checked(path: Path, text: str) -> None:
        write_sysfs(path, text)
        policy = path.parent
        lo = int((policy / "scaling_min_freq").read_text())
        hi = int((policy / "scaling_max_freq").read_text())
        assert lo <= hi, f"{policy.name}: min {lo} > max {hi} after writing {path.name}"

    control = CpufreqControl(HostFS(host), writer=checked)
    control.set_limits({3: FreqLimits.pinned(STEPS[0])})  # lowering: min first would break; max first
    control.set_limits({3: TOP})  # raising from a pinned bottom: max must go first
    control.set_limits({3: FreqLimits.pinned(STEPS[2])})
    control.restore([3])
    assert limits(host, 3) == FreqLimits(SPEC.cpufreq_min_khz, SPEC.cpufreq_max_khz)


async def test_remove_reports_a_failed_restore_and_close_retries_it(host: Path) -> None:
    original = snapshot(host)
    broken = {"on": False}

    def flaky(path: Path, text: str) -> None:
        if broken["on"]:
            raise OSError(errno.EBUSY, "Device or resource busy")
        write_sysfs(path, text)

    fs = HostFS(host)
    control = CpufreqControl(fs, writer=flaky)
    ctl = PStateController(fs, FileCounters.for_host(fs), interval=3600, down_after=1, control=control)
    await ctl.apply("ns/w", frozenset({4}), THRESHOLD, True)
    load(host, {4: BUSY})
    monitor = ctl.monitor("ns/w")
    assert monitor is not None
    monitor.step()
    broken["on"] = True
    with pytest.raises(CpufreqWriteError, match="restoring"):
        await ctl.remove("ns/w")
    assert set(control.originals) == {4}
    broken["on"] = False
    await ctl.close()
    assert snapshot(host) == original


# -- unsupported nodes ---------------------------------------------------------------------------------


async def test_a_node_without_cpufreq_is_unsupported_with_the_reason(short_tmp: Path) -> None:
    root = make_host(short_tmp / "vm", dataclasses.replace(SPEC, cpufreq=False))
    fs = HostFS(root)
    why = probe_pstate(fs, FileCounters.for_host(fs))
    assert isinstance(why, Unsupported)
    assert "cpufreq" in why.reason
    ctl = controller(root)
    result = await ctl.apply("ns/w", frozenset({4}), THRESHOLD, True)
    assert result.state is PStateState.UNSUPPORTED
    assert "no cpufreq for CPU 4" in result.reason
    await ctl.close()


async def test_a_node_without_counters_is_unsupported_and_untouched(short_tmp: Path) -> None:
    root = make_host(short_tmp / "nocounters", counters=False)
    original = snapshot(root)
    fs = HostFS(root)
    why = probe_pstate(fs, FileCounters.for_host(fs))
    assert isinstance(why, Unsupported)
    assert perf.PERF_DIR in why.reason
    result = await controller(root).apply("ns/w", frozenset({4}), THRESHOLD, True)
    assert result.state is PStateState.UNSUPPORTED
    assert snapshot(root) == original


async def test_a_cpufreq_policy_reaching_outside_the_workload(host: Path) -> None:
    for cpu in (4, 5):
        (host / POLICIES / f"policy{cpu}" / "affected_cpus").write_text("4 5\n")
    ctl = controller(host, down_after=1)
    alone = await ctl.apply("ns/one", frozenset({4}), THRESHOLD, True)
    assert alone.state is PStateState.UNSUPPORTED
    assert "CPU(s) 5" in alone.reason
    # owning both CPUs of the policy is fine: one group, counted together, controlled through CPU 4
    assert (await ctl.apply("ns/both", frozenset({4, 5}), THRESHOLD, True)).state is PStateState.APPLIED
    monitor = ctl.monitor("ns/both")
    assert monitor is not None
    load(host, {4: 0.0, 5: 2 * THRESHOLD + 1})  # the sum is above the threshold although CPU 4 is quiet
    monitor.step()
    assert set(monitor.decisions) == {4}
    assert limits(host, 4) == TOP
    assert limits(host, 5) == FreqLimits(SPEC.cpufreq_min_khz, SPEC.cpufreq_max_khz)  # not written itself
    await ctl.close()


def test_probe_pstate_on_a_capable_simulated_node(host: Path) -> None:
    fs = HostFS(host)
    assert probe_pstate(fs, FileCounters.for_host(fs)) is None
    assert probe_pstate(fs, FileCounters.for_host(fs), cpus=[0, 63]) is None


# -- counters ------------------------------------------------------------------------------------------


def test_file_counters_read_what_the_simulator_writes(host: Path) -> None:
    assert counters_mod.SIM_PERF_DIR == perf.PERF_DIR  # the agent and the simulator agree on the layout
    counters = FileCounters.for_host(HostFS(host))
    before = counters.read(3)
    assert (before.branches, before.misses) == perf.initial_counts(3)
    perf.advance(host, 3, 1_000_000, 1.5)
    after = counters.read(3)
    assert after.branches - before.branches == 1_000_000
    assert after.misses - before.misses == perf.misses_for(1_000_000, 1.5)
    why = counters.probe(999)
    assert isinstance(why, Unsupported)
    assert "cpu999" in why.reason


def test_perf_event_counters_on_this_machine_work_or_say_why() -> None:
    counters = PerfEventCounters(HostFS("/"))
    why = counters.probe(0)
    if why is not None:
        assert why.reason.startswith("perf_event_open: ")
        assert "(" in why.reason  # an errno name with its explanation
    else:
        first = counters.read(0)
        second = counters.read(0)
        assert second.branches >= first.branches and second.misses >= first.misses
    counters.close()
    node = probe_pstate(HostFS("/"), counters)
    assert node is None or node.reason


def test_perf_event_open_plumbing_with_software_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hardware events are missing in VMs, so check the syscall, attr layout and group read with two
    software events (PERF_TYPE_SOFTWARE: cpu-clock in ns, and page faults) that every kernel has."""
    monkeypatch.setattr(counters_mod, "PERF_TYPE_HARDWARE", 1)
    monkeypatch.setattr(counters_mod, "PERF_COUNT_HW_BRANCH_INSTRUCTIONS", 0)
    monkeypatch.setattr(counters_mod, "PERF_COUNT_HW_BRANCH_MISSES", 2)
    counters = PerfEventCounters(HostFS("/"))
    why = counters.probe(0)
    if why is not None:
        pytest.skip(f"perf events not permitted here: {why.reason}")
    first = counters.read(0)
    time.sleep(0.05)
    second = counters.read(0)
    assert second.branches - first.branches >= 10_000_000  # >= 10 ms of cpu-clock over 50 ms of wall time
    assert second.misses >= first.misses
    counters.close()
    assert repr(counters) == "PerfEventCounters(open=[])"


def test_perf_event_errors_are_explained(monkeypatch: pytest.MonkeyPatch, short_tmp: Path) -> None:
    (short_tmp / "proc/sys/kernel").mkdir(parents=True)
    (short_tmp / "proc/sys/kernel/perf_event_paranoid").write_text("3\n")

    def fail_with(err: int) -> Callable[..., int]:
        def call(*_args: object) -> int:
            ctypes.set_errno(err)
            return -1

        return call

    for err, expected in (
        (errno.ENOENT, "perf_event_open: ENOENT (no hardware counters: typical in VMs)"),
        (errno.EACCES, "kernel.perf_event_paranoid <= 0; it is 3"),
        (errno.ENODEV, "CPU 0"),
    ):
        counters = PerfEventCounters(HostFS(short_tmp))
        monkeypatch.setattr(counters, "_libc_syscall", lambda err=err: fail_with(err))
        why = counters.probe(0)
        assert isinstance(why, Unsupported)
        assert expected in why.reason
