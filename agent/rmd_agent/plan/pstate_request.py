"""What a workload asks of the P-state plugin (docs/pstate.md), as the engine and its P-state sync read it."""

from __future__ import annotations

from rmd_agent.plan.workload import RejectReason, Workload, WorkloadRejected


def pstate_request(w: Workload) -> tuple[float | None, bool] | None:
    """(ratio, monitoring) when the workload asks for a P-state; monitoring defaults to on, as in RMD."""
    if w.pstate_ratio is None and w.pstate_monitoring is None:
        return None
    return w.pstate_ratio, (w.pstate_monitoring or "on") == "on"


def check_pstate_request(w: Workload) -> None:
    """WorkloadRejected (invalid) for monitoring without a ratio to compare the branch-miss ratio with."""
    request = pstate_request(w)
    if request is not None and request[1] and request[0] is None:
        raise WorkloadRejected(
            RejectReason.INVALID,
            'P-state monitoring needs a ratio (plugins.pstate.ratio, e.g. "3.0"), or monitoring: "off"',
            w.key,
        )
