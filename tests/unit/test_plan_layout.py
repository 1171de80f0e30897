"""The resctrl planner: kernel rules, pool invariants, stability, and the operations that apply a plan.

Three checks back each other: `kernel_problems` (this file's own reading of the kernel's rules), the simulated
kernel's pure operations (rmd_sim.resctrl op_*: every operation of a diff must be accepted, in order), and a
simulated host tree driven through SimResctrl and checked with check_resctrl_tree.
"""

import dataclasses
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rmd_agent.errors import ConfigError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.observe.caches import L3Cache, read_l3_caches
from rmd_agent.observe.cpus import read_online_cpus
from rmd_agent.observe.resctrl import CacheInfo, MbaInfo, ResctrlGroup, ResctrlState, read_resctrl
from rmd_agent.plan.allocation import workload_allocation
from rmd_agent.plan.inventory import NodeInventory, PoolConfig, pool_sizes
from rmd_agent.plan.mba import mba_applied
from rmd_agent.plan.policy import PolicyBook
from rmd_agent.plan.resctrl_layout import (
    MAX_GROUP_NAME,
    SHARED_GROUP,
    Layout,
    Mkdir,
    Operation,
    Rmdir,
    WriteCpus,
    WriteSchemata,
    cache_resources,
    diff,
    group_name,
    is_owned,
    plan_layout,
)
from rmd_agent.plan.workload import Pool, RejectReason, Workload, WorkloadRejected, resolve_workload
from rmd_sim import resctrl as sim
from rmd_sim.hosttree import write_host_tree
from rmd_sim.spec import NodeSpec

# -- building nodes and states -------------------------------------------------------------------------------


def make_node(
    *,
    ways: int = 11,
    min_bits: int = 1,
    sparse: bool = False,
    cdp: bool = False,
    closids: int = 16,
    domains: int = 2,
    per_domain: int = 4,
    mba: str | None = "percent",
    shareable: int = 0,
    pools: PoolConfig | None = None,
) -> NodeInventory:
    """`domains` L3 domains of `per_domain` CPUs each (CPU c is on domain c // per_domain). With 11 ways the
    pools are OS 1, guaranteed 5, best effort 4, shared 1: bits 0, 1-5 (0x3e), 6-9 (0x3c0), 10 (0x400)."""
    l3 = CacheInfo((1 << ways) - 1, min_bits, closids, shareable, sparse, cdp)
    mb = None if mba is None else MbaInfo(10, 10, True, closids, mbps=mba == "mbps")
    caches = {d: frozenset(range(d * per_domain, (d + 1) * per_domain)) for d in range(domains)}
    return NodeInventory(
        cpus=frozenset(range(domains * per_domain)),
        caches=caches,
        l3=l3,
        mba=mb,
        pools=pools or PoolConfig(),
        platform="skylake",
        policies=PolicyBook().for_platform("skylake"),
    )


def wl(
    name: str, cores: Iterable[int], cache_max: int | None = None, cache_min: int | None = None, **kw: Any
) -> Workload:
    """A workload in namespace "default"; cache_min defaults to cache_max (guaranteed)."""
    if cache_max is not None and cache_min is None:
        cache_min = cache_max
    return Workload(
        "default", name, core_ids=frozenset(cores), cache_max=cache_max, cache_min=cache_min, **kw
    )


def sim_state(node: NodeInventory, foreign: Sequence[sim.Group] = ()) -> sim.ResctrlState:
    """A fresh mount of `node` as the simulated kernel models it, plus other tools' groups (no CDP)."""
    assert node.l3 is not None and not node.l3.cdp
    l3 = node.l3
    mb = None
    if node.mba is not None:
        mb = sim.MbInfo(node.mba.min_bandwidth, node.mba.bandwidth_gran, node.mba.num_closids, node.mba.mbps)
    info = sim.ResctrlInfo(
        l3=sim.CacheInfo(l3.cbm_mask, l3.min_cbm_bits, l3.shareable_bits, l3.sparse_masks, l3.num_closids),
        mb=mb,
        num_rmids=None,
        online=node.cpus,
        nr_cpu_ids=max(node.cpus) + 1,
    )
    ids = tuple(sorted(node.caches))
    domains: dict[str, tuple[int, ...]] = {"L3": ids}
    schemata: dict[str, Mapping[int, int]] = {"L3": dict.fromkeys(ids, l3.cbm_mask)}
    if mb is not None:
        domains["MB"] = ids
        schemata["MB"] = dict.fromkeys(ids, mb.max)
    taken: frozenset[int] = frozenset().union(*(f.cpus for f in foreign))
    groups = {"": sim.Group("", schemata, node.cpus - taken)}
    for f in foreign:
        groups[f.name] = dataclasses.replace(f, schemata={**schemata, **f.schemata})
    return sim.ResctrlState(info, domains, {}).with_groups(groups)


def observed(state: sim.ResctrlState, node: NodeInventory) -> ResctrlState:
    """The simulated tree as the agent's observe layer reports it (masks zero-padded as the kernel prints)."""
    assert node.l3 is not None
    width = (node.l3.cbm_mask.bit_length() + 3) // 4

    def group(gr: sim.Group) -> ResctrlGroup:
        values = {
            res: {d: f"{v:0{width}x}" if res == "L3" else str(v) for d, v in vals.items()}
            for res, vals in gr.schemata.items()
        }
        return ResctrlGroup(gr.name, values, gr.cpus, gr.mode)

    return ResctrlState(
        mount_options=frozenset({"mba_MBps"}) if node.mba and node.mba.mbps else frozenset(),
        l3=node.l3,
        mba=node.mba if node.mba else Unsupported("no MBA"),
        root=group(state.root),
        groups=tuple(group(gr) for n, gr in sorted(state.groups.items()) if n),
    )


def apply(state: sim.ResctrlState, op: Operation) -> sim.ResctrlState:
    """One operation through the simulated kernel, which raises KernelReject where the kernel would refuse."""
    if isinstance(op, Mkdir):
        return sim.op_mkdir(state, op.group)
    if isinstance(op, Rmdir):
        return sim.op_rmdir(state, op.group)
    if isinstance(op, WriteSchemata):
        return sim.op_write_schemata(state, op.group, op.text)
    return sim.op_write_cpus(state, op.group, op.text, as_list=True)


