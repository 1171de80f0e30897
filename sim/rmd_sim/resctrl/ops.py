"""The kernel's operations on resctrl as pure functions over `ResctrlState`: mkdir, rmdir and the writes to
schemata, cpus/cpus_list, tasks and mode, with the kernel's validation order, errno and last_cmd_status text
(modelled on Linux 6.x fs/resctrl)."""

from __future__ import annotations

import dataclasses
import errno
import re
from collections.abc import Mapping

from rmd_api.cpuset import CpuListError, parse_cpu_list
from rmd_sim.resctrl.model import (
    DECIMAL,
    MBA_MAX_MBPS,
    CacheInfo,
    Group,
    MbInfo,
    ResctrlState,
    first_run,
)

_HEX = re.compile(r"\+?(?:0[xX])?[0-9a-fA-F]+")


class KernelReject(Exception):
    """A write the kernel refuses: its errno and last_cmd_status text (None: the kernel leaves it as is)."""

    def __init__(self, err: int, status: str | None) -> None:
        super().__init__(err, status)
        self.errno = err
        self.status = status


def _replace_groups(state: ResctrlState, *changed: Group) -> ResctrlState:
    groups = dict(state.groups)
    for g in changed:
        groups[g.name] = g
    return state.with_groups(groups)


def op_mkdir(state: ResctrlState, name: str) -> ResctrlState:
    """A new control group: a free CLOSID, the CBM of everything not held exclusively (lowest contiguous run),
    MB at its maximum, no CPUs, mode shareable (rdtgroup_init_alloc)."""
    info = state.info
    if len(state.groups) >= info.num_closids:
        raise KernelReject(errno.ENOSPC, "Out of CLOSIDs")
    if info.num_rmids is not None and len(state.groups) >= info.num_rmids:
        raise KernelReject(errno.ENOSPC, "Out of RMIDs")
    schemata: dict[str, Mapping[int, int]] = {}
    for res, ids in state.domains.items():
        if res == "L3" and info.l3 is not None:
            schemata[res] = {d: _initial_cbm(state, info.l3, d) for d in ids}
        elif res == "MB" and info.mb is not None:
            schemata[res] = dict.fromkeys(ids, info.mb.max)
        else:
            schemata[res] = dict(state.root.schemata[res])
    return _replace_groups(state, Group(name, schemata, frozenset()))


def _initial_cbm(state: ResctrlState, l3: CacheInfo, domain: int) -> int:
    used = shared = l3.shareable_bits
    for g in state.groups.values():
        mask = g.schemata["L3"][domain]
        used |= mask
        if g.mode == "shareable":
            shared |= mask
    candidate = shared | (l3.cbm_mask & ~used)
    _, zero = first_run(candidate)
    cbm = candidate & ((1 << zero) - 1) if candidate else 0  # cbm_ensure_valid keeps the lowest run
    if cbm.bit_count() < l3.min_cbm_bits:
        raise KernelReject(errno.ENOSPC, f"No space on L3:{domain}")
    return cbm


def op_rmdir(state: ResctrlState, name: str) -> ResctrlState:
    """Remove a group; its CPUs and tasks go back to the root group."""
    gone = state.groups[name]
    root = state.root
    groups = dict(state.groups)
    del groups[name]
    groups[""] = dataclasses.replace(
        root, cpus=root.cpus | gone.cpus, tasks=tuple(sorted(set(root.tasks) | set(gone.tasks)))
    )
    return state.with_groups(groups)


def _parse_cbm(l3: CacheInfo, text: str) -> int:
    if not _HEX.fullmatch(text):
        raise KernelReject(errno.EINVAL, f"Non-hex character in the mask {text}")
    value = int(text.lstrip("+"), 16)
    if (l3.min_cbm_bits > 0 and value == 0) or value > l3.cbm_mask:
        raise KernelReject(errno.EINVAL, "Mask out of range")
    first, zero = first_run(value)
    if not l3.sparse_masks and value >> zero:
        raise KernelReject(errno.EINVAL, f"The mask {value:x} has non-consecutive 1-bits")
    if zero - first < l3.min_cbm_bits:
        raise KernelReject(errno.EINVAL, f"Need at least {l3.min_cbm_bits} bits in the mask")
    return value


