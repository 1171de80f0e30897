"""The engine on simulated nodes whose resctrl is a FUSE mount with kernel behaviour (real syscalls): the
single-node acceptance cases of the RMD rewrite, idempotence, other tools' groups, refused writes with their
undo, restarts, P-state originals, container CPUs and the state file."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rmd_agent.act.resctrl_apply import ResctrlApplier, ResctrlWriteError
from rmd_agent.engine import NodeEngine
from rmd_agent.engine_api import CpuState, EngineUnavailable
from rmd_agent.errors import ConfigError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.container_cpus import cross_check_cpus
from rmd_agent.observe.resctrl import read_resctrl
from rmd_agent.plan.inventory import PoolConfig, PoolSizes, pool_sizes
from rmd_agent.plan.policy import PolicyBook, platform_from_cpuinfo
from rmd_agent.plan.resctrl_layout import (
    SHARED_GROUP,
    Mkdir,
    Operation,
    Rmdir,
    WriteCpus,
    WriteSchemata,
    group_name,
)
from rmd_agent.plan.workload import RejectReason, Workload, WorkloadRejected
from rmd_agent.pstate import FileCounters, PerfEventCounters
from rmd_agent.pstate.counters import counter_source
from rmd_agent.settings import AgentSettings
from rmd_agent.state_store import (
    _CPU_SET_FIELDS,
    _FIELD_TYPES,
    _WORKLOAD_FIELDS,
    AgentState,
    StateError,
    StateStore,
    WorkloadRecord,
)
from rmd_api.cpuset import format_cpu_list, parse_cpu_list
from rmd_api.kubelet.checkpoint import CpuManagerState
from rmd_api.node_state import RESCTRL_MOUNTED
from rmd_sim import perf
from rmd_sim.hosttree import write_host_tree
from rmd_sim.kubelet import ContainerSpec, SimKubelet
from rmd_sim.resctrl import RESCTRL, SimResctrl, check_resctrl_tree, parse_schemata_text
from rmd_sim.resctrl_fuse import ResctrlMount
from rmd_sim.spec import NodeSpec

SPEC = NodeSpec.default()
SOCKET0 = sorted(SPEC.cpus_of_socket(0))
SOCKET1 = sorted(SPEC.cpus_of_socket(1))
CPUFREQ = "sys/devices/system/cpu/cpufreq"


# -- the simulated node --------------------------------------------------------------------------------------


class KernelOps:
    """Records every resctrl operation that reaches the simulated kernel; `fail_at = k` makes the k-th one
    fail the way the kernel does (errno + info/last_cmd_status), through the simulator's fault injection."""

    def __init__(self, sim: SimResctrl) -> None:
        self.sim = sim
        self.ops: list[tuple[str, str]] = []
        self.fail_at: int | None = None
        for kind in ("write", "mkdir", "rmdir"):
            setattr(sim, kind, self._wrap(kind, getattr(sim, kind)))

    def _wrap(self, kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(rel: str, *args: Any) -> Any:
            rel = rel.strip("/")
            self.ops.append((kind, rel))
            if self.fail_at == len(self.ops):
                self.sim.inject_fault(rel, errno.EINVAL, f"injected refusal of op {len(self.ops)}", op=kind)
            return original(rel, *args)

        return call


@dataclasses.dataclass
class SimNode:
    spec: NodeSpec
    host: Path
    mount: ResctrlMount | None

    @property
    def settings(self) -> AgentSettings:
        return AgentSettings(node_name="node-1", host_root=self.host, pstate_counters="files")

    @property
    def sim(self) -> SimResctrl:
        assert self.mount is not None
        return self.mount.sim

    @property
    def resctrl(self) -> Path:
        return self.host / RESCTRL

    def problems(self) -> list[str]:
        assert self.mount is not None
        return check_resctrl_tree(self.mount.backing_root)

    def groups(self) -> list[str]:
        return self.sim.groups()

    def cpus(self, group: str) -> frozenset[int]:
        return parse_cpu_list(self.sim.read(f"{group}/cpus_list" if group else "cpus_list"))

    def masks(self, group: str, resource: str = "L3") -> dict[int, int]:
        text = self.sim.read(f"{group}/schemata" if group else "schemata")
        values = parse_schemata_text(text)[resource]
        return {d: int(v, 16) if resource != "MB" else int(v) for d, v in values.items()}

    def snapshot(self) -> dict[str, tuple[str, str, str]]:
        """Every group's schemata, cpus_list and mode, root included."""
        out = {}
        for group in ["", *self.groups()]:
            base = f"{group}/" if group else ""
            out[group] = tuple(self.sim.read(f"{base}{f}") for f in ("schemata", "cpus_list", "mode"))
        return out  # type: ignore[return-value]

    def state_file(self) -> Path:
        return self.settings.host_path(self.settings.state_path)

    def pools(self) -> PoolSizes:
        return pool_sizes(PoolConfig(), int(self.spec.cbm_mask, 16).bit_count(), self.spec.min_cbm_bits)


@pytest.fixture
def make_node(short_tmp: Path, fuse_ok: None) -> Iterator[Callable[..., SimNode]]:
    with contextlib.ExitStack() as stack:
        count = 0

        def make(spec: NodeSpec = SPEC, mounted: bool = True) -> SimNode:
            nonlocal count
            count += 1
            host = short_tmp / f"h{count}"
            write_host_tree(spec, host)
            mount = stack.enter_context(ResctrlMount(host)) if mounted else None
            return SimNode(spec, host, mount)

        yield make


@pytest.fixture
def node(make_node: Callable[..., SimNode]) -> SimNode:
    return make_node()


@pytest.fixture
async def start_engine(
    make_node: Callable[..., SimNode],
) -> AsyncIterator[Callable[..., Awaitable[NodeEngine]]]:
    """Starts engines and closes them before the mounts go (this fixture is torn down first)."""
    engines: list[NodeEngine] = []

    async def start(node: SimNode, **kwargs: Any) -> NodeEngine:
        engine = NodeEngine(node.settings, **kwargs)
        await engine.start()
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        await engine.close()


def wl(name: str, cpus: list[int], namespace: str = "default", uid: str = "", **fields: Any) -> Workload:
    """A workload on `cpus` with these Workload fields (cache(max, min), mba_percentage=..., ...)."""
    return Workload(namespace, name, uid, core_ids=frozenset(cpus), **fields)


def cache(max_: int, min_: int) -> dict[str, Any]:
    return {"cache_max": max_, "cache_min": min_}


def runs(mask: int) -> int:
    """Number of contiguous runs of set bits."""
    return len([run for run in bin(mask)[2:].split("0") if run])


def window(low: int, length: int) -> int:
    return ((1 << length) - 1) << low


# -- acceptance cases (reference §7.4) -----------------------------------------------------------------------


async def test_guaranteed_cache_on_explicit_cores(node: SimNode, start_engine: Any) -> None:
    """Case 1: the group exists with cpus == cores, and `max` contiguous ways inside the guaranteed pool on
    each cache id the cores use; elsewhere it holds only the OS ways, which never overlap a guarantee."""
    engine = await start_engine(node)
    cores = [SOCKET0[2], SOCKET0[3], SOCKET1[4]]
    applied, changed = await engine.apply(wl("web", cores, **cache(2, 2)))
    assert changed and applied.status == "Successful" and applied.pool == "guaranteed"
    assert applied.cos_name == group_name("default", "web") in node.groups()
    assert node.cpus(applied.cos_name) == frozenset(cores)
    sizes = node.pools()
    guaranteed_pool = window(sizes.os, sizes.guaranteed)
    masks = node.masks(applied.cos_name)
    for cache_id in (0, 1):
        assert masks[cache_id].bit_count() == 2 and runs(masks[cache_id]) == 1
        assert masks[cache_id] & ~guaranteed_pool == 0
    assert applied.cache == masks
    assert node.problems() == []

    other, _ = await engine.apply(wl("db", [SOCKET0[5]], **cache(3, 3)))
    db_masks = node.masks(other.cos_name)
    assert db_masks[0].bit_count() == 3 and db_masks[0] & masks[0] == 0
    assert db_masks[1] == window(0, sizes.os)  # no CPUs on cache id 1: only the OS ways
    assert [w.workload.key for w in await engine.list()] == ["default/web", "default/db"]
    assert node.problems() == []


async def test_overlapping_cores_are_a_conflict_and_leave_the_first_untouched(
    node: SimNode, start_engine: Any
) -> None:
    """Case 2."""
    engine = await start_engine(node)
    first, _ = await engine.apply(wl("a", SOCKET0[2:4], **cache(2, 2)))
    before = node.snapshot()
    with pytest.raises(WorkloadRejected) as caught:
        await engine.apply(wl("b", SOCKET0[3:5], **cache(1, 1)))
    assert caught.value.reason is RejectReason.CONFLICT and caught.value.workload == "default/b"
    assert f"CPU {SOCKET0[3]} is already assigned to workload default/a" in str(caught.value)
    assert node.snapshot() == before
    assert [w.workload.key for w in await engine.list()] == ["default/a"]
    assert (await engine.list())[0] == first
    assert node.problems() == []


async def test_all_cores_minus_reserved(node: SimNode, start_engine: Any) -> None:
    """Case 5."""
    engine = await start_engine(node)
    request = Workload(
        "default", "all", all_cores=True, reserved_core_ids=frozenset({0, 1, 33}), **cache(2, 2)
    )
    applied, _ = await engine.apply(request)
    expected = frozenset(range(SPEC.cpus)) - {0, 1, 33}
    assert applied.workload.core_ids == expected
    assert node.cpus(applied.cos_name) == expected
    assert node.cpus("") == {0, 1, 33}
    assert node.problems() == []


@pytest.mark.parametrize(
    ("max_", "min_", "pool"), [(2, 2, "guaranteed"), (3, 1, "besteffort"), (0, 0, "shared")]
)
async def test_pool_from_max_and_min(
    node: SimNode, start_engine: Any, max_: int, min_: int, pool: str
) -> None:
    """Case 7: the pool follows max/min; best effort gets at least min and at most max ways."""
    engine = await start_engine(node)
    applied, _ = await engine.apply(wl("w", SOCKET0[2:4], **cache(max_, min_)))
    assert applied.pool == pool
    mask = node.masks(applied.cos_name)[0]
    if pool == "shared":
        assert applied.cos_name == SHARED_GROUP
        assert mask == window(sum(dataclasses.astuple(node.pools())[:3]), node.pools().shared)
    else:
        assert min_ <= mask.bit_count() <= max_
    assert node.problems() == []


async def test_max_without_min_selects_no_pool(node: SimNode, start_engine: Any) -> None:
    """Case 7: max > 0 with min == 0 is invalid, whichever way the request arrives."""
    engine = await start_engine(node)
    before = node.snapshot()
    raw = Workload("default", "w", core_ids=frozenset(SOCKET0[2:4]), cache_max=4, cache_min=0)
    with pytest.raises(WorkloadRejected) as caught:
        await engine.apply(raw)
    assert caught.value.reason is RejectReason.INVALID and "selects no pool" in str(caught.value)
    assert node.snapshot() == before and await engine.list() == []


async def test_mba_percentage(node: SimNode, start_engine: Any) -> None:
    """Case 8: MBA with guaranteed cache on the workload's domain (rounded up to bandwidth_gran), the maximum
    elsewhere; the root group's MB line stays as it was."""
    engine = await start_engine(node)
    root_mb = node.masks("", "MB")
    applied, _ = await engine.apply(wl("w", SOCKET1[2:4], **cache(2, 2), mba_percentage=35))
    step = SPEC.mba_bandwidth_gran
    expected = -(-35 // step) * step
    assert node.masks(applied.cos_name, "MB") == {0: 100, 1: expected}
    assert applied.mba == {1: expected}
    assert node.masks("", "MB") == root_mb
    assert node.problems() == []


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (
            Workload("default", "w", core_ids=frozenset({2}), cache_max=3, cache_min=1, mba_percentage=50),
            "needs guaranteed cache",
        ),
        (
            Workload("default", "w", core_ids=frozenset({2}), cache_max=2, cache_min=2, mba_percentage=0),
            "within 1..100",
        ),
        (
            Workload("default", "w", core_ids=frozenset({2}), cache_max=2, cache_min=2, mba_percentage=101),
            "within 1..100",
        ),
        (
            Workload("default", "w", core_ids=frozenset({2}), cache_max=2, cache_min=2, mba_mbps=500),
            "takes a percentage",
        ),
        (
            Workload("default", "w", core_ids=frozenset({2}), cache_max=2, cache_min=2, mba_percentage=5),
            "below this node's minimum of 10%",
        ),
    ],
)
async def test_mba_refusals(node: SimNode, start_engine: Any, request_: Workload, message: str) -> None:
    """Case 8: MBA only with guaranteed cache, in range, in the node's unit."""
    engine = await start_engine(node)
    before = node.snapshot()
    with pytest.raises(WorkloadRejected) as caught:
        await engine.apply(request_)
    assert caught.value.reason is RejectReason.INVALID and message in str(caught.value)
    assert node.snapshot() == before