def shared_guaranteed_ways(state: sim.ResctrlState, node: NodeInventory, guaranteed: set[str]) -> list[str]:
    """Guaranteed groups sharing guaranteed-pool ways with another group that runs on the same domain, in this
    state. Other tools' groups with the full mask are unrestricted rather than claims (pqos pre-creates such
    groups), so they do not count."""
    assert node.l3 is not None
    pool = plan_layout(node, []).regions
    assert pool is not None
    problems = []
    for name in sorted(guaranteed & set(state.groups)):
        mine = state.groups[name]
        for d, cpus in node.caches.items():
            if not mine.cpus & cpus:
                continue
            for other in state.groups.values():
                theirs = other.schemata["L3"][d]
                if other.name and not is_owned(other.name) and theirs == node.l3.cbm_mask:
                    continue
                common = theirs & mine.schemata["L3"][d] & pool.guaranteed
                if other.name != name and other.cpus & cpus and common:
                    problems.append(f"{name} shares ways {common:x} of cache {d} with group {other.name!r}")
    return problems


def apply_all(
    state: sim.ResctrlState, ops: Iterable[Operation], node: NodeInventory, guaranteed: set[str]
) -> sim.ResctrlState:
    """Apply a diff: the kernel must accept every step, only our groups (and the root's cache lines) change,
    and no guaranteed way is shared by two groups running on its domain at any step."""
    for op in ops:
        assert op.group == "" or is_owned(op.group), f"{op} touches a group that is not ours"
        assert not (isinstance(op, WriteCpus) and op.group == ""), "the root group's CPUs are never written"
        try:
            state = apply(state, op)
        except sim.KernelReject as exc:
            raise AssertionError(f"the kernel refuses {op}: {exc.status} (errno {exc.errno})") from None
        problems = shared_guaranteed_ways(state, node, guaranteed)
        assert not problems, f"after {op}: {problems}"
    return state


def guaranteed_groups(*layouts: Layout) -> set[str]:
    return {gr.name for layout in layouts for gr in layout.groups if gr.pool is Pool.GUARANTEED}


def summary(layout: Layout) -> tuple[Any, ...]:
    """What must not change when planning again over an applied layout. Only the set of rejected workloads
    counts, not their reasons: once its rivals have groups, a refused workload can be refused for the CPU it
    shares with them rather than for the capacity they took (workloads with groups are placed first)."""
    return layout.root_schemata, layout.root_cpus, layout.groups, layout.accepted, set(layout.rejected)


# -- this file's own reading of the kernel's rules, and the layout's promises --------------------------------


def _runs(mask: int) -> list[tuple[int, int]]:
    runs, bit = [], 0
    while mask >> bit:
        if mask >> bit & 1:
            start = bit
            while mask >> bit & 1:
                bit += 1
            runs.append((start, bit - start))
        else:
            bit += 1
    return runs


def cbm_problem(mask: int, l3: CacheInfo) -> str | None:
    """resctrl.rst / cbm_validate: inside cbm_mask, non-empty, contiguous unless sparse_masks, lowest run at
    least min_cbm_bits."""
    if mask & ~l3.cbm_mask:
        return f"{mask:x} outside cbm_mask {l3.cbm_mask:x}"
    runs = _runs(mask)
    if not runs:
        return "empty mask"
    if len(runs) > 1 and not l3.sparse_masks:
        return f"{mask:x} is not contiguous"
    if runs[0][1] < l3.min_cbm_bits:
        return f"{mask:x} has fewer than {l3.min_cbm_bits} consecutive bits"
    return None


def kernel_problems(node: NodeInventory, layout: Layout, foreign: Sequence[ResctrlGroup] = ()) -> list[str]:
    """Would the kernel hold this tree: valid masks on every domain, MB values in range, no more groups than
    CLOSIDs (root included), each CPU in exactly one group."""
    assert node.l3 is not None
    l3 = node.l3
    problems = []
    trees = [
        ("", layout.root_schemata, layout.root_cpus),
        *((gr.name, gr.schemata, gr.cpus) for gr in layout.groups),
    ]
    if len(trees) + len(foreign) > node.num_closids:
        problems.append(f"{len(trees) + len(foreign)} groups exceed {node.num_closids} CLOSIDs")
    for name, schemata, _ in trees:
        for res in cache_resources(l3):
            values = schemata.get(res, {})
            if set(values) != set(node.caches):
                problems.append(f"{name!r} {res} domains {sorted(values)} != {sorted(node.caches)}")
            for d, text in values.items():
                problem = cbm_problem(int(text, 16), l3)
                if problem:
                    problems.append(f"{name!r} {res}:{d} {problem}")
        if name and node.mba is not None:
            for d, text in schemata.get("MB", {}).items():
                value, mba = int(text), node.mba
                ok = 0 <= value < 2**32 if mba.mbps else mba.min_bandwidth <= value <= 100 and value % 10 == 0
                if not ok:
                    problems.append(f"{name!r} MB:{d}={value} out of range")
    owners: dict[int, list[str]] = {}
    for name, _, cpus in [*trees, *((f.name, f.schemata, f.cpus) for f in foreign)]:
        for cpu in cpus:
            owners.setdefault(cpu, []).append(name)
    for cpu in sorted(node.cpus):
        if len(owners.get(cpu, [])) != 1:
            problems.append(f"CPU {cpu} is in groups {owners.get(cpu, [])}")
    return problems


