"""The kubelet's static CPU manager policy as a pure function of topology and current assignments.

Only the allocation decisions are modelled; the simulated kubelet (rmd_sim.kubelet) keeps the state.
Rules implemented, after kubernetes `pkg/kubelet/cm/cpumanager/{policy_static.go,cpu_assignment.go}`
and the topology manager's hint selection:

* Reserved CPUs (`reservedSystemCPUs`) and CPUs already assigned exclusively are never handed out.
  The shared pool (`defaultCpuSet`) is every CPU minus the exclusive assignments, so it *includes* the
  reserved CPUs.
* NUMA alignment, as the topology manager's preferred hint would give it: the CPUs come from the fewest
  NUMA nodes whose free CPUs can hold the request (ties: lowest node ids), so one NUMA node whenever one
  is enough.
* Within that set, `takeByTopology` in its default "packed" form: first whole sockets / NUMA nodes (the
  larger unit first) when the request needs at least that many CPUs, then whole physical cores when it
  needs at least a core, then single threads. Candidates are visited fullest-first (fewest free CPUs in
  their socket, NUMA node, core; then lowest id), so allocations pack together and leftover threads
  fill partially used cores.

Not modelled: the `full-pcpus-only`, `distribute-cpus-across-numa` and uncore-cache policy options, and
alignment with the memory and device managers. Which containers get exclusive CPUs (Guaranteed QoS,
integer CPU request) is the caller's decision.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeAlias, TypeVar

from rmd_api.cpuset import format_cpu_list


class NotEnoughCpus(ValueError):
    """The request cannot be satisfied from the CPUs that are neither reserved nor assigned."""


@dataclass(frozen=True, order=True)
class Cpu:
    """One logical CPU. `core` is the sysfs core_id, which is only unique within its socket."""

    id: int
    socket: int
    numa: int
    core: int


@dataclass(frozen=True)
class Topology:
    """The machine's logical CPUs. Build with `Topology.of(cpus)` to get them sorted and checked."""

    cpus: tuple[Cpu, ...]
    _by_id: dict[int, Cpu] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id = {cpu.id: cpu for cpu in self.cpus}
        if len(by_id) != len(self.cpus):
            raise ValueError("topology lists a cpu id more than once")
        object.__setattr__(self, "_by_id", by_id)

    @classmethod
    def of(cls, cpus: Iterable[Cpu]) -> Topology:
        return cls(tuple(sorted(cpus)))

    @classmethod
    def uniform(cls, sockets: int, cores_per_socket: int, threads: int, numa_per_socket: int = 1) -> Topology:
        """A regular machine numbered like Linux on x86: first threads of all cores, then the siblings."""
        if cores_per_socket % numa_per_socket:
            raise ValueError("cores_per_socket must be a multiple of numa_per_socket")
        cores_per_numa = cores_per_socket // numa_per_socket
        total_cores = sockets * cores_per_socket
        cpus = []
        for thread in range(threads):
            for socket in range(sockets):
                for core in range(cores_per_socket):
                    cpu_id = thread * total_cores + socket * cores_per_socket + core
                    numa = socket * numa_per_socket + core // cores_per_numa
                    cpus.append(Cpu(cpu_id, socket, numa, core))
        return cls.of(cpus)

    def cpu(self, cpu_id: int) -> Cpu:
        return self._by_id[cpu_id]

    @cached_property
    def ids(self) -> frozenset[int]:
        return frozenset(self._by_id)

    @cached_property
    def cores(self) -> dict[tuple[int, int], frozenset[int]]:
        """Physical cores keyed by (socket, core_id), each with its hyperthread siblings."""
        return _group(self.cpus, lambda c: (c.socket, c.core))

    @cached_property
    def numa_nodes(self) -> dict[int, frozenset[int]]:
        return _group(self.cpus, lambda c: c.numa)

    @cached_property
    def sockets(self) -> dict[int, frozenset[int]]:
        return _group(self.cpus, lambda c: c.socket)

    @cached_property
    def threads_per_core(self) -> int:
        return max((len(ids) for ids in self.cores.values()), default=1)


_K = TypeVar("_K", int, tuple[int, int])


def _group(cpus: Iterable[Cpu], key: Callable[[Cpu], _K]) -> dict[_K, frozenset[int]]:
    groups: dict[_K, set[int]] = {}
    for cpu in cpus:
        groups.setdefault(key(cpu), set()).add(cpu.id)
    return {k: frozenset(groups[k]) for k in sorted(groups)}