async def test_mba_mbps_mode(make_node: Callable[..., SimNode], start_engine: Any) -> None:
    """Case 8: with resctrl mounted -o mba_MBps, MBA is given in MBps and percentages are refused."""
    node = make_node(dataclasses.replace(SPEC, mba_mbps=True))
    engine = await start_engine(node)
    applied, _ = await engine.apply(wl("w", SOCKET0[2:3], **cache(2, 2), mba_mbps=2500))
    assert node.masks(applied.cos_name, "MB")[0] == 2500
    with pytest.raises(WorkloadRejected, match="give MBA in MBps"):
        await engine.apply(wl("p", SOCKET0[4:5], **cache(2, 2), mba_percentage=50))
    assert node.problems() == []


async def test_policies_expand_per_platform(node: SimNode, start_engine: Any) -> None:
    """Case 9: gold/silver/bronze take the node platform's values; an unknown policy is refused."""
    engine = await start_engine(node)
    platform = platform_from_cpuinfo((node.host / "proc/cpuinfo").read_text())
    policies = PolicyBook().for_platform(platform)
    pools = {"gold": "guaranteed", "silver": "besteffort", "bronze": "shared"}
    for i, name in enumerate(("gold", "silver", "bronze")):
        applied, _ = await engine.apply(wl(name, [SOCKET0[2 + i]], policy=name))
        assert (applied.workload.cache_max, applied.workload.cache_min) == (
            policies[name].cache_max,
            policies[name].cache_min,
        )
        assert applied.pool == pools[name]
        if name == "gold":
            assert node.masks(applied.cos_name)[0].bit_count() == policies[name].cache_max
    with pytest.raises(WorkloadRejected) as caught:
        await engine.apply(wl("x", [9], policy="platinum"))
    assert caught.value.reason is RejectReason.INVALID
    assert "unknown policy 'platinum'" in str(caught.value) and "gold" in str(caught.value)
    assert node.problems() == []


