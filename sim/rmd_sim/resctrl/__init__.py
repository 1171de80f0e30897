"""A model of the kernel's resctrl filesystem over a host tree: a rule checker and a simulated kernel.

The tree under `<root>/sys/fs/resctrl` is the state. `check_resctrl_tree` reports every way a tree breaks the
kernel's rules; `SimResctrl` performs mkdir/rmdir/write the way the kernel does (same validation order, same
errno, same `info/last_cmd_status` text, modelled on Linux 6.x fs/resctrl) so an agent's writes can be tested
without RDT hardware. Kernel operations are pure functions over `ResctrlState`; `SimResctrl` only loads the
state, applies one operation and writes back the files that changed.

Modules: `model` (the state), `tree` (reading the files), `checker` (the kernel's rules), `ops` (the kernel's
operations, pure), `render` (what the kernel shows on read), `sim` (SimResctrl, with injected faults).

Not modelled: CDP (L3CODE/L3DATA), L2 CAT, monitoring groups (mkdir inside mon_groups gives EPERM),
pseudo-locking (the simulated platform reports it unsupported) and a process table (`tasks` accepts any
pid and lists only pids written to it).
"""

from rmd_api.cpuset import format_cpu_mask
from rmd_sim.resctrl.checker import check_resctrl_tree, read_resctrl_state
from rmd_sim.resctrl.model import (
    GROUP_FILES,
    MBA_MAX_MBPS,
    MODES,
    NON_GROUP_DIRS,
    RESCTRL,
    CacheInfo,
    Group,
    MbInfo,
    ResctrlInfo,
    ResctrlState,
    group_label,
    state_for_spec,
)
from rmd_sim.resctrl.ops import (
    KernelReject,
    op_mkdir,
    op_rmdir,
    op_write_cpus,
    op_write_mode,
    op_write_schemata,
    op_write_tasks,
)
from rmd_sim.resctrl.render import (
    MB_DATA_WIDTH,
    render_bit_usage,
    render_group_files,
    render_schemata,
    render_size,
)
from rmd_sim.resctrl.sim import Fault, SimResctrl
from rmd_sim.resctrl.tree import TreeProblem, list_groups, parse_schemata_text, read_info

__all__ = [
    "GROUP_FILES",
    "MBA_MAX_MBPS",
    "MB_DATA_WIDTH",
    "MODES",
    "NON_GROUP_DIRS",
    "RESCTRL",
    "CacheInfo",
    "Fault",
    "Group",
    "KernelReject",
    "MbInfo",
    "ResctrlInfo",
    "ResctrlState",
    "SimResctrl",
    "TreeProblem",
    "check_resctrl_tree",
    "format_cpu_mask",
    "group_label",
    "list_groups",
    "op_mkdir",
    "op_rmdir",
    "op_write_cpus",
    "op_write_mode",
    "op_write_schemata",
    "op_write_tasks",
    "parse_schemata_text",
    "read_info",
    "read_resctrl_state",
    "render_bit_usage",
    "render_group_files",
    "render_schemata",
    "render_size",
    "state_for_spec",
]
