"""The simulated static CPU manager: allocation invariants (hypothesis) and the upstream rules it follows."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rmd_sim.cpumanager import (
    Cpu,
    NotEnoughCpus,
    Topology,
    allocate,
    free_cpus,
    release,
    shared_pool,
)

Assigned = dict[tuple[str, str], frozenset[int]]


@st.composite
def topologies(draw: st.DrawFn, smt: bool = False) -> Topology:
    sockets = draw(st.integers(1, 2))
    numa_per_socket = draw(st.sampled_from([1, 2]))
    cores = numa_per_socket * draw(st.integers(1, 4))
    threads = 2 if smt else draw(st.integers(1, 2))
    return Topology.uniform(sockets, cores, threads, numa_per_socket)


@st.composite
def node_states(draw: st.DrawFn, whole_cores: bool = False) -> tuple[Topology, frozenset[int], Assigned]:
    """A topology, a reserved set and assignments reached by earlier allocations (as on a real node).

    With whole_cores, the machine has 2 threads per core, the reserved set is made of whole cores and
    earlier requests are multiples of the core size, so the free CPUs are whole cores too.
    """
    topology = draw(topologies(smt=whole_cores))
    cores = list(topology.cores.values())
    if whole_cores:
        reserved = frozenset().union(*draw(st.lists(st.sampled_from(cores), max_size=2)))
    else:
        reserved = frozenset(draw(st.lists(st.sampled_from(sorted(topology.ids)), max_size=3)))
    step = topology.threads_per_core if whole_cores else 1
    assigned: Assigned = {}
    for i, size in enumerate(draw(st.lists(st.integers(1, 4), max_size=6))):
        with contextlib.suppress(NotEnoughCpus):
            assigned[(f"pod{i}", "c")] = allocate(topology, reserved, assigned, size * step)
    return topology, reserved, assigned


@settings(deadline=None)  # the machine is shared with long builds; timing is not under test
@given(node_states(), st.integers(1, 20))
def test_never_hands_out_reserved_or_assigned_cpus(
    state: tuple[Topology, frozenset[int], Assigned], request: int
) -> None:
    topology, reserved, assigned = state
    free = free_cpus(topology, reserved, assigned)
    if request > len(free):
        with pytest.raises(NotEnoughCpus, match=f"requested={request}, available={len(free)}"):
            allocate(topology, reserved, assigned, request)
        return
    cpus = allocate(topology, reserved, assigned, request)
    assert len(cpus) == request
    assert not cpus & reserved
    assert not cpus & frozenset().union(*assigned.values())
    assert cpus <= topology.ids


@settings(deadline=None)
@given(node_states(whole_cores=True), st.data())
def test_takes_whole_cores_when_whole_cores_are_free(
    state: tuple[Topology, frozenset[int], Assigned], data: st.DataObject
) -> None:
    topology, reserved, assigned = state
    free = free_cpus(topology, reserved, assigned)
    assume(len(free) >= 2)
    request = 2 * data.draw(st.integers(1, len(free) // 2), label="cores wanted")
    cpus = allocate(topology, reserved, assigned, request)
    for core in topology.cores.values():
        assert core <= cpus or not core & cpus, f"core {sorted(core)} split by allocation {sorted(cpus)}"


@settings(deadline=None)
@given(node_states(), st.data())
def test_stays_on_one_numa_node_when_one_has_room(
    state: tuple[Topology, frozenset[int], Assigned], data: st.DataObject
) -> None:
    topology, reserved, assigned = state
    free = free_cpus(topology, reserved, assigned)
    roomiest = max(len(free & cpus) for cpus in topology.numa_nodes.values())
    assume(roomiest >= 1)
    request = data.draw(st.integers(1, roomiest), label="request")
    cpus = allocate(topology, reserved, assigned, request)
    assert len({topology.cpu(c).numa for c in cpus}) == 1


@settings(deadline=None)
@given(node_states(), st.integers(1, 6))
def test_release_restores_the_free_and_shared_sets(
    state: tuple[Topology, frozenset[int], Assigned], request: int
) -> None:
    topology, reserved, assigned = state
    free_before = free_cpus(topology, reserved, assigned)
    pool_before = shared_pool(topology, assigned)
    assume(request <= len(free_before))
    after = {**assigned, ("new", "c"): allocate(topology, reserved, assigned, request)}
    assert free_cpus(topology, reserved, after) == free_before - after[("new", "c")]
    restored = release(after, "new")
    assert free_cpus(topology, reserved, restored) == free_before
    assert shared_pool(topology, restored) == pool_before


@settings(deadline=None)
@given(node_states())
def test_shared_pool_keeps_reserved_cpus_and_drops_exclusive_ones(
    state: tuple[Topology, frozenset[int], Assigned],
) -> None:
    topology, reserved, assigned = state
    exclusive = frozenset().union(*assigned.values())
    pool = shared_pool(topology, assigned)
    assert reserved <= pool
    assert pool == topology.ids - exclusive
    assert free_cpus(topology, reserved, assigned) == pool - reserved


def test_release_of_one_container_keeps_the_pod_s_others() -> None:
    assigned = {("a", "x"): frozenset({1}), ("a", "y"): frozenset({2}), ("b", "x"): frozenset({3})}
    assert release(assigned, "a", "x") == {("a", "y"): frozenset({2}), ("b", "x"): frozenset({3})}
    assert release(assigned, "a") == {("b", "x"): frozenset({3})}


# Two sockets x 4 cores x 2 threads, Linux numbering: core (s, c) holds cpus s*4+c and 8+s*4+c.
DUAL = Topology.uniform(sockets=2, cores_per_socket=4, threads=2)


def test_uniform_topology_pairs_siblings_like_linux() -> None:
    assert DUAL.cores[(0, 0)] == {0, 8}
    assert DUAL.cores[(1, 3)] == {7, 15}
    assert DUAL.numa_nodes == {
        0: frozenset({0, 1, 2, 3, 8, 9, 10, 11}),
        1: frozenset({4, 5, 6, 7, 12, 13, 14, 15}),
    }


def test_a_socket_sized_request_takes_a_whole_free_socket() -> None:
    # Socket 0 has a reserved CPU, so only socket 1 is whole; the request is exactly a socket.
    assert allocate(DUAL, frozenset({0}), {}, 8) == DUAL.sockets[1]


def test_odd_request_fills_a_partly_used_core_before_splitting_a_free_one() -> None:
    reserved = frozenset({0, 8})
    first = allocate(DUAL, reserved, {}, 1)  # one thread: its sibling is now the only half-free core
    (sibling,) = next(core for core in DUAL.cores.values() if first <= core) - first
    second = allocate(DUAL, reserved, {("p", "a"): first}, 3)
    assert sibling in second
    whole = second - {sibling}
    assert whole in DUAL.cores.values()


def test_allocations_pack_onto_the_busier_numa_node() -> None:
    # Node 0 already has a pinned core; a small request goes there too instead of opening node 1.
    assigned = {("p", "a"): DUAL.cores[(0, 1)]}
    cpus = allocate(DUAL, frozenset(), assigned, 2)
    assert cpus <= DUAL.numa_nodes[0]


def test_request_too_big_for_one_numa_node_spans_the_fewest() -> None:
    topology = Topology.uniform(sockets=1, cores_per_socket=6, threads=1, numa_per_socket=3)
    cpus = allocate(topology, frozenset(), {}, 3)
    assert {topology.cpu(c).numa for c in cpus} == {0, 1}


def test_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="positive"):
        allocate(DUAL, frozenset(), {}, 0)
    with pytest.raises(ValueError, match="more than once"):
        Topology.of([Cpu(0, 0, 0, 0), Cpu(0, 0, 0, 1)])
    with pytest.raises(NotEnoughCpus, match="requested=16, available=15"):
        allocate(DUAL, frozenset({3}), {}, 16)
