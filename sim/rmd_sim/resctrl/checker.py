"""The kernel's rules for a resctrl tree: `check_resctrl_tree` lists every way a tree breaks them, and
`read_resctrl_state` reads a tree that keeps them as a `ResctrlState`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from rmd_sim.resctrl.model import (
    MBA_MAX_MBPS,
    MODES,
    RESCTRL,
    CacheInfo,
    Group,
    ResctrlInfo,
    ResctrlState,
    first_run,
    group_label,
)
from rmd_sim.resctrl.tree import (
    RawGroup,
    TreeProblem,
    list_groups,
    read_info,
    read_name_width,
    read_raw_group,
)


def check_resctrl_tree(root: Path) -> list[str]:
    """Every violation of the kernel's resctrl rules in the tree at `root`; empty means valid.

    A tree without a resctrl mount (no sys/fs/resctrl/info) has nothing to violate.
    """
    return _inspect(Path(root))[2]


def _inspect(root: Path) -> tuple[ResctrlInfo | None, list[RawGroup], list[str]]:
    """Read the mount once: its info, its groups as read, and every rule they break."""
    if not (root / RESCTRL / "info").is_dir():
        return None, [], []
    try:
        info = read_info(root)
    except TreeProblem as exc:
        return None, [], [str(exc)]
    problems: list[str] = []
    raws = [read_raw_group(root, n, problems) for n in ["", *list_groups(root)]]
    root_raw = raws[0]
    if root_raw.schemata is None:
        return info, raws, problems
    domains = {res: tuple(vals) for res, vals in root_raw.schemata.items()}
    for res, cache in (("L3", info.l3), ("MB", info.mb)):
        if cache is not None and res not in domains:
            problems.append(f"root group: schemata has no {res} line although info/{res} exists")
    groups = _decode_groups(info, domains, raws, problems)
    problems += _count_violations(info, len(raws))
    problems += _mode_violations(raws)
    problems += _exclusive_violations(info, groups)
    problems += _cpu_violations(info, raws)
    problems += _task_violations(raws)
    return info, raws, problems


def _decode_groups(
    info: ResctrlInfo,
    domains: Mapping[str, tuple[int, ...]],
    raws: list[RawGroup],
    problems: list[str],
) -> list[Group]:
    """Check each group's schemata values and return the groups whose L3 masks are all readable."""
    groups = []
    for raw in raws:
        if raw.schemata is None:
            continue
        label = group_label(raw.name)
        values: dict[str, dict[int, int]] = {}
        for res in raw.schemata.keys() - domains.keys():
            problems.append(f"{label}: schemata has resource {res} which the root schemata lacks")
        for res, ids in domains.items():
            line = raw.schemata.get(res)
            if line is None:
                problems.append(f"{label}: schemata has no {res} line (root lists domains {_ids(ids)})")
                continue
            for d in sorted(set(ids) - line.keys()):
                problems.append(f"{label}: {res} lacks domain {d} (root schemata lists {_ids(ids)})")
            for d in sorted(line.keys() - set(ids)):
                problems.append(
                    f"{label}: {res} domain {d} is not a domain of the root schemata ({_ids(ids)})"
                )
            values[res] = {}
            for d, text in line.items():
                problem, value = _check_value(info, res, text)
                if problem:
                    problems.append(f"{label}: {res} domain {d} {problem}")
                if value is not None:
                    values[res][d] = value
        groups.append(Group(raw.name, values, raw.cpus or frozenset(), raw.mode or "shareable"))
    return groups


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids)


def _check_value(info: ResctrlInfo, res: str, text: str) -> tuple[str | None, int | None]:
    if res == "L3" and info.l3 is not None:
        try:
            mask = int(text, 16)
        except ValueError:
            return f"mask {text!r} is not hex", None
        return _mask_problem(info.l3, mask), mask
    if res == "MB" and info.mb is not None:
        try:
            value = int(text)
        except ValueError:
            return f"value {text!r} is not a number", None
        mb = info.mb
        if mb.mbps:
            return (None if 0 <= value <= MBA_MAX_MBPS else f"value {value} is not a u32 MiB/s"), value
        if not mb.min_bandwidth <= value <= 100:
            return f"value {value} is outside [{mb.min_bandwidth},100]", value
        if value % mb.bandwidth_gran:
            return f"value {value} is not a multiple of bandwidth_gran={mb.bandwidth_gran}", value
        return None, value
    return None, None