async def test_guaranteed_exhaustion_and_release(node: SimNode, start_engine: Any) -> None:
    """Case 10: the guaranteed pool runs out on a cache id; freeing one lets the next in."""
    engine = await start_engine(node)
    ways = node.pools().guaranteed
    for i in range(ways):
        await engine.apply(wl(f"g{i}", [SOCKET0[2 + i]], **cache(1, 1)))
        assert node.problems() == []
    before = node.snapshot()
    with pytest.raises(WorkloadRejected) as caught:
        await engine.apply(wl("late", [SOCKET0[20]], **cache(1, 1)))
    assert caught.value.reason is RejectReason.CAPACITY
    assert "not enough guaranteed cache on cache id 0: 1 ways requested, 0 free" in str(caught.value)
    assert node.snapshot() == before
    # the other socket's pool is untouched
    await engine.apply(wl("other-socket", [SOCKET1[2]], **cache(1, 1)))
    assert await engine.remove("default", "g0")
    applied, _ = await engine.apply(wl("late", [SOCKET0[20]], **cache(1, 1)))
    assert node.masks(applied.cos_name)[0].bit_count() == 1
    assert node.problems() == []


async def test_clos_exhaustion_and_release(make_node: Callable[..., SimNode], start_engine: Any) -> None:
    """Case 10: CLOSIDs run out with a clear error (the root and another tool's group count); freeing one
    lets the next in."""
    node = make_node(dataclasses.replace(SPEC, num_closids=4))
    os.mkdir(node.resctrl / "collectd")
    engine = await start_engine(node)
    await engine.apply(wl("a", [2], **cache(1, 1)))
    await engine.apply(wl("b", [3], **cache(3, 1)))
    with pytest.raises(WorkloadRejected) as caught:
        await engine.apply(wl("c", [4], **cache(1, 1)))
    assert caught.value.reason is RejectReason.CAPACITY
    assert "no free CLOS for workload default/c: this node has 4 CLOSIDs" in str(caught.value)
    assert "collectd" in str(caught.value)
    # shared workloads join one group, which still needs a CLOSID of its own
    with pytest.raises(WorkloadRejected, match="no free CLOS"):
        await engine.apply(wl("s", [5], **cache(0, 0)))
    assert await engine.remove("default", "b")
    await engine.apply(wl("c", [4], **cache(1, 1)))
    assert sorted(node.groups()) == ["collectd", "rmd-default.a", "rmd-default.c"]
    assert node.problems() == []