def layout_problems(
    node: NodeInventory, layout: Layout, workloads: Sequence[Workload], foreign: Sequence[ResctrlGroup] = ()
) -> list[str]:
    """The promises of the layout (module docstring of resctrl_layout)."""
    assert node.l3 is not None and layout.regions is not None
    l3, regions, res = node.l3, layout.regions, cache_resources(node.l3)[-1]
    problems = []
    keys = {w.key for w in workloads}
    accepted = {w.key for w in layout.accepted}
    if accepted | set(layout.rejected) != keys or accepted & set(layout.rejected):
        problems.append(f"accepted {sorted(accepted)} + rejected {sorted(layout.rejected)} != {sorted(keys)}")
    by_key = {w.key: w for w in layout.accepted}
    for w in layout.accepted:
        gr = layout.group_for(w.key)
        if gr is None or gr.pool is not w.pool or not w.core_ids <= gr.cpus:
            problems.append(f"{w.key} is not in a {w.pool} group holding its CPUs")
    for gr in layout.groups:
        if gr.cpus != frozenset().union(*(by_key[k].core_ids for k in gr.workloads)):
            problems.append(f"{gr.name} CPUs {sorted(gr.cpus)} are not those of {gr.workloads}")
    for d in node.caches:
        root = int(layout.root_schemata[res][d], 16)
        if regions.os & ~root:
            problems.append(f"root {root:x} on {d} lacks the OS ways {regions.os:x}")
        running = {gr.name: int(gr.schemata[res][d], 16) for gr in layout.groups if gr.cpus & node.caches[d]}
        claims = [int(f.schemata[r][d], 16) for f in foreign for r in (res,) if r in f.schemata]
        claims = [m for m in claims if m != l3.cbm_mask]
        for gr in layout.groups:
            mask = int(gr.schemata[res][d], 16)
            if gr.name not in running:
                if gr.pool is not Pool.SHARED and mask != regions.os:
                    problems.append(f"{gr.name} on idle domain {d} has {mask:x}, not the OS ways")
                continue
            if gr.pool is Pool.SHARED:
                if mask & ~regions.shared:
                    problems.append(f"shared group mask {mask:x} outside the shared pool {regions.shared:x}")
                continue
            w = by_key[gr.workloads[0]]
            pool_mask = regions.guaranteed if gr.pool is Pool.GUARANTEED else regions.besteffort
            low, high = (
                (w.cache_max, w.cache_max) if gr.pool is Pool.GUARANTEED else (w.cache_min, w.cache_max)
            )
            assert low is not None and high is not None
            if not low <= mask.bit_count() <= high or mask & ~pool_mask:
                problems.append(
                    f"{gr.name} on {d} has {mask:x}: want {low}..{high} ways inside {pool_mask:x}"
                )
            others = [m for n, m in running.items() if n != gr.name] + [root] + claims
            if any(mask & m for m in others):
                problems.append(f"{gr.name} on {d} ({mask:x}) overlaps another group or the root ({others})")
            if gr.pool is Pool.GUARANTEED and mask & l3.shareable_bits:
                problems.append(f"{gr.name} on {d} ({mask:x}) uses ways shared with I/O")
    return problems


# -- property tests ------------------------------------------------------------------------------------------

NAMES = [("default", n) for n in "abcdefg"] + [("prod", "a"), ("prod", "b")]


@st.composite
def nodes(draw: st.DrawFn, cdp: bool = False) -> NodeInventory:
    ways = draw(st.integers(4, 16))
    return make_node(
        ways=ways,
        min_bits=draw(st.sampled_from([1, 1, 2])),
        sparse=draw(st.booleans()),
        cdp=cdp,
        closids=draw(st.integers(2, 16)),
        domains=draw(st.integers(1, 3)),
        per_domain=draw(st.integers(1, 6)),
        mba=draw(st.sampled_from([None, "percent", "mbps"])),
        shareable=draw(st.sampled_from([0, 0b11 << (ways - 2)])),
    )


@st.composite
def workloads(draw: st.DrawFn, node: NodeInventory) -> list[Workload]:
    cpus = sorted(node.cpus)
    picked = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=7))
    result = []
    for namespace, name in picked:
        choices = [*cpus, 99] if draw(st.integers(0, 5)) == 0 else cpus
        size = draw(st.sampled_from([1, 1, 1, 2, 3]))
        cores = draw(st.sets(st.sampled_from(choices), min_size=1, max_size=size))
        kind = draw(
            st.sampled_from(["none", "shared", "guaranteed", "guaranteed", "besteffort", "bad", "policy"])
        )
        fields: dict[str, Any] = {}
        if kind == "shared":
            fields.update(cache_max=0, cache_min=0)
        elif kind == "guaranteed":
            ways = draw(st.integers(1, 4))
            fields.update(cache_max=ways, cache_min=ways)
            if draw(st.booleans()):
                fields.update(
                    draw(st.sampled_from([{"mba_percentage": p} for p in (5, 35, 100)] + [{"mba_mbps": 800}]))
                )
        elif kind == "besteffort":
            least = draw(st.integers(1, 3))
            fields.update(cache_max=least + draw(st.integers(1, 4)), cache_min=least)
        elif kind == "bad":
            fields.update(cache_max=3, cache_min=0)
        elif kind == "policy":
            fields.update(policy=draw(st.sampled_from(["gold", "silver", "bronze", "platinum"])))
        result.append(Workload(namespace, name, core_ids=frozenset(cores), **fields))
    return result


@st.composite
def foreign_groups(draw: st.DrawFn, node: NodeInventory) -> list[sim.Group]:
    """Up to two groups of another tool, with valid masks (sometimes the full mask) and some CPUs."""
    assert node.l3 is not None
    count = draw(st.integers(0, min(2, node.num_closids - 1)))
    ways = node.l3.cbm_mask.bit_length()
    free = sorted(node.cpus)
    groups = []
    for i in range(count):
        masks = {}
        for d in node.caches:
            length = draw(st.integers(max(1, node.l3.min_cbm_bits), ways))
            low = draw(st.integers(0, ways - length))
            masks[d] = node.l3.cbm_mask if draw(st.booleans()) else ((1 << length) - 1) << low
        cpus = frozenset(draw(st.sets(st.sampled_from(free), max_size=1))) if free else frozenset()
        free = [c for c in free if c not in cpus]
        groups.append(sim.Group(f"other{i}", {"L3": masks}, cpus))
    return groups


