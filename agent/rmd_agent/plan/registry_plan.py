"""The plan of the engine's whole registry on a node whose resctrl other tools may share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rmd_agent.plan.inventory import NodeInventory
from rmd_agent.plan.resctrl_layout import Layout, Operation, diff, plan_layout
from rmd_agent.plan.workload import RejectReason, Workload, WorkloadRejected

if TYPE_CHECKING:  # the observed state's type only: plan reads nothing itself
    from rmd_agent.observe.resctrl import ResctrlState


def plan_registry(
    inventory: NodeInventory,
    requests: Sequence[Workload],
    owned: frozenset[str],
    current: ResctrlState | None,
) -> tuple[Layout, dict[str, WorkloadRejected], list[Operation]]:
    """The layout of `requests`, the workloads refused (by the planner, or because their group's name is
    another tool's), and the operations from `current` (none without resctrl). `owned` names the groups the
    registry records as ours; every other group of `current` is another tool's."""
    registered = owned.__contains__
    foreign = {g.name for g in current.groups if not registered(g.name)} if current else set()
    excluded: dict[str, WorkloadRejected] = {}
    while True:
        layout = plan_layout(
            inventory, [w for w in requests if w.key not in excluded], current, owned=registered
        )
        clashes = [g for g in layout.groups if g.name in foreign]
        if not clashes:
            break
        # A group name another tool already uses: mkdir would fail, and the group is theirs.
        for group in clashes:
            for key in group.workloads:
                excluded[key] = WorkloadRejected(
                    RejectReason.CONFLICT,
                    f"resctrl group {group.name} already exists and was not created by this agent",
                    key,
                )
    rejected = dict(layout.rejected) | excluded
    if current is None:
        return layout, rejected, []
    ours = owned | {g.name for g in layout.groups}
    return layout, rejected, diff(current, layout, owned=ours.__contains__)