async def test_root_shrinks_and_never_overlaps_guarantees(node: SimNode, start_engine: Any) -> None:
    """Case 13: the root group gives up exactly what guarantees need and takes the cache back after."""
    engine = await start_engine(node)
    full = int(SPEC.cbm_mask, 16)
    assert set(node.masks("").values()) == {full}
    names = []
    for i, ways in enumerate((2, 1, 2)):
        applied, _ = await engine.apply(wl(f"g{i}", [SOCKET0[2 + i], SOCKET1[2 + i]], **cache(ways, ways)))
        names.append(applied.cos_name)
        root = node.masks("")
        for name in names:
            for cache_id, mask in node.masks(name).items():
                assert mask & root[cache_id] == 0
        assert node.problems() == []
    for i in range(3):
        assert await engine.remove("default", f"g{i}")
    assert set(node.masks("").values()) == {full}
    assert node.groups() == []


async def test_min_cbm_bits_is_honoured(make_node: Callable[..., SimNode], start_engine: Any) -> None:
    """Case 14: requests below min_cbm_bits are refused, and every mask written has at least that many."""
    node = make_node(dataclasses.replace(SPEC, min_cbm_bits=2))
    engine = await start_engine(node)
    for spec, message in ((cache(1, 1), "minimum of 2 ways"), (cache(3, 1), "minimum of 2 ways")):
        with pytest.raises(WorkloadRejected, match=message):
            await engine.apply(wl("small", [2], **spec))
    await engine.apply(wl("g", [2], **cache(2, 2)))
    await engine.apply(wl("b", [3], **cache(3, 2)))
    await engine.apply(wl("s", [4], **cache(0, 0)))
    for group in ["", *node.groups()]:
        for mask in node.masks(group).values():
            assert mask.bit_count() >= 2
    assert node.problems() == []


# -- fewest writes, ownership --------------------------------------------------------------------------------


async def test_second_apply_writes_nothing(node: SimNode, start_engine: Any) -> None:
    engine = await start_engine(node)
    kernel = KernelOps(node.sim)
    workload = wl("w", SOCKET0[2:4], **cache(2, 2), mba_percentage=50)
    first, changed = await engine.apply(workload)
    assert changed and kernel.ops
    kernel.ops.clear()
    saves = engine.store.saves
    again, changed = await engine.apply(workload)
    assert not changed and again == first
    assert kernel.ops == [] and engine.store.saves == saves


async def test_update_rewrites_only_what_changed(node: SimNode, start_engine: Any) -> None:
    engine = await start_engine(node)
    await engine.apply(wl("a", SOCKET0[2:4], **cache(2, 2)))
    await engine.apply(wl("b", SOCKET1[2:4], **cache(2, 2)))
    kernel = KernelOps(node.sim)
    applied, changed = await engine.apply(wl("a", SOCKET0[2:5], **cache(2, 2)))
    assert changed and kernel.ops == [("write", "rmd-default.a/cpus_list")]
    assert node.cpus("rmd-default.a") == set(SOCKET0[2:5])
    assert applied.id == "1"


async def test_other_tools_groups_are_never_touched(
    make_node: Callable[..., SimNode], start_engine: Any
) -> None:
    """Groups made by hand (one of them named like ours) keep their schemata and CPUs; their CPUs, ways and
    CLOSIDs are respected, and a name clash is a conflict, not an adoption."""
    node = make_node(dataclasses.replace(SPEC, num_closids=5))
    for name, cpus, mask in (("pqos-cos1", [SOCKET0[10]], "600"), ("rmd-foo", [SOCKET0[11]], "030")):
        os.mkdir(node.resctrl / name)
        (node.resctrl / name / "schemata").write_text(f"L3:0={mask};1={mask}\n")
        (node.resctrl / name / "cpus_list").write_text(format_cpu_list(cpus) + "\n")
    os.mkdir(node.resctrl / "rmd-default.clash")
    foreign = {g: v for g, v in node.snapshot().items() if g}
    engine = await start_engine(node)
    with pytest.raises(WorkloadRejected) as caught:
        await engine.apply(wl("steal", [SOCKET0[11]], **cache(1, 1)))
    assert caught.value.reason is RejectReason.CONFLICT and "'rmd-foo', which another tool manages" in str(
        caught.value
    )
    with pytest.raises(WorkloadRejected) as caught:
        await engine.apply(wl("clash", [SOCKET0[12]], **cache(1, 1)))
    assert "rmd-default.clash already exists and was not created by this agent" in str(caught.value)
    applied, _ = await engine.apply(wl("ok", [SOCKET0[2]], **cache(2, 2)))
    assert node.masks(applied.cos_name)[0] & 0x630 == 0  # off the foreign ways
    with pytest.raises(WorkloadRejected, match="no free CLOS"):  # 5 = root + 3 foreign + ours
        await engine.apply(wl("one-more", [SOCKET0[3]], **cache(1, 1)))
    assert await engine.remove("default", "ok")
    await engine.close()
    restarted = await start_engine(node)
    await restarted.apply(wl("again", [SOCKET0[4]], **cache(3, 1)))
    assert {g: v for g, v in node.snapshot().items() if g in foreign} == foreign
    assert restarted.store.load().owned_groups == {"rmd-default.again"}


# -- refused writes: the kernel is left as it was ------------------------------------------------------------


async def _setup(engine: NodeEngine) -> None:
    await engine.apply(wl("a", SOCKET0[2:4], **cache(2, 2)))
    await engine.apply(wl("b", SOCKET0[4:6], **cache(3, 1)))
    await engine.apply(wl("c", SOCKET0[6:7], **cache(0, 0)))
    await engine.apply(wl("c2", SOCKET1[6:7], **cache(0, 0)))