Scenario = tuple[NodeInventory, list[sim.Group], list[list[Workload]]]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """A node, other tools' groups, and 2-5 rounds of workloads: each keeps some of the last and adds more,
    so pools fill, fragment and get compacted."""
    node = draw(nodes())
    rounds = [draw(workloads(node))]
    for _ in range(draw(st.integers(1, 4))):
        kept = [w for w in rounds[-1] if draw(st.booleans())]
        added = [w for w in draw(workloads(node)) if w.key not in {k.key for k in kept}]
        rounds.append(kept + added)
    return node, draw(foreign_groups(node)), rounds


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
# Found by Hypothesis: with 2 CLOSIDs the root group holds few ways next to a best-effort group; when that
# group turns gold, the ways the root keeps make no valid mask, and the root released nothing before the group
# took its guaranteed ways (the root now parks on the OS ways, as other groups do).
@example(
    (
        make_node(ways=15, min_bits=2, sparse=True, closids=2, domains=1, per_domain=2, mba=None),
        [],
        [
            [wl("e", [0], 4, 2)],
            [wl("a", [0]), wl("b", [0]), wl("c", [0]), wl("e", [0], policy="gold")],
        ],
    )
)
def test_plans_obey_the_kernel_and_converge(scenario: Scenario) -> None:
    node, foreign, rounds = scenario
    state = sim_state(node, foreign)
    seen = observed(state, node)
    theirs = [gr for gr in seen.groups if not is_owned(gr.name)]
    for wanted in rounds:
        layout = plan_layout(node, wanted, seen)
        assert kernel_problems(node, layout, theirs) == []
        assert layout_problems(node, layout, wanted, theirs) == []
        state = apply_all(state, diff(seen, layout), node, guaranteed_groups(layout))
        seen = observed(state, node)
        # The kernel now holds exactly the plan, and other tools' groups are as they were.
        again = plan_layout(node, wanted, seen)
        assert summary(again) == summary(layout)
        assert diff(seen, again) == []
        for f in foreign:
            assert state.groups[f.name].cpus == f.cpus
            assert dict(state.groups[f.name].schemata["L3"]) == dict(f.schemata["L3"])


@settings(max_examples=200, deadline=None)
@given(
    ways=st.integers(10, 20),
    sparse=st.booleans(),
    churn=st.lists(
        st.lists(st.tuples(st.integers(0, 7), st.integers(1, 4)), max_size=6), min_size=2, max_size=8
    ),
)
def test_guaranteed_churn_compacts_safely(
    ways: int, sparse: bool, churn: list[list[tuple[int, int]]]
) -> None:
    """Guaranteed workloads come and go on one domain (one CPU each, so only ways limit them): the pool
    fragments, newcomers force compaction, and no step ever exposes a guaranteed way."""
    node = make_node(ways=ways, sparse=sparse, domains=1, per_domain=8, mba=None)
    state = sim_state(node)
    for round_ in churn:
        wanted = [wl(f"w{cpu}-{size}", {cpu}, size) for cpu, size in dict(round_).items()]
        seen = observed(state, node)
        layout = plan_layout(node, wanted, seen)
        assert layout_problems(node, layout, wanted) == []
        for key, err in layout.rejected.items():
            assert err.reason is RejectReason.CAPACITY, (key, err.message)
        state = apply_all(state, diff(seen, layout), node, guaranteed_groups(layout))
        assert diff(observed(state, node), plan_layout(node, wanted, observed(state, node))) == []


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_cdp_plans_set_code_and_data_alike(data: st.DataObject) -> None:
    node = data.draw(nodes(cdp=True))
    wanted = data.draw(workloads(node))
    layout = plan_layout(node, wanted, None)
    assert kernel_problems(node, layout) == []
    assert layout_problems(node, layout, wanted) == []
    for schemata in [layout.root_schemata, *(gr.schemata for gr in layout.groups)]:
        assert "L3" not in schemata
        assert schemata["L3CODE"] == schemata["L3DATA"]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_outcome_does_not_depend_on_what_else_is_rejected(data: st.DataObject) -> None:
    """Workloads that are rejected as invalid leave the plan of the others unchanged."""
    node = data.draw(nodes())
    wanted = data.draw(workloads(node))
    valid = []
    for w in wanted:
        try:
            resolve_workload(w, node)
        except WorkloadRejected:
            continue
        valid.append(w)
    assert summary(plan_layout(node, valid))[:4] == summary(plan_layout(node, wanted))[:4]


# -- against a simulated host tree ---------------------------------------------------------------------------


def _execute(resctrl: sim.SimResctrl, op: Operation) -> None:
    if isinstance(op, Mkdir):
        resctrl.mkdir(op.group)
    elif isinstance(op, Rmdir):
        resctrl.rmdir(op.group)
    elif isinstance(op, WriteSchemata):
        resctrl.write(f"{op.group}/schemata" if op.group else "schemata", op.text)
    else:
        resctrl.write(f"{op.group}/cpus_list", op.text)


def _observe(root: Path) -> tuple[NodeInventory, ResctrlState]:
    fs = HostFS(root)
    state = read_resctrl(fs)
    cpus, caches = read_online_cpus(fs), read_l3_caches(fs)
    assert not isinstance(state, Unsupported)
    assert not isinstance(cpus, Unsupported) and not isinstance(caches, Unsupported)
    node = NodeInventory.from_observed(cpus, caches, state, policies=PolicyBook().for_platform(None))
    return node, state


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ways=st.integers(6, 15),
    min_bits=st.sampled_from([1, 2]),
    sparse=st.sampled_from([None, 0, 1]),
    closids=st.integers(3, 16),
    mba=st.sampled_from(["none", "percent", "mbps"]),
    data=st.data(),
)
def test_simulated_kernel_accepts_every_plan(
    *, ways: int, min_bits: int, sparse: int | None, closids: int, mba: str, data: st.DataObject
) -> None:
    spec = NodeSpec(
        sockets=2,
        cores_per_socket=2,
        threads_per_core=1,
        numa_nodes=2,
        l3_ways=ways,
        cbm_mask=f"{(1 << ways) - 1:x}",
        min_cbm_bits=min_bits,
        sparse_masks=sparse,
        num_closids=closids,
        mba=mba != "none",
        mba_mbps=mba == "mbps",
        rapl_zones=(),
        cpufreq=False,
        reserved_cpus="",
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "host"
        write_host_tree(spec, root)
        resctrl = sim.SimResctrl(root)
        resctrl.mkdir("other")  # another tool's group, with a restricted mask and one CPU
        resctrl.write("other/schemata", f"L3:0={(1 << min_bits) - 1:x}\n")
        resctrl.write("other/cpus_list", "3\n")
        node, state = _observe(root)
        for _ in range(2):
            wanted = data.draw(workloads(node))
            layout = plan_layout(node, wanted, state)
            for op in diff(state, layout):
                _execute(resctrl, op)
            assert sim.check_resctrl_tree(root) == []
            node, state = _observe(root)
            assert summary(plan_layout(node, wanted, state)) == summary(layout)
            assert diff(state, layout) == []
            assert state.groups[0].name == "other" and state.groups[0].cpus == {3}


# -- pools ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ways", "min_bits", "sizes"),
    [
        (20, 1, (1, 10, 7, 2)),
        (11, 1, (1, 5, 4, 1)),
        (15, 1, (1, 8, 5, 1)),
        (12, 2, (2, 4, 4, 2)),
        (4, 1, (1, 2, 1, 0)),
    ],
)
def test_default_pools(ways: int, min_bits: int, sizes: tuple[int, int, int, int]) -> None:
    got = pool_sizes(PoolConfig(), ways, min_bits)
    assert (got.os, got.guaranteed, got.besteffort, got.shared) == sizes
    assert sum(sizes) == ways


