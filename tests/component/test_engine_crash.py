"""Crash safety: the engine runs in a child process applying a sequence of changes and is killed (SIGKILL)
right after its k-th durable step (a state file save or a kernel operation), for every k. A fresh engine over
the same state file and resctrl mount must then converge: the registry holds every change acknowledged before
the kill (and the interrupted one either fully or not at all), the kernel matches the registry, the tree
obeys the kernel's rules, and no group of ours is left without a workload. P-state originals survive a kill
while a core is pinned."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from rmd_agent.engine import NodeEngine
from rmd_agent.plan.resctrl_layout import SHARED_GROUP
from rmd_agent.plan.workload import Workload
from rmd_agent.settings import AgentSettings
from rmd_agent.state_store import StateStore, workload_from_json, workload_to_json
from rmd_api.cpuset import parse_cpu_list
from rmd_sim import perf
from rmd_sim.hosttree import write_host_tree
from rmd_sim.resctrl import RESCTRL, check_resctrl_tree, parse_schemata_text
from rmd_sim.resctrl_fuse import ResctrlMount
from rmd_sim.spec import NodeSpec

SPEC = NodeSpec.default()
S0 = sorted(SPEC.cpus_of_socket(0))
S1 = sorted(SPEC.cpus_of_socket(1))
CPUFREQ = "sys/devices/system/cpu/cpufreq"
ORIGINAL = (1_200_000, 3_000_000)  # limits set before the agent runs, so a wrong restore shows

# The child: applies ACTIONS (a JSON list) with a NodeEngine whose step hook kills the process right after
# step number DIE_AT (0: never), printing each step and each acknowledged action on the way.
DRIVER = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    from pathlib import Path
    from rmd_agent.engine import NodeEngine
    from rmd_agent.settings import AgentSettings
    from rmd_agent.state_store import workload_from_json

    host, actions = sys.argv[1], json.loads(sys.argv[2])
    die_at, interval = int(sys.argv[3]), float(sys.argv[4])
    steps = 0

    def hook(what):
        global steps
        steps += 1
        print(f"step {steps} {what}", flush=True)
        if steps == die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    async def main():
        settings = AgentSettings(host_root=Path(host), pstate_counters="files")
        engine = NodeEngine(settings, step_hook=hook, pstate_interval=interval)
        await engine.start()
        for i, (kind, ns, name, workload) in enumerate(actions):
            if kind == "apply":
                await engine.apply(workload_from_json(workload, name))
            else:
                assert await engine.remove(ns, name)
            print(f"done {i}", flush=True)
        if interval < 1:
            print("waiting", flush=True)
            await asyncio.sleep(3600)
        await engine.close()
        print("closed", flush=True)

    asyncio.run(main())
    """
)


def cache(max_: int, min_: int, **fields: Any) -> dict[str, Any]:
    return {"cache_max": max_, "cache_min": min_, **fields}


def apply(name: str, cpus: list[int], fields: dict[str, Any]) -> list[Any]:
    """Apply a workload on `cpus` with these Workload fields (as JSON: the state file's encoding)."""
    return [
        "apply",
        "default",
        name,
        workload_to_json(Workload("default", name, core_ids=frozenset(cpus), **fields)),
    ]


PSTATE = {"pstate_ratio": 2.0}
ACTIONS: list[list[Any]] = [
    apply("a", S0[2:4], {**cache(2, 2), **PSTATE}),
    apply("b", S0[4:6], cache(3, 1)),
    apply("c", S0[6:7], cache(0, 0)),
    apply("d", [S0[8], S1[8]], cache(1, 1, mba_percentage=50)),
    apply("a", [S0[2], S0[9]], {**cache(3, 3), **PSTATE}),  # resize and move, P-state follows
    ["remove", "default", "b", None],
    apply("c", S0[6:7], cache(1, 1)),  # leaves the shared group for one of its own
    apply("e", S1[3:4], cache(0, 0)),
    ["remove", "default", "d", None],
]


