"""A workload: cache ways, memory bandwidth and a P-state for a set of CPUs, and whether a node can give it.

The request arrives as the rmd.agent.v1 WorkloadSpec the operator made of an RmdWorkload (either layout;
rmd_api.workload_spec) and is copied field by field (rmd_agent.server.convert). Cache max/min select the
pool, as in RMD:

    max == min > 0    guaranteed   ways of its own, never shared with any other group nor the OS
    max > min > 0     besteffort   at least min ways no other workload has, up to max when there is room
    max == 0          shared       the shared pool, together with every other shared workload

max > 0 with min == 0 is rejected (RMD did the same, but answered HTTP 500). A workload without cache ways
and without a policy is a shared-pool request, because rmd-operator sends max=0/min=0 for it.

`resolve_workload` applies the node's policy and CPU list and checks the request against the node;
`validate_workload` also checks it against the workloads the node already has. Every failure is a
WorkloadRejected whose `reason` tells the gRPC layer which status to answer and whose message names the
problem and the numbers. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from rmd_agent.errors import AgentError
from rmd_agent.plan.inventory import NodeInventory
from rmd_api.cpuset import format_cpu_list
from rmd_api.limits import CACHE_WAYS, MBA_MBPS, MBA_PERCENTAGE, PSTATE_RATIO


class Pool(StrEnum):
    GUARANTEED = "guaranteed"
    BEST_EFFORT = "besteffort"
    SHARED = "shared"


class RejectReason(StrEnum):
    """Why a workload is refused; the gRPC layer maps these to status codes."""

    INVALID = "invalid"  # the request is wrong, or can never be met on this node: INVALID_ARGUMENT
    CAPACITY = "capacity"  # not enough free cache ways or CLOS right now: RESOURCE_EXHAUSTED
    CONFLICT = "conflict"  # clashes with another workload or another resctrl user: FAILED_PRECONDITION


class WorkloadRejected(AgentError):
    """A workload the node will not enforce. str() is the message alone; `workload` is its key, if known.

    The message goes to the caller, and on into the workload's status and Events, which whoever may read
    that workload reads; `detail` (the message unless given) may say more, e.g. name a workload of another
    namespace, and goes to the agent's log only."""

    def __init__(self, reason: RejectReason, message: str, workload: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.workload = workload
        self.detail = detail or message

    def for_workload(self, key: str) -> WorkloadRejected:
        return self if self.workload else WorkloadRejected(self.reason, self.message, key, self.detail)


def _invalid(message: str) -> WorkloadRejected:
    return WorkloadRejected(RejectReason.INVALID, message)


def describe_cpus(cpus: Iterable[int]) -> str:
    """ "CPU 6 is" / "CPUs 6-7 are", for messages."""
    cpus = sorted(cpus)
    return f"CPU {cpus[0]} is" if len(cpus) == 1 else f"CPUs {format_cpu_list(cpus)} are"


def cpu_conflict(w: Workload, cpus: Iterable[int], holder: Workload) -> WorkloadRejected:
    """`w` refused (conflict) because `holder` has `cpus`. The message names the holder only if it is in
    `w`'s namespace, which its reader can see; the detail always does, for administrators."""
    taken = describe_cpus(cpus)
    detail = f"{taken} already assigned to workload {holder.key}"
    if holder.namespace == w.namespace:
        return WorkloadRejected(RejectReason.CONFLICT, detail, w.key)
    message = (
        f"{taken} already assigned to a workload in another namespace (an administrator finds it in this "
        "node's RmdNodeState)"
    )
    return WorkloadRejected(RejectReason.CONFLICT, message, w.key, detail)


def pool_for(cache_max: int, cache_min: int) -> Pool:
    """RMD's pool selection from cache ways. WorkloadRejected (invalid) for combinations that select none."""
    if cache_max < 0 or cache_min < 0:
        raise _invalid(f"cache ways cannot be negative (max={cache_max}, min={cache_min})")
    if cache_min > cache_max:
        raise _invalid(f"cache min={cache_min} exceeds max={cache_max}")
    if cache_max == 0:
        return Pool.SHARED
    if cache_min == 0:
        raise _invalid(
            f"cache max={cache_max} with min=0 selects no pool: use min == max for guaranteed cache, "
            "0 < min < max for best effort, or max=0 for the shared pool"
        )
    return Pool.GUARANTEED if cache_max == cache_min else Pool.BEST_EFFORT


@dataclass(frozen=True)
class Workload:
    """One workload on one node, keyed by namespace/name (uid tells apart a re-created object of that name).

    Before `resolve_workload` the fields are the request as given; after it, `resolved` is True, `core_ids` is
    the concrete CPU list (allCores expanded, reserved CPUs removed) and the policy's values are filled in.
    """

    namespace: str
    name: str
    uid: str = ""
    core_ids: frozenset[int] = frozenset()
    all_cores: bool = False
    reserved_core_ids: frozenset[int] = frozenset()
    cache_max: int | None = None
    cache_min: int | None = None
    mba_percentage: int | None = None
    mba_mbps: int | None = None
    policy: str | None = None
    pstate_ratio: float | None = None
    pstate_monitoring: str | None = None  # "on" or "off"
    resolved: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def wants_cache(self) -> bool:
        """Whether the request names cache ways (a policy counts); without, it is a shared-pool request."""
        return self.cache_max is not None or self.cache_min is not None or self.policy is not None

    @property
    def pool(self) -> Pool:
        """The cache pool; for a policy workload only once resolved (the node's platform picks the ways)."""
        if self.policy is not None and not self.resolved:
            raise ValueError(f"workload {self.key}: policy {self.policy!r} must be resolved for a node first")
        return pool_for(self.cache_max or 0, self.cache_min or 0)

    @property
    def mba(self) -> int | None:
        return self.mba_percentage if self.mba_percentage is not None else self.mba_mbps


# -- checks --------------------------------------------------------------------------------------------------


def _describe_cache(w: Workload) -> str:
    pool = pool_for(w.cache_max or 0, w.cache_min or 0)
    return f"{pool} cache (max={w.cache_max or 0}, min={w.cache_min or 0})"


def _describe_mba(w: Workload) -> str:
    return f"MBA {w.mba_percentage}%" if w.mba_percentage is not None else f"MBA {w.mba_mbps} MBps"


def _check_limits(w: Workload) -> None:
    """The ranges the CRD enforces (rmd_api.limits), in the operator's words, for any client of the agent."""
    for name, value, limit in (
        ("cache max", w.cache_max, CACHE_WAYS),
        ("cache min", w.cache_min, CACHE_WAYS),
        ("MBA percentage", w.mba_percentage, MBA_PERCENTAGE),
        ("MBA mbps", w.mba_mbps, MBA_MBPS),
    ):
        if value is not None:
            limit.require(name, value, _invalid)
    if w.pstate_ratio is not None:
        PSTATE_RATIO.require("P-state ratio", w.pstate_ratio, _invalid)


def check_request(w: Workload) -> None:
    """Problems a request has on any node. WorkloadRejected (invalid) names the first one found."""
    if w.all_cores and w.core_ids:
        raise _invalid(
            "spec.coreIds and spec.allCores are mutually exclusive: allCores takes every CPU of the node"
        )
    if w.reserved_core_ids and not w.all_cores:
        raise _invalid(
            "spec.reservedCoreIds needs spec.allCores: true (reserved CPUs are taken out of all CPUs)"
        )
    if not w.all_cores and not w.core_ids:
        raise _invalid("the workload has no CPUs: give spec.coreIds or spec.allCores: true")
    if w.policy is not None and not w.resolved and (w.cache_max is not None or w.cache_min is not None):
        raise _invalid(
            f"spec.policy and cache ways are mutually exclusive: policy {w.policy!r} sets the cache ways"
        )
    _check_limits(w)
    if w.cache_max is not None or w.cache_min is not None:
        pool_for(w.cache_max or 0, w.cache_min or 0)
    if w.mba_percentage is not None and w.mba_mbps is not None:
        raise _invalid(
            "give MBA as a percentage or in MBps, not both "
            f"(percentage={w.mba_percentage}, mbps={w.mba_mbps})"
        )
    if w.mba is not None and (w.policy is None or w.resolved):
        pool = pool_for(w.cache_max or 0, w.cache_min or 0)
        if pool is not Pool.GUARANTEED:
            raise _invalid(
                f"{_describe_mba(w)} needs guaranteed cache (max == min > 0); this workload asks for "
                f"{_describe_cache(w)}"
            )
    if w.pstate_monitoring not in (None, "on", "off"):
        raise _invalid(f'P-state monitoring must be "on" or "off", not {w.pstate_monitoring!r}')


def _apply_policy(w: Workload, node: NodeInventory) -> Workload:
    if w.policy is None or w.resolved:
        return w
    policy = node.policies.get(w.policy)
    if policy is None:
        known = ", ".join(sorted(node.policies)) or "none"
        raise _invalid(f"unknown policy {w.policy!r}: policies for platform {node.platform} are {known}")
    has_mba = w.mba is not None
    return dataclasses.replace(
        w,
        cache_max=policy.cache_max,
        cache_min=policy.cache_min,
        mba_percentage=w.mba_percentage if has_mba else policy.mba_percentage,
        mba_mbps=w.mba_mbps if has_mba else policy.mba_mbps,
        pstate_ratio=w.pstate_ratio if w.pstate_ratio is not None else policy.pstate_ratio,
        pstate_monitoring=w.pstate_monitoring
        if w.pstate_monitoring is not None
        else policy.pstate_monitoring,
        resolved=True,
    )


def _check_cache(w: Workload, node: NodeInventory) -> None:
    pool = w.pool
    needs_ways = (w.cache_max or 0) > 0
    if node.l3 is None:
        if needs_ways:
            raise _invalid(
                "this node has no L3 cache allocation (no resctrl info/L3), so it cannot give "
                f"{_describe_cache(w)}"
            )
        return  # a shared-pool request on a node without CAT: nothing to restrict
    sizes = node.pool_sizes()
    min_bits = node.l3.min_cbm_bits
    ways = w.cache_max or 0
    if pool is Pool.GUARANTEED:
        if ways < min_bits:
            raise _invalid(
                f"cache max={ways} is below this CPU's minimum of {min_bits} ways per mask (min_cbm_bits)"
            )
        if ways > sizes.guaranteed:
            raise _invalid(
                f"cache max={ways} exceeds this node's guaranteed pool of {sizes.guaranteed} ways per L3 "
                f"cache (each L3 cache of the workload's CPUs must give all {ways}): ask for at most "
                f"{sizes.guaranteed}"
            )
    elif pool is Pool.BEST_EFFORT:
        least = w.cache_min or 0
        if least < min_bits:
            raise _invalid(
                f"cache min={least} is below this CPU's minimum of {min_bits} ways per mask (min_cbm_bits)"
            )
        if least > sizes.besteffort:
            raise _invalid(
                f"cache min={least} exceeds this node's best-effort pool of {sizes.besteffort} ways per L3 "
                f"cache: ask for at most {sizes.besteffort}"
            )
    elif sizes.shared == 0:
        raise _invalid("this node's shared cache pool has 0 ways, so it takes no shared-pool workloads")


def _check_mba(w: Workload, node: NodeInventory) -> None:
    if w.mba is None:
        return
    mba = node.mba
    if mba is None:
        raise _invalid(
            f"this node has no memory bandwidth allocation (no resctrl info/MB), so it cannot give "
            f"{_describe_mba(w)}"
        )
    if mba.mbps and w.mba_percentage is not None:
        raise _invalid(
            f"this node's resctrl is mounted with mba_MBps: give MBA in MBps (rdt.mba.mbps), not as "
            f"{w.mba_percentage}%"
        )
    if not mba.mbps and w.mba_mbps is not None:
        raise _invalid(
            f"this node's MBA takes a percentage (rdt.mba.percentage), not {w.mba_mbps} MBps "
            "(resctrl is not mounted with mba_MBps)"
        )
    if w.mba_percentage is not None and w.mba_percentage < mba.min_bandwidth:
        raise _invalid(
            f"MBA {w.mba_percentage}% is below this node's minimum of {mba.min_bandwidth}% "
            "(info/MB/min_bandwidth)"
        )


def _resolve_cpus(w: Workload, node: NodeInventory) -> frozenset[int]:
    if w.all_cores:
        cpus = node.cpus - w.reserved_core_ids
        if not cpus:
            raise _invalid(
                f"allCores minus reservedCoreIds ({format_cpu_list(w.reserved_core_ids)}) leaves no CPUs "
                f"(online: {format_cpu_list(node.cpus)})"
            )
        return cpus
    missing = w.core_ids - node.cpus
    if missing:
        raise _invalid(
            f"{describe_cpus(missing)} not online on this node (online: {format_cpu_list(node.cpus)})"
        )
    return w.core_ids


def resolve_workload(w: Workload, node: NodeInventory) -> Workload:
    """The workload as this node enforces it: policy values filled in, CPUs concrete, and every request the
    node cannot meet rejected (invalid). Capacity and conflicts with other workloads are checked elsewhere."""
    try:
        check_request(w)
        r = _apply_policy(w, node)
        check_request(r)
        _check_cache(r, node)
        _check_mba(r, node)
        cpus = _resolve_cpus(r, node)
    except WorkloadRejected as exc:
        raise exc.for_workload(w.key) from None
    return dataclasses.replace(
        r, core_ids=cpus, all_cores=False, reserved_core_ids=frozenset(), resolved=True
    )


def check_conflicts(w: Workload, accepted: Iterable[Workload]) -> None:
    """WorkloadRejected (conflict) if a resolved workload shares CPUs with an accepted one: a CPU belongs to
    exactly one resctrl group."""
    for other in accepted:
        if other.key == w.key:
            continue
        taken = w.core_ids & other.core_ids
        if taken:
            raise cpu_conflict(w, taken, other)


def validate_workload(w: Workload, node: NodeInventory, others: Iterable[Workload] = ()) -> Workload:
    """`resolve_workload`, then CPU conflicts with the node's other workloads (resolved here if they are not
    yet; ones that no longer resolve hold no CPUs). Returns the resolved workload."""
    resolved = resolve_workload(w, node)
    accepted = []
    for other in others:
        if other.key == w.key:
            continue
        try:
            accepted.append(resolve_workload(other, node))
        except WorkloadRejected:
            continue
    check_conflicts(resolved, accepted)
    return resolved
