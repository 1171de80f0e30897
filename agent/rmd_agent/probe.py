"""What this node supports, and for each thing it does not, why. Used by `rmd-agent probe`, and by the
agent to report its capabilities in RmdNodeState so the operator targets only capable nodes; the feature
names are that object's capability keys (rmd_api.node_state)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from rmd_agent.errors import AgentError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.config import read_kubelet_config
from rmd_agent.kubelet.pod_lookup import LookupApi, PodLookup
from rmd_agent.kubelet.podresources import PodResources, PodResourcesClient, pod_resources_client
from rmd_agent.observe.caches import read_l3_caches
from rmd_agent.observe.cgroups import read_cgroups
from rmd_agent.observe.cpufreq import read_cpufreq
from rmd_agent.observe.numa import read_numa_nodes
from rmd_agent.observe.rapl import read_rapl_zones
from rmd_agent.observe.resctrl import read_resctrl
from rmd_agent.settings import AgentSettings
from rmd_api.node_state import (
    CGROUP,
    CPU_MANAGER_POLICY,
    CPUFREQ,
    L3_CACHE,
    MBA,
    NUMA,
    POD_RESOURCES,
    POD_RESOURCES_GET,
    RAPL,
    RDT_L3_CAT,
    RESCTRL_MOUNTED,
    TOPOLOGY_MANAGER_POLICY,
    topology_manager_detail,
)


@dataclass(frozen=True)
class Finding:
    feature: str
    supported: bool
    detail: str  # what was found, or the reason it is unsupported


@dataclass(frozen=True)
class ProbeReport:
    node_name: str
    host_root: str
    findings: tuple[Finding, ...]

    def as_dict(self) -> dict[str, object]:
        """The --json document (documented in docs/probe.md) and RmdNodeState's status.capabilities."""
        return {
            "nodeName": self.node_name,
            "hostRoot": self.host_root,
            "features": {f.feature: {"supported": f.supported, "detail": f.detail} for f in self.findings},
        }


def _found(feature: str, detail: str) -> Finding:
    return Finding(feature, True, detail)


def _missing(feature: str, why: Unsupported | str) -> Finding:
    return Finding(feature, False, why.reason if isinstance(why, Unsupported) else why)


def _probe_rdt(fs: HostFS) -> list[Finding]:
    state = read_resctrl(fs)
    if isinstance(state, Unsupported):
        return [_missing(name, state) for name in (RESCTRL_MOUNTED, RDT_L3_CAT, MBA)]
    findings = [
        _found(
            RESCTRL_MOUNTED,
            "/sys/fs/resctrl"
            + (f" ({','.join(sorted(state.mount_options))})" if state.mount_options else ""),
        )
    ]
    if isinstance(state.l3, Unsupported):
        findings.append(_missing(RDT_L3_CAT, state.l3))
    else:
        domains = sorted(state.root.schemata.get("L3DATA" if state.l3.cdp else "L3", {}))
        findings.append(
            _found(
                RDT_L3_CAT,
                f"{state.l3.ways} ways (cbm_mask {state.l3.cbm_mask:x}, min_cbm_bits "
                f"{state.l3.min_cbm_bits}), {state.num_closids} CLOSIDs, cache ids "
                f"{','.join(map(str, domains))}" + (", CDP on" if state.l3.cdp else ""),
            )
        )
    if isinstance(state.mba, Unsupported):
        findings.append(_missing(MBA, state.mba))
    else:
        unit = (
            "MBps (software controller)"
            if state.mba.mbps
            else (f"percent, min {state.mba.min_bandwidth}, step {state.mba.bandwidth_gran}")
        )
        findings.append(_found(MBA, unit))
    return findings


def _probe_hardware(fs: HostFS) -> list[Finding]:
    findings = []
    numa = read_numa_nodes(fs)
    findings.append(
        _missing(NUMA, numa)
        if isinstance(numa, Unsupported)
        else _found(NUMA, f"{len(numa)} NUMA node(s), {sum(len(n.cpus) for n in numa)} CPUs")
    )
    caches = read_l3_caches(fs)
    findings.append(
        _missing(L3_CACHE, caches)
        if isinstance(caches, Unsupported)
        else _found(L3_CACHE, f"{len(caches)} L3 cache(s) of {caches[0].ways} ways")
    )
    zones = read_rapl_zones(fs)
    findings.append(
        _missing(RAPL, zones)
        if isinstance(zones, Unsupported)
        else _found(RAPL, f"{len(zones)} zones: " + ", ".join(z.name for z in zones))
    )
    freq = read_cpufreq(fs)
    if isinstance(freq, Unsupported):
        findings.append(_missing(CPUFREQ, freq))
    else:
        low, high = min(f.cpuinfo_min_khz for f in freq), max(f.cpuinfo_max_khz for f in freq)
        findings.append(_found(CPUFREQ, f"{freq[0].driver}, {low // 1000}-{high // 1000} MHz"))
    cgroups = read_cgroups(fs)
    if isinstance(cgroups, Unsupported):
        findings.append(_missing(CGROUP, cgroups))
    else:
        driver = f"driver {cgroups.driver}" if isinstance(cgroups.driver, str) else cgroups.driver.reason
        findings.append(_found(CGROUP, f"v{cgroups.version}, {driver}"))
    return findings