def registry_after(count: int) -> dict[str, Workload]:
    """The registry (key -> request) after the first `count` actions, in acceptance order."""
    registry: dict[str, Workload] = {}
    for kind, ns, name, workload in ACTIONS[:count]:
        key = f"{ns}/{name}"
        if kind == "apply":
            registry[key] = workload_from_json(workload, key)
        else:
            del registry[key]
    return registry


@dataclasses.dataclass
class Node:
    host: Path
    mount: ResctrlMount

    @property
    def settings(self) -> AgentSettings:
        return AgentSettings(host_root=self.host, pstate_counters="files")

    @property
    def resctrl(self) -> Path:
        return self.host / RESCTRL

    def cpufreq(self) -> dict[int, tuple[int, int]]:
        out = {}
        for cpu in range(SPEC.cpus):
            base = self.host / CPUFREQ / f"policy{cpu}"
            out[cpu] = (
                int((base / "scaling_min_freq").read_text()),
                int((base / "scaling_max_freq").read_text()),
            )
        return out

    def set_cpufreq(self, cpu: int, limits: tuple[int, int]) -> None:
        base = self.host / CPUFREQ / f"policy{cpu}"
        (base / "scaling_min_freq").write_text(f"{limits[0]}\n")
        (base / "scaling_max_freq").write_text(f"{limits[1]}\n")

    def reset(self) -> None:
        """Back to a fresh node: no groups, the whole cache for the root, no agent state, original limits."""
        sim = self.mount.sim
        for group in sim.groups():
            sim.rmdir(group)
        sim.write("schemata", f"L3:0={SPEC.cbm_mask};1={SPEC.cbm_mask}\n")
        self.settings.host_path(self.settings.state_path).unlink(missing_ok=True)
        for cpu in range(SPEC.cpus):
            self.set_cpufreq(cpu, ORIGINAL)

    def drive(self, die_at: int, interval: float = 3600.0) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(self.host), json.dumps(ACTIONS), str(die_at), str(interval)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.fixture
def node(short_tmp: Path, fuse_ok: None) -> Iterator[Node]:
    host = short_tmp / "host"
    write_host_tree(SPEC, host)
    with ResctrlMount(host) as mount:
        yield Node(host, mount)


@pytest.fixture
async def engines() -> AsyncIterator[list[NodeEngine]]:
    started: list[NodeEngine] = []
    yield started
    for engine in started:
        await engine.close()


def masks(text: str) -> dict[int, int]:
    return {d: int(v, 16) for d, v in parse_schemata_text(text)["L3"].items()}


