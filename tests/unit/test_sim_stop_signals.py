"""SignalStop: how the demo turns SIGTERM, SIGINT and SIGHUP into an orderly stop (the forced exit, which ends
the process, is covered by tests/e2e/test_demo.py)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmd_sim.stop_signals import STOP_SIGNALS, SignalStop


@pytest.fixture
def stops(tmp_path: Path) -> Iterator[SignalStop]:
    with SignalStop(tmp_path, keep=True) as stops:
        yield stops


async def test_a_signal_cancels_the_attached_task_and_sets_the_exit_status(stops: SignalStop) -> None:
    assert stops.attach()
    with pytest.raises(asyncio.CancelledError):
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(5)
    stops.detach()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the cleanup after it runs as usual
    assert stops.status(0) == 128 + signal.SIGTERM


async def test_a_signal_during_the_cleanup_does_not_interrupt_it(stops: SignalStop) -> None:
    assert stops.attach()
    stops.detach()
    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.sleep(0.1)  # not cancelled
    assert stops.status(0) == 130


async def test_a_signal_before_attach_is_kept_and_attach_says_do_not_start(stops: SignalStop) -> None:
    os.kill(os.getpid(), signal.SIGHUP)
    assert not stops.attach()
    await asyncio.sleep(0.1)  # not cancelled either
    assert stops.status(1) == 128 + signal.SIGHUP


def test_no_signal_keeps_the_default_status(stops: SignalStop) -> None:
    assert stops.status(0) == 0 and stops.status(1) == 1


def test_handlers_replace_an_inherited_ignore_and_are_restored(tmp_path: Path) -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a shell's background job
    try:
        with SignalStop(tmp_path) as stops:
            assert all(signal.getsignal(sig) == stops._on_signal for sig in STOP_SIGNALS)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
