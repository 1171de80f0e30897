"""Per-core P-states driven by the branch-miss ratio (RMD's P-state plugin). See docs/pstate.md.

policy.py is the pure decision; counters.py reads branch counters (perf events, or a simulated node's files);
cpufreq_control.py writes and restores frequency limits; monitor.py is the sampling loop of one workload;
plugin.py is the per-workload facade; sync.py keeps its monitors in step with the engine's workloads.
"""

from rmd_agent.pstate.counters import CounterSource, CounterUnavailable, FileCounters, PerfEventCounters
from rmd_agent.pstate.cpufreq_control import CpufreqControl, CpufreqWriteError
from rmd_agent.pstate.plugin import (
    PStateConflict,
    PStateController,
    PStateResult,
    PStateState,
    probe_pstate,
)
from rmd_agent.pstate.policy import BranchCounts, FreqLimits, PolicyConfig

__all__ = [
    "BranchCounts",
    "CounterSource",
    "CounterUnavailable",
    "CpufreqControl",
    "CpufreqWriteError",
    "FileCounters",
    "FreqLimits",
    "PStateConflict",
    "PStateController",
    "PStateResult",
    "PStateState",
    "PerfEventCounters",
    "PolicyConfig",
    "probe_pstate",
]