def test_configured_pools_leave_the_rest_to_the_os() -> None:
    got = pool_sizes(PoolConfig(guaranteed=4, besteffort=2, shared=1), 11, 1)
    assert (got.os, got.guaranteed, got.besteffort, got.shared) == (4, 4, 2, 1)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            PoolConfig(guaranteed=8, besteffort=3),
            "leave the OS 0 of the cache's 11 ways; it needs at least 1",
        ),
        (
            PoolConfig(besteffort=1),
            "the besteffort pool has 1 ways; a pool needs 0 or at least min_cbm_bits=2",
        ),
        (PoolConfig(shared=-1), "the shared pool has -1 ways"),
    ],
)
def test_impossible_pools_are_config_errors(config: PoolConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        pool_sizes(config, 11, 2 if config.besteffort == 1 else 1)


def test_inventory_from_observed_readers() -> None:
    l3 = CacheInfo(0x7FF, 1, 16, 0, False, False)
    state = ResctrlState(
        frozenset(), l3, Unsupported("no MB"), ResctrlGroup("", {}, frozenset(), "shareable")
    )
    node = NodeInventory.from_observed(frozenset({0, 1}), [L3Cache(0, frozenset({0, 1}), 11, 1)], state)
    assert (node.l3, node.mba, node.caches, node.num_closids, node.platform) == (
        l3,
        None,
        {0: frozenset({0, 1})},
        16,
        "default",
    )
    bare = NodeInventory.from_observed(frozenset({0}), [], Unsupported("not mounted"))
    assert (bare.l3, bare.num_closids) == (None, 0)


# -- placement -----------------------------------------------------------------------------------------------


def l3(layout: Layout, group: str = "") -> dict[int, int]:
    schemata = layout.root_schemata if not group else layout.group(group).schemata  # type: ignore[union-attr]
    return {d: int(v, 16) for d, v in schemata["L3"].items()}


def test_guaranteed_ways_come_from_the_top_of_the_pool_and_the_root_shrinks() -> None:
    node = make_node()
    layout = plan_layout(node, [wl("a", {1}, 2)])
    a = group_name("default", "a")
    assert l3(layout, a) == {0: 0b110000, 1: 0b1}  # bits 4-5 on its domain, the OS way elsewhere
    assert l3(layout) == {0: 0b1111, 1: 0x7FF}  # the root keeps everything else that is contiguous
    assert layout.free_guaranteed == {0: 3, 1: 5}
    layout = plan_layout(node, [wl("a", {1}, 2), wl("b", {2}, 2)])
    assert l3(layout, group_name("default", "b"))[0] == 0b1100
    assert l3(layout)[0] == 0b11


def test_a_plan_keeps_existing_guaranteed_ways_and_reuses_freed_ones() -> None:
    node = make_node()
    state = sim_state(node)
    first = plan_layout(node, [wl("a", {1}, 2), wl("b", {2}, 2)])
    state = apply_all(state, diff(observed(state, node), first), node, guaranteed_groups(first))
    # a leaves: b stays where it is, and the root cannot grow past it (masks must be contiguous)
    second = plan_layout(node, [wl("b", {2}, 2), wl("c", {3}, 1)], observed(state, node))
    assert l3(second, group_name("default", "b"))[0] == 0b1100
    assert l3(second, group_name("default", "c"))[0] == 0b100000  # the highest free way
    assert l3(second)[0] == 0b11


def test_fragmented_pool_is_compacted_upwards_in_a_safe_order() -> None:
    node = make_node()
    state = sim_state(node)
    first = plan_layout(node, [wl("a", {1}, 2), wl("b", {2}, 2)])
    state = apply_all(state, diff(observed(state, node), first), node, guaranteed_groups(first))
    # a leaves, freeing bits 4-5; bits 1, 4, 5 are free but c needs 3 contiguous: b moves up to 4-5.
    seen = observed(state, node)
    second = plan_layout(node, [wl("b", {2}, 2), wl("c", {3}, 3)], seen)
    assert not second.rejected
    assert l3(second, group_name("default", "b"))[0] == 0b110000
    assert l3(second, group_name("default", "c"))[0] == 0b1110
    ops = diff(seen, second)
    park = ops.index(WriteSchemata(group_name("default", "b"), {"L3": {0: "1"}}))  # old and new are disjoint
    b_move = ops.index(WriteSchemata(group_name("default", "b"), {"L3": {0: "30"}}))
    assert park < b_move
    c_write = next(i for i, op in enumerate(ops) if isinstance(op, WriteSchemata) and op.group.endswith(".c"))
    assert b_move < c_write  # b leaves bits 2-3 before c takes them
    apply_all(state, ops, node, guaranteed_groups(first, second))


def test_groups_trading_places_never_share_a_way() -> None:
    """A resize makes compaction swap two groups; each parks on the OS ways before the other moves in."""
    node = make_node(ways=10, domains=1, per_domain=2, mba=None)  # guaranteed pool: bits 1-5
    state = sim_state(node)
    first = plan_layout(node, [wl("a", {0}, 1), wl("g", {1}, 1)])
    state = apply_all(state, diff(observed(state, node), first), node, guaranteed_groups(first))
    assert (l3(first, "rmd-default.a")[0], l3(first, "rmd-default.g")[0]) == (0b100000, 0b10000)
    second = plan_layout(node, [wl("g", {1}, 1), wl("a", {0}, 4)], observed(state, node))
    assert (l3(second, "rmd-default.a")[0], l3(second, "rmd-default.g")[0]) == (0b11110, 0b100000)
    ops = diff(observed(state, node), second)
    assert WriteSchemata("rmd-default.g", {"L3": {0: "1"}}) in ops
    apply_all(state, ops, node, guaranteed_groups(second))


def test_guaranteed_capacity_rejection_names_the_numbers() -> None:
    node = make_node()
    layout = plan_layout(node, [wl("a", {1}, 3), wl("b", {2}, 3)])
    err = layout.rejected["default/b"]
    assert (err.reason, err.workload) == (RejectReason.CAPACITY, "default/b")
    assert err.message == "not enough guaranteed cache on cache id 0: 3 ways requested, 2 free"
    # b fits on the other domain: capacity is per cache id
    assert not plan_layout(node, [wl("a", {1}, 3), wl("b", {5}, 3)]).rejected


def test_other_tools_ways_are_avoided_and_named_in_rejections() -> None:
    node = make_node()
    foreign = [sim.Group("pqos", {"L3": {0: 0b1100, 1: 0x7FF}}, frozenset({7}))]
    seen = observed(sim_state(node, foreign), node)
    layout = plan_layout(node, [wl("a", {1}, 2), wl("b", {5}, 5)], seen)
    assert l3(layout, group_name("default", "a"))[0] == 0b110000  # not 0b1100
    assert l3(layout, group_name("default", "b"))[1] == 0b111110  # the full mask restricts nothing
    err = plan_layout(node, [wl("a", {1}, 2), wl("c", {2}, 2)], seen).rejected["default/c"]
    assert err.message == (
        "not enough guaranteed cache on cache id 0: 2 ways requested, 1 free (2 of the pool's 5 ways are "
        "held by other tools' groups or shared with I/O devices)"
    )
    split = observed(sim_state(node, [sim.Group("pqos", {"L3": {0: 0b1000}}, frozenset())]), node)
    err = plan_layout(node, [wl("c", {2}, 3)], split).rejected["default/c"]
    assert err.message.startswith(
        "not enough guaranteed cache on cache id 0: 3 ways requested, 4 free but not 3 "
    )
    taken = plan_layout(node, [wl("d", {6, 7}, 1)], seen).rejected["default/d"]
    assert (taken.reason, taken.message) == (
        RejectReason.CONFLICT,
        "CPU 7 is in resctrl group 'pqos', which another tool manages",
    )


def test_cpu_conflicts_name_the_holder_only_within_its_namespace() -> None:
    node = make_node()
    team_b = dataclasses.replace(wl("b", {2, 3}, 1), namespace="team-b")
    layout = plan_layout(node, [wl("overlap-a", {1, 2}, 2), team_b, wl("c", {2})])
    other = layout.rejected["team-b/b"]
    assert (other.reason, other.workload, other.detail) == (
        RejectReason.CONFLICT,
        "team-b/b",
        "CPU 2 is already assigned to workload default/overlap-a",
    )
    assert other.message == (
        "CPU 2 is already assigned to a workload in another namespace (an administrator finds it in this "
        "node's RmdNodeState)"
    )
    same = layout.rejected["default/c"]
    assert same.message == same.detail == "CPU 2 is already assigned to workload default/overlap-a"


def test_ownership_is_the_callers_predicate() -> None:
    """A group named like ours that the caller does not own is another tool's: its ways, CPUs and CLOSID
    are respected; the default predicate (the name prefix) would have taken it for ours."""
    node = make_node(closids=3)
    lookalike = [sim.Group("rmd-foo", {"L3": {0: 0b1100, 1: 0x7FF}}, frozenset({7}))]
    seen = observed(sim_state(node, lookalike), node)
    wanted = [wl("a", {1}, 2), wl("d", {6, 7}, 1)]
    by_prefix = plan_layout(node, wanted, seen)
    assert not by_prefix.rejected
    layout = plan_layout(node, wanted, seen, owned=frozenset().__contains__)
    assert l3(layout, group_name("default", "a"))[0] == 0b110000  # off rmd-foo's ways
    taken = layout.rejected["default/d"]
    assert (taken.reason, taken.message) == (
        RejectReason.CONFLICT,
        "CPU 7 is in resctrl group 'rmd-foo', which another tool manages",
    )
    full = plan_layout(node, [wl("a", {1}, 2), wl("b", {2}, 1)], seen, owned=frozenset().__contains__)
    assert set(full.rejected) == {"default/b"} and "no free CLOS" in full.rejected["default/b"].message
    planned = frozenset(g.name for g in layout.groups)
    assert all(op.group != "rmd-foo" for op in diff(seen, layout, owned=planned.__contains__))


def test_guaranteed_ways_avoid_those_shared_with_io() -> None:
    node = make_node(shareable=0b110000)  # e.g. DDIO on ways 4-5
    layout = plan_layout(node, [wl("a", {1}, 2)])
    assert l3(layout, group_name("default", "a"))[0] == 0b1100


def test_closid_limit_counts_the_root_and_other_tools_groups() -> None:
    node = make_node(closids=4)
    seen = observed(sim_state(node, [sim.Group("collectd", {"L3": {0: 0x7FF, 1: 0x7FF}}, frozenset())]), node)
    layout = plan_layout(node, [wl("a", {1}, 1), wl("b", {2}, 1), wl("c", {3}, 1)], seen)
    assert set(layout.rejected) == {"default/c"}
    err = layout.rejected["default/c"]
    assert err.reason is RejectReason.CAPACITY
    assert err.message == (
        "no free CLOS for workload default/c: this node has 4 CLOSIDs (num_closids), used by the root group, "
        "1 by other tools' groups (collectd) and 2 rmd groups"
    )


def test_shared_workloads_share_one_group_and_one_closid() -> None:
    node = make_node(closids=3)
    wanted = [wl("s1", {0}, 0, 0), wl("s2", {4}, 0, 0), wl("p", {5}, pstate_ratio=2.0), wl("g", {1}, 2)]
    layout = plan_layout(node, wanted)
    assert not layout.rejected
    shared = layout.group(SHARED_GROUP)
    assert shared is not None
    assert (shared.workloads, shared.cpus) == (
        ("default/p", "default/s1", "default/s2"),
        frozenset({0, 4, 5}),
    )
    assert l3(layout, SHARED_GROUP) == {0: 0x400, 1: 0x400}
    assert layout.group_for("default/s2") is shared


def test_best_effort_groups_split_the_pool_fairly() -> None:
    node = make_node()  # best-effort pool: bits 6-9
    a, b, c = (wl(n, {i}, 3, 1) for i, n in enumerate("abc", start=1))
    assert l3(plan_layout(node, [a]), group_name("default", "a"))[0] == 0b1110000000
    two = plan_layout(node, [a, b])
    assert [l3(two, group_name("default", n))[0] for n in "ab"] == [0b1100000000, 0b0011000000]
    three = plan_layout(node, [a, b, c])
    assert [l3(three, group_name("default", n))[0].bit_count() for n in "abc"] == [2, 1, 1]
    err = plan_layout(node, [a, b, c, wl("d", {0}, 3, 2)]).rejected["default/d"]
    assert err.message == (
        "not enough best-effort cache on cache id 0: 2 ways requested as minimum, 1 free "
        "(pool of 4 ways, 3 held as the minimum of 3 other workloads)"
    )


def test_best_effort_order_follows_existing_groups_not_names() -> None:
    node = make_node()
    state = sim_state(node)
    first = plan_layout(node, [wl("m", {1}, 2, 1)])
    state = apply_all(state, diff(observed(state, node), first), node, set())
    second = plan_layout(node, [wl("a", {2}, 2, 1), wl("m", {1}, 2, 1)], observed(state, node))
    assert l3(second, group_name("default", "m"))[0] == 0b1100000000  # m keeps the top
    assert l3(second, group_name("default", "a"))[0] == 0b0011000000


def test_root_takes_every_free_way_when_sparse_masks_are_allowed() -> None:
    node = make_node(sparse=True)
    layout = plan_layout(node, [wl("a", {1}, 2), wl("b", {2}, 2, 1)])
    assert l3(layout, group_name("default", "a"))[0] == 0b110000
    assert l3(layout)[0] == 0x7FF & ~0b110000 & ~l3(layout, group_name("default", "b"))[0]


def test_min_cbm_bits_is_honoured() -> None:
    node = make_node(min_bits=2)  # pools: OS 2, guaranteed 4, best effort 3, shared 2
    layout = plan_layout(node, [wl("a", {1}, 2), wl("b", {2}, 3, 2), wl("c", {3}, 0, 0)])
    assert not layout.rejected
    assert l3(layout) == {0: 0b1111, 1: 0x7FF & ~l3(layout, SHARED_GROUP)[1]}
    assert all(v.bit_count() >= 2 for gr in layout.groups for v in l3(layout, gr.name).values())


def test_mba_values_per_domain() -> None:
    node = make_node()
    layout = plan_layout(node, [wl("a", {1}, 2, mba_percentage=35), wl("b", {2}, 3, 1)])
    assert layout.group(group_name("default", "a")).schemata["MB"] == {0: "40", 1: "100"}  # type: ignore[union-attr]
    assert layout.group(group_name("default", "b")).schemata["MB"] == {0: "100", 1: "100"}  # type: ignore[union-attr]
    assert "MB" not in layout.root_schemata  # the root's bandwidth is not ours to set
    mbps = plan_layout(make_node(mba="mbps"), [wl("a", {5}, 2, mba_mbps=3000)])
    assert mbps.group(group_name("default", "a")).schemata["MB"] == {0: str(2**32 - 1), 1: "3000"}  # type: ignore[union-attr]
    assert "MB" not in plan_layout(make_node(mba=None), [wl("a", {1}, 2)]).groups[0].schemata


def test_mba_rounding_reaches_the_applied_workload() -> None:
    """#13 item 5: what the agent reports is the value the plan writes (one rounding rule), with whether it
    was rounded and why; MBps values are taken as given, and a workload without MBA reports none."""
    node = make_node()  # info/MB: min_bandwidth 10, bandwidth_gran 10
    workloads = [wl("a", {1}, 2, mba_percentage=15), wl("b", {5}, 2, mba_percentage=40), wl("c", {2}, 1)]
    layout = plan_layout(node, workloads)
    reported = {}
    for w in layout.accepted:
        group = layout.group_for(w.key)
        assert group is not None
        _, held = workload_allocation(group, node, w)
        reported[w.name] = (held, mba_applied(w, held, layout.mba))
    held, a = reported["a"]
    assert held == {0: 20} and a is not None
    assert (a.requested, a.value, a.rounded) == (15, 20, True)
    assert a.detail == "MBA 15% rounded up to 20%: the node's MBA step (bandwidth_gran) is 10%"
    held, b = reported["b"]
    assert held == {1: 40} and b is not None
    assert (b.requested, b.value, b.rounded, b.detail) == (40, 40, False, "")
    assert reported["c"] == ({}, None)

    mbps_node = make_node(mba="mbps")
    mbps = plan_layout(mbps_node, [wl("d", {5}, 2, mba_mbps=3005)])
    group = mbps.group_for("default/d")
    assert group is not None
    _, held = workload_allocation(group, mbps_node, mbps.accepted[0])
    d = mba_applied(mbps.accepted[0], held, mbps.mba)
    assert held == {1: 3005} and d is not None and (d.value, d.rounded, d.detail) == (3005, False, "")


def test_node_without_cat_gets_no_groups_and_stale_ones_go() -> None:
    node = dataclasses.replace(make_node(), l3=None, mba=None)
    layout = plan_layout(node, [wl("p", {1}, pstate_ratio=2.0), wl("g", {2}, 2)])
    assert [w.key for w in layout.accepted] == ["default/p"]
    assert layout.rejected["default/g"].reason is RejectReason.INVALID
    assert (layout.groups, layout.root_schemata) == ((), {})
    stale = ResctrlState(
        frozenset(),
        Unsupported("no L3"),
        Unsupported("no MB"),
        ResctrlGroup("", {}, frozenset(range(8)), "shareable"),
        (
            ResctrlGroup("rmd-default.old", {}, frozenset(), "shareable"),
            ResctrlGroup("x", {}, frozenset(), ""),
        ),
    )
    assert diff(stale, layout) == [Rmdir("rmd-default.old")]


def test_workloads_with_groups_go_first_so_newcomers_never_displace_them() -> None:
    node = make_node()
    state = sim_state(node)
    first = plan_layout(node, [wl("z", {1}, 4)])
    state = apply_all(state, diff(observed(state, node), first), node, guaranteed_groups(first))
    second = plan_layout(node, [wl("a", {2}, 4), wl("z", {1}, 4)], observed(state, node))
    assert [w.key for w in second.accepted] == ["default/z"]
    assert second.rejected["default/a"].message.startswith("not enough guaranteed cache on cache id 0")


def test_cache_ids_with_gaps() -> None:
    node = dataclasses.replace(make_node(), caches={0: frozenset(range(4)), 2: frozenset(range(4, 8))})
    state = sim_state(node)
    layout = plan_layout(
        node, [wl("a", {5}, 2, mba_percentage=50), wl("b", {1}, 0, 0)], observed(state, node)
    )
    a = layout.group(group_name("default", "a"))
    assert a is not None and set(a.schemata["L3"]) == set(a.schemata["MB"]) == {0, 2}
    assert (a.schemata["L3"][2], a.schemata["MB"]) == ("30", {0: "100", 2: "50"})
    state = apply_all(state, diff(observed(state, node), layout), node, guaranteed_groups(layout))
    again = plan_layout(node, [wl("a", {5}, 2, mba_percentage=50), wl("b", {1}, 0, 0)], observed(state, node))
    assert diff(observed(state, node), again) == []


def test_duplicate_workloads_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="repeated: default/a"):
        plan_layout(make_node(), [wl("a", {1}), wl("a", {2})])