SCENARIOS: dict[str, Callable[[NodeEngine], Awaitable[Any]]] = {
    "create": lambda e: e.apply(wl("d", [SOCKET0[8], SOCKET1[8]], **cache(3, 3), mba_percentage=40)),
    "resize-and-move": lambda e: e.apply(wl("a", [SOCKET0[2], SOCKET0[9]], **cache(3, 3))),
    "remove": lambda e: e.remove("default", "a"),
    "join-shared": lambda e: e.apply(wl("s2", SOCKET1[2:4], **cache(0, 0))),
    "leave-shared": lambda e: e.apply(wl("c", SOCKET0[6:7], **cache(1, 1))),  # its CPU moves between groups
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_refused_write_is_undone(node: SimNode, start_engine: Any, scenario: str) -> None:
    """For every step k of a change, a kernel refusal at step k raises an error carrying last_cmd_status, and
    every group's schemata, CPUs and mode are exactly as before; the registry too. Then the change works."""
    engine = await start_engine(node)
    await _setup(engine)
    kernel = KernelOps(node.sim)
    before, registry = node.snapshot(), await engine.list()
    state_before = engine.store.load()

    step = 1
    while True:
        kernel.ops.clear()
        kernel.fail_at = step
        try:
            await SCENARIOS[scenario](engine)
        except ResctrlWriteError as exc:
            assert (
                f"injected refusal of op {step}" in str(exc)
                and exc.status == f"injected refusal of op {step}"
            )
            assert node.snapshot() == before, f"refusal at op {step} ({kernel.ops[step - 1]}) left changes"
            assert await engine.list() == registry
            after = engine.store.load()
            assert after.workloads == state_before.workloads
            assert node.problems() == []
            step += 1
            continue
        break
    assert step > 1, "the change needed no kernel write"
    kernel.fail_at = None
    assert node.problems() == []
    assert node.snapshot() != before


def test_applier_undoes_every_kind_of_operation(node: SimNode) -> None:
    """The applier alone, on a sequence that moves CPUs between groups (the undo must give them back to the
    group they came from), creates and removes groups: a refusal at any step leaves the tree as it was."""
    for name, cpus, mask in (("g1", "2-3", "6"), ("g2", "4", "18"), ("g3", "7", "60")):
        os.mkdir(node.resctrl / name)
        (node.resctrl / name / "schemata").write_text(f"L3:0={mask};1={mask}\n")
        (node.resctrl / name / "cpus_list").write_text(cpus)
    ops: list[Operation] = [
        WriteCpus("g2", frozenset({3, 4, 5})),
        WriteSchemata("g1", {"L3": {0: "2"}}),
        Mkdir("g4"),
        WriteSchemata("g4", {"L3": {0: "c", 1: "1"}, "MB": {1: "50"}}),
        WriteCpus("g4", frozenset({2, 6})),
        Rmdir("g3"),
        WriteCpus("g1", frozenset({8})),
        WriteSchemata("", {"L3": {0: "1", 1: "1"}}),
    ]
    owned = {"g1", "g2", "g3", "g4"}.__contains__
    kernel = KernelOps(node.sim)
    applier = ResctrlApplier(node.resctrl)
    before = node.snapshot()
    for step in range(1, len(ops) + 1):
        kernel.fail_at, kernel.ops = step, []
        current = read_resctrl(HostFS(node.host))
        assert not isinstance(current, Unsupported)
        with pytest.raises(ResctrlWriteError, match=f"injected refusal of op {step}"):
            applier.apply(ops, current, owned)
        assert node.snapshot() == before, f"refusal at {ops[step - 1]} left changes"
    kernel.fail_at = None
    current = read_resctrl(HostFS(node.host))
    assert not isinstance(current, Unsupported)
    assert applier.apply(ops, current, owned) == len(ops)
    assert sorted(node.groups()) == ["g1", "g2", "g4"]
    assert [node.cpus(g) for g in ("g1", "g2", "g4")] == [{8}, {3, 4, 5}, {2, 6}]
    assert node.masks("g4") == {0: 0xC, 1: 1} and node.masks("g4", "MB")[1] == 50
    assert node.problems() == []


def test_applier_refuses_to_touch_other_groups(node: SimNode) -> None:
    os.mkdir(node.resctrl / "theirs")
    (node.resctrl / "theirs" / "cpus_list").write_text("5")
    os.mkdir(node.resctrl / "mine")
    kernel = KernelOps(node.sim)
    applier = ResctrlApplier(node.resctrl)
    current = read_resctrl(HostFS(node.host))
    assert not isinstance(current, Unsupported)
    owned = {"mine"}.__contains__
    refused: list[list[Operation]] = [
        [WriteSchemata("mine", {"L3": {0: "1"}}), WriteSchemata("theirs", {"L3": {0: "1"}})],
        [WriteSchemata("mine", {"L3": {0: "1"}}), WriteCpus("mine", frozenset({5}))],  # 5 is theirs
        [Rmdir("theirs")],
        [WriteCpus("", frozenset({1}))],
        [Mkdir("mine")],
    ]
    for ops in refused:
        with pytest.raises(ValueError, match="refusing to"):
            applier.apply(ops, current, owned)
    assert kernel.ops == []


async def test_refused_mkdir_reports_the_kernels_reason(node: SimNode, start_engine: Any) -> None:
    engine = await start_engine(node)
    await engine.apply(wl("a", SOCKET0[2:4], **cache(2, 2)))
    before = node.snapshot()
    node.sim.inject_fault("rmd-default.b", errno.ENOSPC, "Out of CLOSIDs", op="mkdir")
    with pytest.raises(ResctrlWriteError) as caught:
        await engine.apply(wl("b", SOCKET0[4:6], **cache(1, 1)))
    assert "mkdir rmd-default.b" in str(caught.value) and "last_cmd_status: Out of CLOSIDs" in str(
        caught.value
    )
    assert caught.value.errno == errno.ENOSPC and caught.value.undo_errors == ()
    assert node.snapshot() == before
    assert [w.workload.key for w in await engine.list()] == ["default/a"]


# -- restart and reconcile -----------------------------------------------------------------------------------


async def test_restart_adopts_without_writing(node: SimNode, start_engine: Any) -> None:
    engine = await start_engine(node)
    await _setup(engine)
    listed = await engine.list()
    await engine.close()
    kernel = KernelOps(node.sim)
    restarted = await start_engine(node)
    assert kernel.ops == [] and restarted.store.saves == 0
    assert await restarted.list() == listed
    assert await restarted.ready() == (True, "")


async def test_restart_repairs_missing_groups_and_removes_owned_orphans(
    node: SimNode, start_engine: Any
) -> None:
    engine = await start_engine(node)
    await _setup(engine)
    await engine.close()
    c_before = node.snapshot()[SHARED_GROUP]
    os.rmdir(node.resctrl / "rmd-default.a")  # deleted behind the agent's back
    state = json.loads(node.state_file().read_text())  # b forgotten, its group still recorded as ours
    state["workloads"] = [w for w in state["workloads"] if w["request"]["name"] != "b"]
    node.state_file().write_text(json.dumps(state))
    restarted = await start_engine(node)
    assert sorted(node.groups()) == ["rmd-default.a", SHARED_GROUP]
    assert node.cpus("rmd-default.a") == set(SOCKET0[2:4])
    assert node.masks("rmd-default.a")[0].bit_count() == 2
    assert node.snapshot()[SHARED_GROUP][1] == c_before[1]
    assert restarted.store.load().owned_groups == {"rmd-default.a", SHARED_GROUP}
    assert [w.workload.key for w in await restarted.list()] == ["default/a", "default/c", "default/c2"]
    assert node.problems() == []


async def test_registry_workload_that_no_longer_fits_is_kept_as_failed(
    node: SimNode, start_engine: Any
) -> None:
    engine = await start_engine(node)
    await engine.apply(wl("a", SOCKET0[2:4], **cache(2, 2)))
    await engine.close()
    os.rmdir(node.resctrl / "rmd-default.a")
    os.mkdir(node.resctrl / "intruder")  # another tool takes a's CPUs meanwhile
    (node.resctrl / "intruder" / "cpus_list").write_text(format_cpu_list(SOCKET0[2:4]))
    restarted = await start_engine(node)
    [failed] = await restarted.list()
    assert failed.status.startswith("Failed: ") and "'intruder'" in failed.status and failed.cos_name == ""
    assert "rmd-default.a" not in node.groups()
    os.rmdir(node.resctrl / "intruder")
    applied, changed = await restarted.apply(wl("a", SOCKET0[2:4], **cache(2, 2)))
    assert changed and applied.status == "Successful" and "rmd-default.a" in node.groups()


async def test_registry_conflict_names_another_namespace_in_the_log_only(
    node: SimNode, start_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A registry workload refused at restart: its status (ListWorkloads, RmdNodeState) does not name the
    holder in another namespace; the agent's log does."""
    engine = await start_engine(node)
    await engine.apply(wl("overlap-a", SOCKET0[2:4], **cache(2, 2)))
    await engine.apply(wl("b", SOCKET0[4:6], "team-b", **cache(1, 1)))
    await engine.close()
    state = json.loads(node.state_file().read_text())  # b's CPUs edited onto a's behind the agent's back
    state["workloads"][1]["request"]["core_ids"] = format_cpu_list(SOCKET0[3:5])
    node.state_file().write_text(json.dumps(state))
    with caplog.at_level(logging.ERROR, logger="rmd_agent.engine"):
        restarted = await start_engine(node)
    failed = next(a for a in await restarted.list() if a.workload.key == "team-b/b")
    assert failed.status.startswith(f"Failed: CPU {SOCKET0[3]} is already assigned to a workload in another ")
    assert "default" not in failed.status and "overlap-a" not in failed.status
    logged = [r.getMessage() for r in caplog.records if "team-b/b" in r.getMessage()]
    assert any(f"CPU {SOCKET0[3]} is already assigned to workload default/overlap-a" in m for m in logged)


async def test_ready_follows_the_mount(node: SimNode, start_engine: Any) -> None:
    engine = NodeEngine(node.settings)
    assert (await engine.ready())[0] is False
    await engine.start()
    try:
        await engine.apply(wl("a", SOCKET0[2:4], **cache(2, 2)))
        assert await engine.ready() == (True, "")
        assert node.mount is not None
        node.mount.stop()
        ok, reason = await engine.ready()
        assert not ok and "resctrl is not mounted" in reason
        with pytest.raises(EngineUnavailable):
            await engine.apply(wl("b", SOCKET0[4:6], **cache(2, 2)))
        node.mount.start()
        assert await engine.ready() == (True, "")
        applied, _ = await engine.apply(wl("b", SOCKET0[4:6], **cache(2, 2)))
        assert applied.cos_name in node.groups()
    finally:
        await engine.close()


async def test_readers_are_told_of_every_change_and_of_nothing_else(node: SimNode) -> None:
    """The device plugin and the RmdNodeState writer wait for these instead of re-reading resctrl."""
    assert node.mount is not None
    engine = NodeEngine(node.settings)
    told: list[int] = []
    engine.add_change_listener(lambda: told.append(1))
    await engine.start()
    try:
        assert len(told) == 1  # the reconcile at start
        await engine.ready()
        told.clear()
        await engine.apply(wl("a", SOCKET0[2:4], **cache(2, 2)))
        assert len(told) == 1
        await engine.apply(wl("a", SOCKET0[2:4], **cache(2, 2)))  # the same again: no change
        await engine.remove("default", "absent")
        await engine.ready()
        await engine.list()
        await engine.cache_domains()
        assert len(told) == 1
        await engine.remove("default", "a")
        assert len(told) == 2
        node.mount.stop()
        assert (await engine.ready())[0] is False
        assert len(told) == 3  # readiness turned, noticed by whoever asked
        await engine.ready()
        assert len(told) == 3
        node.mount.start()
        assert await engine.ready() == (True, "")
        assert len(told) == 4
    finally:
        await engine.close()


async def test_capabilities_follow_a_readiness_turn_at_once(node: SimNode, start_engine: Any) -> None:
    """The probe is cached for minutes (it is the dearest read of the node summary), but not across resctrl
    being unmounted or mounted again."""
    assert node.mount is not None
    engine = await start_engine(node)
    assert (await engine.node()).capabilities[RESCTRL_MOUNTED][0] is True
    node.mount.stop()
    try:
        await engine.ready()
        assert (await engine.node()).capabilities[RESCTRL_MOUNTED][0] is False
    finally:
        node.mount.start()
    await engine.ready()
    assert (await engine.node()).capabilities[RESCTRL_MOUNTED][0] is True


async def test_start_unmounted_reconciles_once_mounted(node: SimNode) -> None:
    assert node.mount is not None
    engine = NodeEngine(node.settings)
    await engine.start()
    await engine.apply(wl("a", SOCKET0[2:4], **cache(2, 2)))
    await engine.close()
    node.mount.stop()
    late = NodeEngine(node.settings)
    await late.start()
    try:
        ok, reason = await late.ready()
        assert not ok and "not mounted" in reason
        [pending] = await late.list()
        assert pending.status.startswith("Pending")
        node.mount.start()
        assert await late.ready() == (True, "")
        [applied] = await late.list()
        assert applied.status == "Successful" and applied.cos_name == "rmd-default.a"
    finally:
        await late.close()


# -- nodes without RDT ---------------------------------------------------------------------------------------


async def test_node_without_rdt_takes_pstate_only_workloads(
    make_node: Callable[..., SimNode], start_engine: Any
) -> None:
    node = make_node(
        dataclasses.replace(SPEC, rdt=False, resctrl_mounted=False, mba=False, l3_mon=False), mounted=False
    )
    engine = await start_engine(node, pstate_interval=3600)
    assert await engine.ready() == (True, "")
    with pytest.raises(WorkloadRejected) as caught:
        await engine.apply(wl("cache", [2], **cache(2, 2)))
    assert caught.value.reason is RejectReason.INVALID and "no L3 cache allocation" in str(caught.value)
    applied, changed = await engine.apply(wl("fast", [2, 3], pstate_ratio=3.0))
    assert changed and applied.status == "Successful" and applied.cos_name == "" and applied.pool == "none"
    assert applied.pstate is not None and applied.pstate.supported and applied.pstate.detail == "applied"
    summary = await engine.node()
    assert summary.closids_total == 0 and not summary.capabilities["rdtL3Cat"][0]


# -- P-state originals ---------------------------------------------------------------------------------------


def limits(node: SimNode, cpu: int) -> tuple[int, int]:
    base = node.host / CPUFREQ / f"policy{cpu}"
    return int((base / "scaling_min_freq").read_text()), int((base / "scaling_max_freq").read_text())


async def test_pstate_originals_are_saved_before_the_monitor_writes(node: SimNode, start_engine: Any) -> None:
    engine = await start_engine(node, pstate_interval=0.01)
    cpus = SOCKET0[2:4]
    original = {cpu: limits(node, cpu) for cpu in cpus}
    applied, _ = await engine.apply(wl("fast", cpus, **cache(2, 2), pstate_ratio=2.0))
    assert applied.pstate is not None and applied.pstate.detail == "applied"
    saved = engine.store.load().pstate_originals
    assert {cpu: (saved[cpu].min_khz, saved[cpu].max_khz) for cpu in cpus} == original
    for _ in range(200):  # busy load: the monitor pins the CPUs to the top frequency
        for cpu in cpus:
            perf.advance(node.host, cpu, 200_000, 5.0)
        await asyncio.sleep(0.01)
        if all(limits(node, cpu)[0] == SPEC.cpufreq_max_khz for cpu in cpus):
            break
    assert all(limits(node, cpu)[0] == SPEC.cpufreq_max_khz for cpu in cpus)
    assert await engine.remove("default", "fast")
    assert {cpu: limits(node, cpu) for cpu in cpus} == original
    assert engine.store.load().pstate_originals == {}


async def test_monitoring_without_ratio_is_refused(node: SimNode, start_engine: Any) -> None:
    engine = await start_engine(node)
    with pytest.raises(WorkloadRejected, match="needs a ratio"):
        await engine.apply(wl("p", [2], pstate_monitoring="on"))
    applied, _ = await engine.apply(wl("p", [2], pstate_monitoring="off"))
    assert applied.pstate is not None and applied.pstate.detail == "off"


# -- node summary and container CPUs -------------------------------------------------------------------------


async def test_node_summary(node: SimNode, start_engine: Any) -> None:
    engine = await start_engine(node)
    os.mkdir(node.resctrl / "collectd")
    await engine.apply(wl("g", [SOCKET0[2]], **cache(2, 2)))
    await engine.apply(wl("b", [SOCKET0[3]], **cache(3, 1)))
    summary = await engine.node()
    sizes = node.pools()
    assert (
        summary.node_name == "node-1" and summary.cpus == SPEC.cpus and summary.numa_nodes == SPEC.numa_nodes
    )
    assert summary.workloads == 2 and summary.closids_total == SPEC.num_closids
    assert summary.closids_used == 4  # root, collectd and our two groups
    by_id = {c.cache_id: c for c in summary.caches}
    assert by_id[0].cpus == frozenset(SOCKET0) and by_id[0].ways == int(SPEC.cbm_mask, 16).bit_count()
    assert by_id[0].free_ways == {
        "guaranteed": sizes.guaranteed - 2,
        "besteffort": sizes.besteffort - 1,
        "shared": sizes.shared,
    }
    assert by_id[1].free_ways["guaranteed"] == sizes.guaranteed
    assert summary.capabilities["rdtL3Cat"][0] and summary.capabilities["resctrlMounted"][0]
    assert await engine.node_capabilities() == summary.capabilities  # what RmdNodeState asks, no resctrl read
    assert await engine.cache_domains() == summary.caches


@pytest.mark.parametrize("get_enabled", [True, False], ids=["get", "get-disabled"])
async def test_container_cpus(node: SimNode, start_engine: Any, get_enabled: bool) -> None:
    """The same answers whether the kubelet offers PodResources Get or only List (its gate is off)."""
    engine = await start_engine(node)
    guaranteed = ContainerSpec(
        "app", cpu_request="2", cpu_limit="2", memory_request="1Gi", memory_limit="1Gi"
    )
    async with SimKubelet.from_host_tree(node.host, get_enabled=get_enabled) as kubelet:
        pod = kubelet.add_pod("default", "pinned", "uid-1", [guaranteed])
        kubelet.add_pod("default", "burst", "uid-2", [("app", "1", "2", "1Gi")])
        got = await engine.container_cpus("default", "pinned", "uid-1", "app")
        assert got.state is CpuState.ALLOCATED and got.cpus == pod.cpus["app"] and len(got.cpus) == 2
        assert (await engine.container_cpus("default", "pinned", "", "app")).cpus == pod.cpus["app"]
        missing = await engine.container_cpus("default", "nope", "", "app")
        assert missing.state is CpuState.NOT_YET_ALLOCATED and "no pod default/nope" in missing.detail
        other = await engine.container_cpus("default", "pinned", "uid-1", "sidecar")
        assert other.state is CpuState.NOT_YET_ALLOCATED
        shared = await engine.container_cpus("default", "burst", "uid-2", "app")
        assert shared.state is CpuState.NOT_EXCLUSIVE
        stale = await engine.container_cpus("default", "pinned", "uid-old", "app")
        assert stale.state is CpuState.NOT_YET_ALLOCATED and "belong to pod uid uid-1" in stale.detail
        # What lookups use, in the capabilities the RmdNodeState publishes.
        supported, detail = (await engine.node()).capabilities["podResourcesGet"]
        assert supported is get_enabled
        if get_enabled:
            assert detail == "pod lookups use Get"
        else:
            assert detail.startswith(
                "pod lookups use List (Get disabled: PodResources API Get method disabled)"
            )
            assert "(PodResources List (Get disabled" in missing.detail


def test_cross_check_against_the_checkpoint() -> None:
    state = CpuManagerState("static", "0-1,6-63", {"uid-1": {"app": "2-3"}, "uid-2": {"db": "4-5"}}, {}, "v2")
    assert cross_check_cpus(state, "uid-1", "app", frozenset({2, 3})) is None
    assert "records 2-3" in (cross_check_cpus(state, "uid-1", "app", frozenset({2, 7})) or "")
    assert "belong to pod uid uid-2" in (cross_check_cpus(state, "uid-9", "db", frozenset({4, 5})) or "")
    v1 = CpuManagerState("static", "0-63", {}, {}, "v1", container_id_entries={"abc": "2-3"})
    assert cross_check_cpus(v1, "uid-1", "app", frozenset({9})) is None


# -- the state file ------------------------------------------------------------------------------------------


def test_state_round_trip_and_atomic_replace(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state" / "state.json")
    assert store.load() == AgentState()
    request = Workload(
        "ns", "w", "uid-7", all_cores=True, reserved_core_ids=frozenset({0}), policy="gold", pstate_ratio=3.0
    )
    state = AgentState(
        workloads=(
            WorkloadRecord(
                "4", request, dataclasses.replace(request, resolved=True, core_ids=frozenset({1, 2}))
            ),
        ),
        owned_groups=frozenset({"rmd-ns.w"}),
        next_id=5,
    )
    assert store.save(state) and not store.save(state)  # unchanged: not written again
    assert StateStore(store.path).load() == state
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["state.json"]
    assert set(_FIELD_TYPES) | _CPU_SET_FIELDS == set(_WORKLOAD_FIELDS)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "unusable"),
        ('{"format": "something-else"}', "not an rmd-agent state file"),
        ('{"format": "rmd-agent-state", "version": 99}', "version 99"),
        (
            '{"format": "rmd-agent-state", "version": 1, "workloads": [{"id": "1", "request": '
            '{"namespace": "a", "name": "b", "cache_max": "x"}}]}',
            "cache_max has the wrong type",
        ),
        ('{"format": "rmd-agent-state", "version": 1, "owned_groups": [1]}', "owned_groups"),
    ],
)
def test_unusable_state_file_is_refused(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(content)
    with pytest.raises(StateError, match=message):
        StateStore(path).load()


async def test_engine_refuses_to_start_on_a_corrupt_state_file(node: SimNode) -> None:
    node.state_file().parent.mkdir(parents=True, exist_ok=True)
    node.state_file().write_text("{")
    before = node.snapshot()
    engine = NodeEngine(node.settings)
    with pytest.raises(StateError, match="will not guess"):
        await engine.start()
    assert node.snapshot() == before
    assert (await engine.ready())[0] is False


def test_counters_follow_the_setting(make_node: Callable[..., SimNode]) -> None:
    fs = HostFS(make_node(mounted=False).host)  # a simulated tree: its counter files are not looked for
    assert isinstance(counter_source("perf", fs), PerfEventCounters)
    assert isinstance(counter_source("files", fs), FileCounters)
    with pytest.raises(ConfigError, match="pstate_counters"):
        counter_source("sim", fs)


async def test_a_cancelled_apply_still_leaves_engine_kernel_and_state_agreeing(
    node: SimNode, start_engine: Any
) -> None:
    """A gRPC call whose deadline runs out cancels apply() while its worker thread writes resctrl; the engine
    must still record what the thread did, or it would take its own group for another tool's."""
    engine = await start_engine(node)
    for i in range(4):
        workload = wl(f"c{i}", SOCKET0[2 * i + 2 : 2 * i + 4], **cache(1, 1))
        task = asyncio.create_task(engine.apply(workload))
        await asyncio.sleep(0.001 * i)  # cancel at different points of the step
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        applied, _ = await engine.apply(workload)  # the retry a client makes succeeds
        assert applied.status == "Successful"
    listed = {a.workload.key: a.cos_name for a in await engine.list()}
    groups = set(node.sim.groups()) - {""}
    assert set(listed.values()) <= groups
    assert groups == set(listed.values())  # nothing leaked: every group on the node is a listed workload's
    assert check_resctrl_tree(node.mount.backing_root) == []
    restarted = await start_engine(node)  # the state file agrees too
    assert {a.workload.key: a.cos_name for a in await restarted.list()} == listed