def _parse_bw(mb: MbInfo, text: str) -> int:
    if not DECIMAL.fullmatch(text) or int(text) > MBA_MAX_MBPS:
        raise KernelReject(errno.EINVAL, f"Invalid MB value {text}")
    value = int(text)
    if mb.mbps:
        return value
    if not mb.min_bandwidth <= value <= 100:
        raise KernelReject(errno.EINVAL, f"MB value {value} out of range [{mb.min_bandwidth},100]")
    return -(-value // mb.bandwidth_gran) * mb.bandwidth_gran  # the kernel rounds up to a step


def op_write_schemata(state: ResctrlState, name: str, data: str) -> ResctrlState:
    """Parse and validate every line first; apply only if all domains pass (partial writes merge)."""
    if not data.endswith("\n"):
        raise KernelReject(errno.EINVAL, None)  # rejected before last_cmd_status is cleared
    group = state.groups[name]
    staged: dict[str, dict[int, int]] = {}
    for line in data[:-1].split("\n"):
        resname, sep, tok = line.partition(":")
        resname = resname.strip()
        if not sep:
            raise KernelReject(errno.EINVAL, "Missing ':'")
        if not tok:
            raise KernelReject(errno.EINVAL, f"Missing '{resname}' value")
        if resname not in state.domains:
            raise KernelReject(errno.EINVAL, f"Unknown or unsupported resource name '{resname}'")
        _parse_line(state, group, resname, tok, staged.setdefault(resname, {}))
    schemata = {res: {**vals, **staged.get(res, {})} for res, vals in group.schemata.items()}
    return _replace_groups(state, dataclasses.replace(group, schemata=schemata))


def _parse_line(state: ResctrlState, group: Group, res: str, line: str, staged: dict[int, int]) -> None:
    rest: str | None = line
    while rest:
        dom, sep, tail = rest.partition(";")
        rest = tail if sep else None
        id_text, eq, value_text = dom.partition("=")
        if not eq or not DECIMAL.fullmatch(id_text):
            raise KernelReject(errno.EINVAL, "Missing '=' or non-numeric domain")
        dom_id = int(id_text)
        if dom_id not in state.domains[res]:
            raise KernelReject(errno.EINVAL, "")  # the kernel fails without a message here
        if dom_id in staged:
            raise KernelReject(errno.EINVAL, f"Duplicate domain {dom_id}")
        value_text = value_text.strip()
        if res == "L3" and state.info.l3 is not None:
            value = _parse_cbm(state.info.l3, value_text)
            _check_overlap(state, group, dom_id, value)
        elif res == "MB" and state.info.mb is not None:
            value = _parse_bw(state.info.mb, value_text)
        else:  # pragma: no cover - only L3 and MB resources are modelled
            raise KernelReject(errno.EINVAL, f"Unknown or unsupported resource name '{res}'")
        staged[dom_id] = value


def _check_overlap(state: ResctrlState, group: Group, domain: int, cbm: int) -> None:
    others = [g.schemata["L3"][domain] for g in state.others(group.name)]
    exclusive = [g.schemata["L3"][domain] for g in state.others(group.name) if g.mode == "exclusive"]
    if any(cbm & m for m in exclusive):
        raise KernelReject(errno.EINVAL, "Overlaps with exclusive group")
    assert state.info.l3 is not None
    if group.mode == "exclusive" and (cbm & state.info.l3.shareable_bits or any(cbm & m for m in others)):
        raise KernelReject(errno.EINVAL, "Overlaps with other group")


def _parse_cpus(state: ResctrlState, data: str, as_list: bool) -> frozenset[int]:
    text = data.strip()
    nbits = state.info.nr_cpu_ids
    if as_list:
        try:
            cpus = parse_cpu_list(text)
        except CpuListError:
            raise KernelReject(errno.EINVAL, "Bad CPU list/mask") from None
        if any(c >= nbits for c in cpus):
            raise KernelReject(errno.ERANGE, "Bad CPU list/mask")
        return cpus
    words = text.split(",") if text else []
    if any(not re.fullmatch(r"[0-9a-fA-F]{1,8}", w) for w in words):
        raise KernelReject(errno.EINVAL, "Bad CPU list/mask")
    value = int("".join(f"{int(w, 16):08x}" for w in words) or "0", 16)
    if value >> nbits:
        raise KernelReject(errno.EOVERFLOW, "Bad CPU list/mask")
    return frozenset(i for i in range(nbits) if value >> i & 1)


def op_write_cpus(state: ResctrlState, name: str, data: str, as_list: bool) -> ResctrlState:
    """Move CPUs into a group: added CPUs leave their old group, dropped CPUs return to the root group."""
    group = state.groups[name]
    new = _parse_cpus(state, data, as_list)
    if new - state.info.online:
        raise KernelReject(errno.EINVAL, "Can only assign online CPUs")
    dropped = group.cpus - new
    if dropped and name == "":
        raise KernelReject(errno.EINVAL, "Can't drop CPUs from default group")
    added = new - group.cpus
    groups = {}
    for n, g in state.groups.items():
        if n == name:
            groups[n] = dataclasses.replace(g, cpus=new)
        else:
            groups[n] = dataclasses.replace(g, cpus=(g.cpus - added) | (dropped if n == "" else frozenset()))
    return state.with_groups(groups)


def op_write_tasks(state: ResctrlState, name: str, data: str) -> ResctrlState:
    """Move one task (pid) into the group. Without a process table every positive pid exists; 0 is a no-op."""
    text = data.strip()
    try:
        pid = int(text, 0)
    except ValueError:
        raise KernelReject(errno.EINVAL, None) from None
    if pid < 0:
        raise KernelReject(errno.EINVAL, None)
    if pid == 0:
        return state
    groups = {
        n: dataclasses.replace(g, tasks=tuple(t for t in g.tasks if t != pid))
        for n, g in state.groups.items()
    }
    groups[name] = dataclasses.replace(groups[name], tasks=tuple(sorted((*groups[name].tasks, pid))))
    return state.with_groups(groups)


def op_write_mode(state: ResctrlState, name: str, data: str) -> ResctrlState:
    if not data.endswith("\n"):
        raise KernelReject(errno.EINVAL, None)
    wanted = data[:-1]
    group = state.groups[name]
    if wanted == group.mode:
        return state
    if group.mode == "pseudo-locked":
        raise KernelReject(errno.EINVAL, "Cannot change pseudo-locked group")
    if wanted == "exclusive":
        l3 = state.info.l3
        if l3 is None or "L3" not in state.domains:
            raise KernelReject(errno.EINVAL, "Cannot be exclusive without CAT/CDP")
        for d in state.domains["L3"]:
            mask = group.schemata["L3"][d]
            if mask & l3.shareable_bits or any(mask & g.schemata["L3"][d] for g in state.others(name)):
                raise KernelReject(errno.EINVAL, "Schemata overlaps")
    elif wanted == "pseudo-locksetup":
        raise KernelReject(
            errno.EINVAL, "Cannot pseudo-lock default group" if name == "" else "Pseudo-locking not supported"
        )
    elif wanted != "shareable":
        raise KernelReject(errno.EINVAL, "Unknown or unsupported mode")
    return _replace_groups(state, dataclasses.replace(group, mode=wanted))