# -- names ---------------------------------------------------------------------------------------------------


def test_group_names_trace_back_and_never_collide() -> None:
    assert group_name("default", "web") == "rmd-default.web"
    assert group_name("a-b", "c") != group_name("a", "b-c")
    long = group_name("team-" + "x" * 40, "cache-heavy-" + "y" * 40)
    assert len(long) == MAX_GROUP_NAME and long.startswith("rmd-team-xxx")
    assert long == group_name("team-" + "x" * 40, "cache-heavy-" + "y" * 40)  # stable
    assert long != group_name("team-" + "x" * 40, "cache-heavy-" + "y" * 39 + "z")
    odd = group_name("default", "a/b c")
    assert "/" not in odd and " " not in odd and odd != group_name("default", "a_b_c")
    assert all(is_owned(n) for n in (long, odd, SHARED_GROUP)) and not is_owned("COS1")


# -- diff ----------------------------------------------------------------------------------------------------


def test_diff_from_a_fresh_mount_shrinks_the_root_first() -> None:
    node = make_node(mba=None)
    layout = plan_layout(node, [wl("a", {1, 2}, 2)])
    a = group_name("default", "a")
    for current in (None, observed(sim_state(node), node)):
        assert diff(current, layout) == [
            WriteSchemata("", {"L3": {0: "f", 1: "7ff"}} if current is None else {"L3": {0: "f"}}),
            Mkdir(a),
            WriteSchemata(a, {"L3": {0: "30", 1: "1"}}),
            WriteCpus(a, frozenset({1, 2})),
        ]