async def assert_converged(node: Node, engines: list[NodeEngine], acknowledged: int, where: str) -> None:
    engine = NodeEngine(node.settings, pstate_interval=3600)
    engines.append(engine)
    await engine.start()
    assert await engine.ready() == (True, ""), where
    listed = await engine.list()
    state = StateStore(node.settings.host_path(node.settings.state_path)).load()
    requests = {record.key: record.request for record in state.workloads}
    assert [w.workload.key for w in listed] == list(requests), where
    candidates = [registry_after(acknowledged), registry_after(min(acknowledged + 1, len(ACTIONS)))]
    assert requests in candidates, (
        f"{where}: registry {sorted(requests)} is neither before nor after the change"
    )
    assert list(requests) == list(next(c for c in candidates if c == requests)), f"{where}: order changed"
    assert all(w.status == "Successful" for w in listed), f"{where}: {[w.status for w in listed]}"

    sim = node.mount.sim
    ours = {g for g in sim.groups() if g.startswith("rmd-")}
    expected_groups = {w.cos_name for w in listed if w.cos_name}
    assert ours == expected_groups == state.owned_groups, f"{where}: groups {ours} vs {expected_groups}"
    shared_cpus: set[int] = set()
    for w in listed:
        cpus = w.workload.core_ids
        if w.cos_name == SHARED_GROUP:
            shared_cpus |= cpus
            continue
        assert parse_cpu_list(sim.read(f"{w.cos_name}/cpus_list")) == cpus, where
        group_masks = masks(sim.read(f"{w.cos_name}/schemata"))
        for cache_id, mask in w.cache.items():
            assert group_masks[cache_id] == mask, where
            if w.pool == "guaranteed":
                assert mask.bit_count() == w.workload.cache_max, where
    if SHARED_GROUP in ours:
        assert parse_cpu_list(sim.read(f"{SHARED_GROUP}/cpus_list")) == shared_cpus, where
    assert check_resctrl_tree(node.mount.backing_root) == [], where

    # converged means stable: another restart adopts everything without a single kernel write (the state file
    # is saved again only for the P-state originals, read before the monitors start)
    await engine.close()
    before = {g: (sim.read(f"{g}/schemata"), sim.read(f"{g}/cpus_list")) for g in ["", *sim.groups()]}
    again = NodeEngine(node.settings, pstate_interval=3600)
    engines.append(again)
    await again.start()
    assert again.applier.writes == 0, where
    assert again.store.load().workloads == state.workloads, where
    assert {g: (sim.read(f"{g}/schemata"), sim.read(f"{g}/cpus_list")) for g in ["", *sim.groups()]} == before
    await again.close()
    # and every frequency limit is back to what it was before any agent ran
    assert set(node.cpufreq().values()) == {ORIGINAL}, where


async def test_crash_at_every_step_converges(node: Node, engines: list[NodeEngine]) -> None:
    node.reset()
    clean = await asyncio.to_thread(node.drive, 0)
    out, err = await asyncio.to_thread(clean.communicate, None, 120)
    assert clean.returncode == 0, err
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert sum(" write " in s for s in steps) >= 20 and sum(s.endswith(" save") for s in steps) >= 10
    await assert_converged(node, engines, len(ACTIONS), "clean run")

    for k in range(1, len(steps) + 1):
        node.reset()
        child = await asyncio.to_thread(node.drive, k)
        out, err = await asyncio.to_thread(child.communicate, None, 120)
        where = f"killed after {steps[k - 1]!r}"
        assert child.returncode == -signal.SIGKILL, f"{where}: exit {child.returncode}: {err}"
        acknowledged = sum(line.startswith("done ") for line in out.splitlines())
        await assert_converged(node, engines, acknowledged, where)


async def test_killed_while_pinned_restores_the_true_originals(node: Node, engines: list[NodeEngine]) -> None:
    """The monitor pins the workload's cores to the top frequency; the agent is killed; the next agent
    writes back the limits the cores had before the first agent, not the pinned ones it finds."""
    node.reset()
    cpus = [S0[2], S0[9]]  # workload a's CPUs once the sequence is done
    child = node.drive(0, interval=0.01)
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 60
        while child.stdout.readline().strip() != "waiting":
            assert time.monotonic() < deadline and child.poll() is None
        while not all(node.cpufreq()[cpu][0] == SPEC.cpufreq_max_khz for cpu in cpus):
            for cpu in cpus:
                perf.advance(node.host, cpu, 200_000, 5.0)
            await asyncio.sleep(0.02)
            assert time.monotonic() < deadline, "the monitor never pinned the cores"
    finally:
        child.kill()
        child.wait()
    assert {node.cpufreq()[cpu][0] for cpu in cpus} == {SPEC.cpufreq_max_khz}
    engine = NodeEngine(node.settings, pstate_interval=3600)
    engines.append(engine)
    await engine.start()
    assert {node.cpufreq()[cpu] for cpu in cpus} == {ORIGINAL}
    [a] = [w for w in await engine.list() if w.workload.name == "a"]
    assert a.pstate is not None and a.pstate.detail == "applied"
    await engine.close()
    assert set(node.cpufreq().values()) == {ORIGINAL}