def _probe_kubelet_config(fs: HostFS, settings: AgentSettings) -> list[Finding]:
    config = read_kubelet_config(fs, settings.kubelet_config)
    if isinstance(config, Unsupported):
        return [_missing(CPU_MANAGER_POLICY, config), _missing(TOPOLOGY_MANAGER_POLICY, config)]
    cpu = (
        _found(CPU_MANAGER_POLICY, "static")
        if config.cpu_manager_policy == "static"
        else _missing(
            CPU_MANAGER_POLICY,
            f"cpuManagerPolicy is {config.cpu_manager_policy!r}: pods get no exclusive "
            "CPUs, so cache can only be allocated to explicit core lists",
        )
    )
    topo = _found(
        TOPOLOGY_MANAGER_POLICY,
        topology_manager_detail(config.topology_manager_policy, config.topology_manager_scope),
    )
    return [cpu, topo]


def pod_lookup_finding(api: LookupApi) -> Finding:
    """The `podResourcesGet` finding: which PodResources API pod lookups (GetContainerCpus) use."""
    if api.get is None:
        return _missing(POD_RESOURCES_GET, "not known yet: the kubelet has not answered a Get")
    if api.get:
        return _found(POD_RESOURCES_GET, "pod lookups use Get")
    return _missing(
        POD_RESOURCES_GET,
        f"pod lookups use {api.describe()}: the kubelet feature gate KubeletPodResourcesGet is off (on by "
        "default from Kubernetes 1.34), or the kubelet predates Get (1.27); List works too, it answers with "
        "every pod",
    )


async def _probe_pod_resources(settings: AgentSettings, lookup: PodLookup | None) -> list[Finding]:
    socket = settings.host_path(settings.pod_resources_socket)
    if not socket.exists():
        why = (
            f"{socket} does not exist (no kubelet on this node, or its pod-resources directory is not "
            "mounted)"
        )
        return [_missing(POD_RESOURCES, why), _missing(POD_RESOURCES_GET, f"not checked: {why}")]
    if lookup is not None:  # the running agent's, over its one PodResources client
        return await _probe_listing(socket, lookup.client, lookup)
    async with pod_resources_client(settings) as client:
        return await _probe_listing(socket, client, None)


async def _probe_listing(socket: Path, client: PodResourcesClient, lookup: PodLookup | None) -> list[Finding]:
    try:
        pods = await client.list()
    except AgentError as exc:
        return [_missing(POD_RESOURCES, str(exc)), _missing(POD_RESOURCES_GET, f"not checked: {exc}")]
    listed = _found(POD_RESOURCES, f"{socket}: {len(pods)} pod(s) listed")
    return [listed, await _probe_get(client, lookup, pods)]


async def _probe_get(
    client: PodResourcesClient, lookup: PodLookup | None, pods: list[PodResources]
) -> Finding:
    """What `lookup` (the engine's) knows; asking the kubelet only when it does not know yet."""
    if lookup is not None and lookup.api.get is not None:
        return pod_lookup_finding(lookup.api)
    try:
        api = await (lookup or PodLookup(client)).check(pods)
    except AgentError as exc:
        return _missing(POD_RESOURCES_GET, f"not checked: {exc}")
    return pod_lookup_finding(api)


async def probe_async(settings: AgentSettings, lookup: PodLookup | None = None) -> ProbeReport:
    """The findings. `lookup` is the running agent's: its client is used and its knowledge of Get reported
    (and only checked with the kubelet while it has none); without it, the probe opens a client of its own."""
    fs = HostFS(settings.host_root)
    findings = [
        *_probe_rdt(fs),
        *_probe_hardware(fs),
        *_probe_kubelet_config(fs, settings),
        *await _probe_pod_resources(settings, lookup),
    ]
    return ProbeReport(settings.node_name, str(Path(settings.host_root)), tuple(findings))


def probe(settings: AgentSettings) -> ProbeReport:
    return asyncio.run(probe_async(settings))


def format_table(report: ProbeReport) -> str:
    width = max(len(f.feature) for f in report.findings)
    lines = [f"node {report.node_name or '(unnamed)'}, host root {report.host_root}"]
    lines += [
        f"  {f.feature:<{width}}  {'yes' if f.supported else 'NO '}  {f.detail}" for f in report.findings
    ]
    return "\n".join(lines)
