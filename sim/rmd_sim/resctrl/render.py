"""What the kernel shows on read: the group files (schemata, size, cpus, ...) and info/L3/bit_usage, padded
and ordered exactly as Linux prints them."""

from __future__ import annotations

from rmd_api.cpuset import format_cpu_list, format_cpu_mask
from rmd_sim.resctrl.model import Group, ResctrlState

MB_DATA_WIDTH = 3  # the kernel pads MB values to 3 columns


def _data_width(state: ResctrlState) -> int:
    widths = [MB_DATA_WIDTH] if state.info.mb else []
    if state.info.l3:
        widths.append((state.info.l3.cbm_len + 3) // 4)
    return max(widths, default=MB_DATA_WIDTH)


def render_schemata(state: ResctrlState, group: Group) -> str:
    """`    L3:0=7ff;1=7ff` / `    MB:0=100;1= 50`: names right-aligned, masks 0-padded, MB space-padded."""
    width = _data_width(state)
    lines = []
    for res, ids in state.domains.items():
        values = group.schemata[res]
        if res == "MB":
            items = [f"{d}={values[d]:>{width}}" for d in ids]
        else:
            items = [f"{d}={values[d]:0{width}x}" for d in ids]
        lines.append(f"{res:>{state.name_width}}:" + ";".join(items) + "\n")
    return "".join(lines)


def render_size(state: ResctrlState, group: Group) -> str:
    """Bytes per domain: cache size / cbm length x bits set; MB values as they are."""
    lines = []
    for res, ids in state.domains.items():
        values = group.schemata[res]
        if res == "L3" and state.info.l3:
            per_bit = {d: state.info.l3_cache_bytes.get(d, 0) // state.info.l3.cbm_len for d in ids}
            items = [f"{d}={per_bit[d] * values[d].bit_count()}" for d in ids]
        else:
            items = [f"{d}={values[d]}" for d in ids]
        lines.append(f"{res:>{state.name_width}}:" + ";".join(items) + "\n")
    return "".join(lines)


def render_group_files(state: ResctrlState, group: Group) -> dict[str, str]:
    return {
        "cpus": format_cpu_mask(group.cpus, state.info.nr_cpu_ids) + "\n",
        "cpus_list": format_cpu_list(group.cpus) + "\n",
        "mode": group.mode + "\n",
        "schemata": render_schemata(state, group),
        "size": render_size(state, group),
        "tasks": "".join(f"{pid}\n" for pid in group.tasks),
    }


def render_bit_usage(state: ResctrlState) -> str:
    """info/L3/bit_usage, highest bit first: X/H hardware-shared, S shareable, E exclusive, 0 unused."""
    l3 = state.info.l3
    if l3 is None or "L3" not in state.domains:
        return "\n"
    parts = []
    for d in state.domains["L3"]:
        sw = exclusive = 0
        for g in state.groups.values():
            if g.mode == "shareable":
                sw |= g.schemata["L3"][d]
            elif g.mode == "exclusive":
                exclusive |= g.schemata["L3"][d]
        legend = []
        for bit in range(l3.cbm_len - 1, -1, -1):
            hw, s, e = l3.shareable_bits >> bit & 1, sw >> bit & 1, exclusive >> bit & 1
            legend.append("X" if hw and s else "H" if hw else "S" if s else "E" if e else "0")
        parts.append(f"{d}=" + "".join(legend))
    return ";".join(parts) + "\n"