def _mask_problem(l3: CacheInfo, mask: int) -> str | None:
    if mask & ~l3.cbm_mask:
        return f"mask {mask:x} has bits outside cbm_mask {l3.cbm_mask:x}"
    if mask == 0:
        return f"mask 0 is empty but min_cbm_bits is {l3.min_cbm_bits}" if l3.min_cbm_bits else None
    first, zero = first_run(mask)
    if not l3.sparse_masks and mask >> zero:
        return f"mask {mask:x} has non-consecutive 1-bits (sparse_masks is absent or 0)"
    if zero - first < l3.min_cbm_bits:
        return f"mask {mask:x} has fewer than min_cbm_bits={l3.min_cbm_bits} consecutive bits"
    return None


def _count_violations(info: ResctrlInfo, count: int) -> list[str]:
    if count > info.num_closids:
        return [f"{count} control groups (root included) exceed num_closids={info.num_closids}"]
    return []


def _mode_violations(raws: list[RawGroup]) -> list[str]:
    return [
        f"{group_label(r.name)}: mode {r.mode!r} is not one of {', '.join(MODES)}"
        for r in raws
        if r.mode is not None and r.mode not in MODES
    ]


def _exclusive_violations(info: ResctrlInfo, groups: list[Group]) -> list[str]:
    if info.l3 is None:
        return []
    problems = []
    for i, g in enumerate(groups):
        if g.mode != "exclusive":
            continue
        for d, mask in g.schemata.get("L3", {}).items():
            if mask & info.l3.shareable_bits:
                problems.append(
                    f"{group_label(g.name)} is exclusive but its L3 domain {d} mask {mask:x} "
                    f"overlaps shareable_bits {info.l3.shareable_bits:x}"
                )
            for j, h in enumerate(groups):
                other = h.schemata.get("L3", {}).get(d)
                if h is g or other is None or not mask & other or (h.mode == "exclusive" and j < i):
                    continue
                problems.append(
                    f"{group_label(g.name)} is exclusive but its L3 domain {d} mask {mask:x} "
                    f"overlaps {group_label(h.name)} mask {other:x}"
                )
    return problems


def _cpu_violations(info: ResctrlInfo, raws: list[RawGroup]) -> list[str]:
    owners: dict[int, list[str]] = {}
    problems = []
    for raw in raws:
        for cpu in sorted(raw.cpus or ()):
            owners.setdefault(cpu, []).append(raw.name)
            if info.online and cpu not in info.online:
                problems.append(f"{group_label(raw.name)}: cpus_list names cpu {cpu} which is not online")
    for cpu in sorted(info.online):
        names = owners.get(cpu, [])
        if not names and all(r.cpus is not None for r in raws):
            problems.append(f"cpu {cpu} is in no group's cpus_list")
    for cpu, names in sorted(owners.items()):
        if len(names) > 1:
            problems.append(
                f"cpu {cpu} is in more than one group: {', '.join(group_label(n) for n in names)}"
            )
    return problems


def _task_violations(raws: list[RawGroup]) -> list[str]:
    owners: dict[int, list[str]] = {}
    for raw in raws:
        for pid in raw.tasks or ():
            owners.setdefault(pid, []).append(raw.name)
    return [
        f"task {pid} is in more than one group: {', '.join(group_label(n) for n in names)}"
        for pid, names in sorted(owners.items())
        if len(names) > 1
    ]


def read_resctrl_state(root: Path, info: ResctrlInfo | None = None) -> ResctrlState:
    """The tree as a `ResctrlState`; TreeProblem if it cannot be read or breaks the kernel's rules.

    `info` replaces what info/ says (SimResctrl passes the cache sizes it read once).
    """
    root = Path(root)
    found, raws, problems = _inspect(root)
    if found is None and not problems:
        problems = [f"/{RESCTRL}/info is absent: resctrl is not mounted in this tree"]
    if problems or found is None:
        raise TreeProblem("; ".join(problems))
    assert raws[0].schemata is not None  # a valid tree has a readable root schemata
    domains = {res: tuple(vals) for res, vals in raws[0].schemata.items()}
    groups = {}
    for raw in raws:
        assert raw.schemata is not None and raw.cpus is not None
        values = {
            res: {d: int(v, 16) if res == "L3" else int(v) for d, v in raw.schemata[res].items()}
            for res in domains
        }
        groups[raw.name] = Group(raw.name, values, raw.cpus, raw.mode or "shareable", raw.tasks or ())
    return ResctrlState(info or found, domains, groups, name_width=read_name_width(root))