def test_diff_moves_cpus_with_the_fewest_writes() -> None:
    node = make_node(mba=None)
    state = sim_state(node)
    first = plan_layout(node, [wl("a", {1, 2}, 1), wl("b", {3}, 1)])
    state = apply_all(state, diff(observed(state, node), first), node, guaranteed_groups(first))
    # CPU 2 moves from a to b: writing b's list takes it from a, so a needs no write of its own.
    second = plan_layout(node, [wl("a", {1}, 1), wl("b", {2, 3}, 1)], observed(state, node))
    ops = diff(observed(state, node), second)
    assert ops == [WriteCpus(group_name("default", "b"), frozenset({2, 3}))]
    # CPU 1 leaves a for the root: a's list must be written.
    third = plan_layout(node, [wl("a", {2}, 1), wl("b", {3}, 1)], observed(state, node))
    assert [str(op) for op in diff(observed(state, node), third) if isinstance(op, WriteCpus)] == [
        "write rmd-default.a/cpus_list '2'"
    ]


def test_diff_never_touches_other_tools_and_rejects_foreign_plans() -> None:
    node = make_node(mba=None)
    foreign = [sim.Group("COS1", {"L3": {0: 0x7FF, 1: 0x7FF}}, frozenset({6}))]
    seen = observed(sim_state(node, foreign), node)
    assert diff(seen, plan_layout(node, [], seen)) == []
    layout = plan_layout(node, [wl("a", {1}, 1)], seen)
    bogus = dataclasses.replace(layout, groups=(dataclasses.replace(layout.groups[0], name="COS2"),))
    with pytest.raises(ValueError, match="'COS2', which is not ours"):
        diff(seen, bogus)
    assert diff(seen, layout, owned=lambda n: n.startswith("rmd-default.")) == diff(seen, layout)


def test_operations_render_what_the_applier_writes() -> None:
    op = WriteSchemata("rmd-default.a", {"L3": {1: "1", 0: "30"}, "MB": {0: "40", 1: "100"}})
    assert op.text == "L3:0=30;1=1\nMB:0=40;1=100\n"
    assert str(op) == "write rmd-default.a/schemata 'L3:0=30;1=1\\nMB:0=40;1=100'"
    assert WriteCpus("g", frozenset({3, 1, 2})).text == "1-3\n"
    assert str(WriteSchemata("", {"L3": {0: "f"}})) == "write ./schemata 'L3:0=f'"