# Exclusive assignments keyed by (pod uid, container name), as in cpu_manager_state's "entries".
Assignments: TypeAlias = Mapping[tuple[str, str], frozenset[int]]


def shared_pool(topology: Topology, assigned: Assignments) -> frozenset[int]:
    """The kubelet's defaultCpuSet: all CPUs minus exclusive assignments (reserved CPUs stay in it)."""
    return topology.ids - _union(assigned.values())


def free_cpus(topology: Topology, reserved: frozenset[int], assigned: Assignments) -> frozenset[int]:
    """CPUs that may still be assigned exclusively (the kubelet's GetAvailableCPUs)."""
    return shared_pool(topology, assigned) - reserved


def allocate(
    topology: Topology, reserved: frozenset[int], assigned: Assignments, request: int
) -> frozenset[int]:
    """Exactly `request` CPUs for one container, chosen like the static policy.

    Raises NotEnoughCpus when fewer than `request` CPUs are neither reserved nor assigned.
    """
    if request < 1:
        raise ValueError(f"an exclusive cpu request must be a positive integer, got {request}")
    free = free_cpus(topology, reserved, assigned)
    if request > len(free):
        raise NotEnoughCpus(
            f"not enough cpus available to satisfy request: requested={request}, available={len(free)} "
            f"(free: {format_cpu_list(free) or 'none'})"
        )
    aligned = free & _union(topology.numa_nodes[n] for n in _preferred_numa_nodes(topology, free, request))
    result = _take_by_topology(topology, aligned, min(request, len(aligned)))
    # The preferred nodes always hold the request here; the fallback mirrors the kubelet's allocateCPUs.
    if len(result) < request:
        result |= _take_by_topology(topology, free - result, request - len(result))
    return result


def release(
    assigned: Assignments, pod_uid: str, container: str | None = None
) -> dict[tuple[str, str], frozenset[int]]:
    """The assignments without the pod's containers (or only `container`): their CPUs become free again."""
    return {
        key: cpus
        for key, cpus in assigned.items()
        if not (key[0] == pod_uid and (container is None or key[1] == container))
    }


def _union(sets: Iterable[frozenset[int]]) -> frozenset[int]:
    return frozenset().union(*sets)


def _preferred_numa_nodes(topology: Topology, free: frozenset[int], request: int) -> tuple[int, ...]:
    nodes = list(topology.numa_nodes)
    for width in range(1, len(nodes) + 1):
        for combo in itertools.combinations(nodes, width):  # lexicographic: lowest ids first
            if len(free & _union(topology.numa_nodes[n] for n in combo)) >= request:
                return combo
    return tuple(nodes)


def _take_by_topology(topology: Topology, available: frozenset[int], count: int) -> frozenset[int]:
    """`count` CPUs out of `available`: whole big units, then whole cores, then single threads."""
    remaining = set(available)
    taken: set[int] = set()

    def take(cpus: frozenset[int]) -> None:
        taken.update(cpus)
        remaining.difference_update(cpus)

    # Sockets and NUMA nodes, the larger unit first (sub-NUMA clustering makes sockets the larger one).
    levels = sorted((topology.sockets, topology.numa_nodes), key=lambda lv: -max(map(len, lv.values())))
    for level in levels:
        for unit_id in sorted(level, key=lambda u: (len(level[u] & remaining), u)):
            unit = level[unit_id]
            if unit <= remaining and count - len(taken) >= len(unit):
                take(unit)

    if count - len(taken) >= topology.threads_per_core:
        for core in _packed_order(topology, remaining, list(topology.cores.values())):
            if core <= remaining and count - len(taken) >= len(core):
                take(core)

    while len(taken) < count:
        cores = [core & remaining for core in topology.cores.values() if core & remaining]
        first_core = _packed_order(topology, remaining, cores)[0]
        take(frozenset({min(first_core)}))
    return frozenset(taken)


def _packed_order(
    topology: Topology, remaining: set[int], cores: list[frozenset[int]]
) -> list[frozenset[int]]:
    """Cores ordered fullest-first: by free CPUs in their socket, NUMA node and core, then by id."""

    def key(core: frozenset[int]) -> tuple[int, ...]:
        cpu = topology.cpu(min(core))
        socket_free = len(topology.sockets[cpu.socket] & remaining)
        numa_free = len(topology.numa_nodes[cpu.numa] & remaining)
        return (socket_free, cpu.socket, numa_free, cpu.numa, len(core & remaining), cpu.core)

    return sorted(cores, key=key)
