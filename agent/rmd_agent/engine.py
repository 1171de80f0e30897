"""The engine: enforces workloads on this node (the `rmd_agent.engine_api.Engine` protocol) and survives
restarts and crashes. Design and crash-safety argument: docs/durability.md.

Every change runs the same sequence, one at a time (an asyncio lock), with the blocking part in a worker
thread under flock on the resctrl mount:

    observe resctrl -> plan the whole registry (plan_layout) -> refuse the request, or
    save the intent (registry + every group about to exist, write-ahead) -> diff -> write (undone on failure)
    -> save the result (owned groups = the planned ones) -> P-state -> save the P-state originals

Start loads the registry and runs that sequence once (reconcile): groups that already match are adopted
without a write, missing ones are made again, owned groups nobody needs are removed. Ownership is the set of
group names in the state file, not the "rmd-" prefix: a group another tool made is never changed, even if
its name starts with "rmd-".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rmd_agent.act.resctrl_apply import ResctrlApplier, ResctrlWriteError
from rmd_agent.engine_api import (
    AppliedWorkload,
    CacheDomainSummary,
    ContainerCpus,
    CpuState,
    EngineUnavailable,
    NodeSummary,
    PstateOutcome,
)
from rmd_agent.errors import AgentError, CheckpointError, HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.checkpoints import read_cpu_manager_state
from rmd_agent.kubelet.pod_lookup import PodLookup
from rmd_agent.kubelet.podresources import PodResourcesClient
from rmd_agent.observe.caches import L3Cache, read_l3_caches
from rmd_agent.observe.cpus import read_online_cpus
from rmd_agent.observe.numa import read_numa_nodes
from rmd_agent.observe.resctrl import RESCTRL, ResctrlState, read_resctrl
from rmd_agent.plan.inventory import NodeInventory, PoolConfig
from rmd_agent.plan.policy import Policy, PolicyBook, platform_from_cpuinfo
from rmd_agent.plan.resctrl_layout import Layout, Operation, diff, plan_layout
from rmd_agent.plan.workload import Pool, RejectReason, Workload, WorkloadRejected
from rmd_agent.probe import pod_lookup_finding, probe_async
from rmd_agent.pstate import (
    CounterSource,
    CpufreqWriteError,
    FileCounters,
    FreqLimits,
    PerfEventCounters,
    PStateController,
    PStateResult,
    PStateState,
)
from rmd_agent.pstate.counters import SIM_PERF_DIR
from rmd_agent.pstate.plugin import DEFAULT_INTERVAL_S
from rmd_agent.settings import AgentSettings, load_policy_file
from rmd_agent.state_store import AgentState, StateStore, WorkloadRecord
from rmd_api.cpuset import CpuListError, format_cpu_list, parse_cpu_list
from rmd_api.kubelet.checkpoint import CpuManagerState

log = logging.getLogger(__name__)

StepHook = Callable[[str], None]

PROBE_TTL_S = 30.0
RDT_CPU_FLAGS = frozenset({"rdt_a", "cat_l3"})
STATUS_OK = "Successful"


@dataclass(frozen=True)
class NodeFacts:
    """What does not change while the agent runs."""

    cpus: frozenset[int]
    caches: tuple[L3Cache, ...]
    numa_nodes: int
    platform: str | None
    rdt_capable: bool  # the CPU can allocate cache (or resctrl is mounted): an unmounted resctrl is an outage


def read_node_facts(fs: HostFS) -> NodeFacts:
    cpus = read_online_cpus(fs)
    if isinstance(cpus, Unsupported):
        raise HostReadError("sys/devices/system/cpu/online", cpus.reason)
    caches = read_l3_caches(fs)
    numa = read_numa_nodes(fs)
    try:
        cpuinfo = fs.read_text("proc/cpuinfo")
    except HostReadError:
        cpuinfo = ""
    flags = next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), [])
    return NodeFacts(
        cpus=cpus,
        caches=() if isinstance(caches, Unsupported) else tuple(caches),
        numa_nodes=0 if isinstance(numa, Unsupported) else len(numa),
        platform=platform_from_cpuinfo(cpuinfo),
        rdt_capable=bool(RDT_CPU_FLAGS & set(flags)) or fs.is_dir(f"{RESCTRL}/info"),
    )


def default_counters(fs: HostFS) -> CounterSource:
    """Branch counters: a simulated node's files when the tree has them, else the kernel's perf events."""
    return FileCounters.for_host(fs) if fs.is_dir(SIM_PERF_DIR) else PerfEventCounters(fs)


def pstate_request(w: Workload) -> tuple[float | None, bool] | None:
    """(ratio, monitoring) when the workload asks for a P-state; monitoring defaults to on, as in RMD."""
    if w.pstate_ratio is None and w.pstate_monitoring is None:
        return None
    return w.pstate_ratio, (w.pstate_monitoring or "on") == "on"


def check_pstate_request(w: Workload) -> None:
    request = pstate_request(w)
    if request is not None and request[1] and request[0] is None:
        raise WorkloadRejected(
            RejectReason.INVALID,
            'P-state monitoring needs a ratio (plugins.pstate.ratio, e.g. "3.0"), or monitoring: "off"',
            w.key,
        )


def cross_check_cpus(state: CpuManagerState, uid: str, container: str, cpus: frozenset[int]) -> str | None:
    """Why the kubelet's checkpoint disagrees that pod `uid`'s `container` holds `cpus`; None if it agrees
    (or cannot tell: a v1 checkpoint is keyed by container ID, which only the kubelet can map)."""
    if not state.entries:
        return None
    recorded = state.entries.get(uid, {}).get(container)
    if recorded is None:
        holders = sorted(
            u
            for u, containers in state.entries.items()
            for text in containers.values()
            if _parse_or_empty(text) & cpus
        )
        where = f"; CPUs {format_cpu_list(cpus)} belong to pod uid {holders[0]} there" if holders else ""
        return f"cpu_manager_state has no CPUs for pod uid {uid} container {container}{where}"
    if _parse_or_empty(recorded) != cpus:
        return (
            f"PodResources reports CPUs {format_cpu_list(cpus)} but cpu_manager_state records {recorded} for "
            f"pod uid {uid} container {container}"
        )
    return None


def _parse_or_empty(text: str) -> frozenset[int]:
    try:
        return parse_cpu_list(text)
    except CpuListError:
        return frozenset()


@dataclass(frozen=True)
class _Converged:
    state: AgentState
    layout: Layout
    rejected: Mapping[str, WorkloadRejected]
    writes: int


class NodeEngine:
    """The Engine of one node. `start()` before use, `close()` at the end (it restores cpufreq limits; resctrl
    groups stay, and the next start adopts them).

    Keyword arguments exist for tests and benchmarks: pool sizes, policies and counters default to the
    settings / the node; `step_hook` is called after each state save ("save") and kernel operation
    ("write <op>") and is None in production.
    """

    def __init__(
        self,
        settings: AgentSettings,
        *,
        pools: PoolConfig | None = None,
        policies: PolicyBook | None = None,
        counters: CounterSource | None = None,
        pstate_interval: float = DEFAULT_INTERVAL_S,
        step_hook: StepHook | None = None,
        lock_timeout: float = 10.0,
    ) -> None:
        self.settings = settings
        self.fs = HostFS(settings.host_root)
        self.store = StateStore(settings.host_path(settings.state_path))
        self.applier = ResctrlApplier(
            self.fs.path(RESCTRL), on_write=self._on_write, lock_timeout=lock_timeout
        )
        self.pools = pools or PoolConfig()
        self._book = policies
        self._counters = counters
        self._pstate_interval = pstate_interval
        self._step_hook = step_hook
        self._lock = asyncio.Lock()
        self._started = False
        self._closed = False
        self._reconciled = False
        self._not_ready = "starting: reconciling with the node"
        self._facts: NodeFacts | None = None
        self._policies: Mapping[str, Policy] = {}
        self._state = AgentState()
        self._layout: Layout | None = None
        self._rejected: Mapping[str, WorkloadRejected] = {}
        self._pstate: PStateController | None = None
        self._pstate_params: dict[str, tuple[frozenset[int], float, bool] | None] = {}
        self._pods: PodResourcesClient | None = None
        self._lookup: PodLookup | None = None  # over _pods: Get, or List where the kubelet has no Get
        self._probe: tuple[float, dict[str, tuple[bool, str]]] | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the registry and reconcile the node with it. StateError (unusable state file), ConfigError
        (policy file, pool sizes) and HostReadError (no CPU list) stop the start; an unmounted or busy resctrl
        does not: ready() reports it and the reconcile is retried."""
        async with self._lock:
            if self._started or self._closed:
                raise RuntimeError("NodeEngine.start() may be called once")
            self._state = await asyncio.to_thread(self.store.load)
            facts = self._facts = await asyncio.to_thread(read_node_facts, self.fs)
            book = self._book
            if book is None:
                path = Path(self.settings.policy_file) if self.settings.policy_file else None
                book = await asyncio.to_thread(load_policy_file, path)
            self._policies = book.for_platform(facts.platform)
            counters = self._counters
            if counters is None:
                counters = await asyncio.to_thread(default_counters, self.fs)
            self._pstate = PStateController(self.fs, counters, interval=self._pstate_interval)
            self._pods = PodResourcesClient(
                self.settings.host_path(self.settings.pod_resources_socket),
                timeout=self.settings.kubelet_timeout_seconds,
            )
            await self._pods.__aenter__()
            self._lookup = PodLookup(self._pods)
            try:
                await self._start_locked()
            except BaseException:
                self._started = False
                with contextlib.suppress(CpufreqWriteError):
                    await self._pstate.close()
                await self._pods.close()
                raise

    async def _start_locked(self) -> None:
        await self._restore_frequencies()
        await self._refresh_probe(force=True)
        self._started = True
        with contextlib.suppress(EngineUnavailable):
            await self._try_reconcile()
        log.info(
            "engine started: %d workload(s) in %s, %s",
            len(self._state.workloads),
            self.store.path,
            "reconciled" if self._reconciled else f"not reconciled ({self._not_ready})",
        )

    async def close(self) -> None:
        """Stop P-state monitors and write back every frequency limit; resctrl groups stay as they are."""
        async with self._lock:
            if self._closed:
                return
            self._closed, self._started = True, False
            if self._pstate is not None:
                try:
                    await self._pstate.close()
                except CpufreqWriteError as exc:
                    log.error("restoring frequency limits on close: %s", exc)
                await self._save_originals()
            if self._pods is not None:
                await self._pods.close()

    # -- the Engine protocol ---------------------------------------------------------------------------------

    async def apply(self, workload: Workload) -> tuple[AppliedWorkload, bool]:
        async with self._lock:
            await self._ensure_reconciled()
            old = self._state.find(workload.key)
            target = self._state
            if old is None or old.request != workload:
                same_object = old is not None and old.request.uid == workload.uid
                record_id = old.id if old is not None and same_object else str(target.next_id)
                resolved = old.resolved if old is not None and same_object else None
                target = target.with_record(WorkloadRecord(record_id, workload, resolved))
                if old is None or not same_object:
                    target = dataclasses.replace(target, next_id=target.next_id + 1)
            before = self._pstate_params.get(workload.key)
            result = await self._change(target, workload.key)
            record = self._state.find(workload.key)
            assert record is not None
            changed = old != record or result.writes > 0 or self._pstate_params.get(workload.key) != before
            if changed:
                log.info("applied %s (%d resctrl write(s))", workload.key, result.writes)
            return self._applied(record), changed

    async def remove(self, namespace: str, name: str, uid: str = "") -> bool:
        key = f"{namespace}/{name}"
        async with self._lock:
            await self._ensure_reconciled()
            record = self._state.find(key)
            if record is None or (uid and record.request.uid and record.request.uid != uid):
                return False
            result = await self._change(self._state.without(key), None)
            log.info("removed %s (%d resctrl write(s))", key, result.writes)
            return True

    async def list(self) -> list[AppliedWorkload]:
        self._require_started()
        return [self._applied(r) for r in self._state.workloads]

    async def node(self) -> NodeSummary:
        self._require_started()
        facts = self._facts
        assert facts is not None
        await self._refresh_probe()
        current = await asyncio.to_thread(read_resctrl, self.fs)
        resctrl = None if isinstance(current, Unsupported) else current
        inventory = self._inventory(resctrl)
        layout = self._layout
        caches = []
        for cache in facts.caches:
            free: dict[str, int] = {}
            if layout is not None and layout.regions is not None:
                held_min = sum(
                    w.cache_min or 0
                    for w in layout.accepted
                    if w.pool is Pool.BEST_EFFORT and cache.id in inventory.domains_of(w.core_ids)
                )
                free = {
                    str(Pool.GUARANTEED): layout.free_guaranteed.get(cache.id, 0),
                    str(Pool.BEST_EFFORT): max(0, layout.regions.besteffort.bit_count() - held_min),
                    str(Pool.SHARED): layout.regions.shared.bit_count(),
                }
            ways = inventory.l3.ways if inventory.l3 is not None else cache.ways
            caches.append(CacheDomainSummary(cache.id, cache.cpus, ways, free))
        assert self._probe is not None
        capabilities = dict(self._probe[1])
        if self._lookup is not None and self._lookup.api.get is not None:
            # What pod lookups use now, not as of the last probe (up to PROBE_TTL_S ago).
            lookup = pod_lookup_finding(self._lookup.api)
            capabilities[lookup.feature] = (lookup.supported, lookup.detail)
        return NodeSummary(
            node_name=self.settings.node_name,
            capabilities=capabilities,
            cpus=len(facts.cpus),
            numa_nodes=facts.numa_nodes,
            caches=tuple(caches),
            closids_total=inventory.num_closids,
            closids_used=0 if resctrl is None else 1 + len(resctrl.groups),
            workloads=len(self._state.workloads),
        )

    async def container_cpus(self, namespace: str, pod: str, uid: str, container: str) -> ContainerCpus:
        self._require_started()
        assert self._lookup is not None
        found = await self._lookup.find(namespace, pod)
        if found is None:
            api = self._lookup.api
            via = f" (PodResources {api.describe()})" if api.get is False else ""
            return ContainerCpus(
                CpuState.NOT_YET_ALLOCATED, detail=f"the kubelet has no pod {namespace}/{pod}{via}"
            )
        entry = next((c for c in found.containers if c.name == container), None)
        if entry is None:
            return ContainerCpus(
                CpuState.NOT_YET_ALLOCATED,
                detail=f"the kubelet lists no container {container!r} in pod {namespace}/{pod} (yet)",
            )
        if not entry.cpu_ids:
            return ContainerCpus(
                CpuState.NOT_EXCLUSIVE,
                detail=f"container {container!r} of pod {namespace}/{pod} has no exclusive CPUs (it needs a "
                "Guaranteed pod with integer CPUs and the static CPU manager policy)",
            )
        if uid:
            problem = await asyncio.to_thread(self._cross_check, uid, container, entry.cpu_ids)
            if problem:
                return ContainerCpus(CpuState.NOT_YET_ALLOCATED, detail=problem)
        return ContainerCpus(CpuState.ALLOCATED, entry.cpu_ids)

    async def ready(self) -> tuple[bool, str]:
        if self._closed:
            return False, "closed"
        if not self._started:
            return False, self._not_ready
        facts = self._facts
        assert facts is not None
        mounted = await asyncio.to_thread(self.fs.is_dir, f"{RESCTRL}/info")
        if facts.rdt_capable and not mounted:
            return False, f"the CPU supports RDT but resctrl is not mounted at /{RESCTRL}"
        if not self._reconciled:
            async with self._lock:
                try:
                    await self._try_reconcile()
                except EngineUnavailable as exc:
                    return False, str(exc)
        return True, ""

    # -- convergence -----------------------------------------------------------------------------------------

    def _require_started(self) -> None:
        if self._closed:
            raise EngineUnavailable("the engine is shut down")
        if not self._started:
            raise EngineUnavailable("the engine is still starting")

    async def _ensure_reconciled(self) -> None:
        self._require_started()
        if not self._reconciled:
            await self._try_reconcile()

    async def _try_reconcile(self) -> None:
        """Make the node match the registry. EngineUnavailable (remembered for ready()) if it cannot now."""
        try:
            result = await self._change(self._state, None)
        except (EngineUnavailable, ResctrlWriteError) as exc:  # ResctrlBusy is an EngineUnavailable
            self._not_ready = f"cannot reconcile resctrl with the registry: {exc}"
            log.warning("%s", self._not_ready)
            raise EngineUnavailable(self._not_ready) from exc
        for key, rejection in result.rejected.items():
            log.error("workload %s from the registry cannot be enforced: %s", key, rejection)
        self._reconciled = True
        self._not_ready = ""

    async def _change(self, target: AgentState, must_accept: str | None) -> _Converged:
        """Converge and commit as one step that cancelling the caller cannot split.

        The worker thread finishes its kernel writes and its state save whatever happens to the caller (a
        gRPC call whose deadline ran out, an operator that went away), so the in-memory state must follow
        it; otherwise the engine would take its own new group for another tool's. A cancellation is passed
        on once the step is done."""

        async def step() -> _Converged:
            result = await asyncio.to_thread(self._converge, target, must_accept)
            await self._commit(result)
            return result

        task = asyncio.ensure_future(step())
        cancelled = False
        while True:
            try:
                result = await asyncio.shield(task)
                break
            except asyncio.CancelledError:
                if task.cancelled():
                    raise
                cancelled = True  # wait for the step, then pass the cancellation on
        if cancelled:
            raise asyncio.CancelledError
        return result

    def _converge(self, target: AgentState, must_accept: str | None) -> _Converged:
        """Make resctrl match `target`'s registry (worker thread). With `must_accept`, that workload's
        refusal is raised before anything is saved or written."""
        with self._resctrl_lock():
            current = self._observe()
            inventory = self._inventory(current)
            layout, rejected, ops = self._plan(inventory, target, current)
            if must_accept is not None:
                if must_accept in rejected:
                    raise rejected[must_accept]
                check_pstate_request(next(w for w in layout.accepted if w.key == must_accept))
            accepted = {w.key: w for w in layout.accepted}
            planned = frozenset(g.name for g in layout.groups)
            intent = dataclasses.replace(
                target,
                workloads=tuple(
                    dataclasses.replace(r, resolved=accepted.get(r.key)) for r in target.workloads
                ),
                owned_groups=target.owned_groups | planned,
                pstate_originals=self._originals_for(layout.accepted, target.pstate_originals),
            )
            self._save(intent)  # write-ahead: a crash from here on converges to `intent` on restart
            try:
                writes = self.applier.apply(ops, current, intent.owned_groups.__contains__) if ops else 0
            except Exception:
                # The kernel is back as it was (ResctrlWriteError undid the writes; ValueError refused before
                # the first), so the registry goes back too; groups stay owned in case an undo failed.
                self._save(dataclasses.replace(self._state, owned_groups=intent.owned_groups))
                raise
            final = dataclasses.replace(intent, owned_groups=planned) if current is not None else intent
            self._save(final)
        return _Converged(final, layout, rejected, writes)

    @contextlib.contextmanager
    def _resctrl_lock(self) -> Iterator[None]:
        if self.fs.is_dir(RESCTRL):
            with self.applier.locked():
                yield
        else:
            yield

    def _observe(self) -> ResctrlState | None:
        state = read_resctrl(self.fs)
        if isinstance(state, Unsupported):
            assert self._facts is not None
            if self._facts.rdt_capable:
                raise EngineUnavailable(state.reason)
            return None
        return state

    def _inventory(self, current: ResctrlState | None) -> NodeInventory:
        facts = self._facts
        assert facts is not None
        return NodeInventory.from_observed(
            facts.cpus,
            facts.caches,
            current if current is not None else Unsupported("resctrl is not available"),
            pools=self.pools,
            platform=facts.platform,
            policies=self._policies,
        )

    def _plan(
        self, inventory: NodeInventory, target: AgentState, current: ResctrlState | None
    ) -> tuple[Layout, dict[str, WorkloadRejected], Sequence[Operation]]:
        registered = target.owned_groups.__contains__
        foreign = {g.name for g in current.groups if not registered(g.name)} if current else set()
        excluded: dict[str, WorkloadRejected] = {}
        while True:
            workloads = [r.request for r in target.workloads if r.key not in excluded]
            layout = plan_layout(inventory, workloads, current, owned=registered)
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
        ours = target.owned_groups | {g.name for g in layout.groups}
        return layout, rejected, diff(current, layout, owned=ours.__contains__)

    def _originals_for(
        self, accepted: Sequence[Workload], saved: Mapping[int, FreqLimits]
    ) -> dict[int, FreqLimits]:
        """The saved original cpufreq limits plus those of CPUs about to get a P-state monitor, read now,
        before the monitor's first write (write-ahead, so a restart restores the true originals)."""
        originals = dict(saved)
        if self._pstate is None:
            return originals
        for w in accepted:
            request = pstate_request(w)
            if request is None or not request[1]:
                continue
            for cpu in sorted(w.core_ids - originals.keys()):
                with contextlib.suppress(HostReadError):  # no cpufreq: the monitor writes nothing
                    originals[cpu] = self._pstate.control.read_limits(cpu)
        return originals

    async def _commit(self, result: _Converged) -> None:
        self._state, self._layout, self._rejected = result.state, result.layout, result.rejected
        await self._sync_pstate()

    # -- P-state ---------------------------------------------------------------------------------------------

    async def _restore_frequencies(self) -> None:
        """Write back limits a previous run left changed (it may have died with a core pinned)."""
        assert self._pstate is not None
        control = self._pstate.control
        control.adopt_originals(self._state.pstate_originals)
        try:
            await asyncio.to_thread(control.restore_all)
        except CpufreqWriteError as exc:
            log.error("restoring the frequency limits a previous run changed: %s", exc)
        await self._save_originals()

    async def _sync_pstate(self) -> None:
        """Start, change or stop P-state monitors to match the enforced workloads, then save the originals."""
        controller = self._pstate
        if controller is None or self._layout is None:
            return
        controller.control.adopt_originals(self._state.pstate_originals)
        wanted: dict[str, tuple[frozenset[int], float, bool] | None] = {}
        for w in self._layout.accepted:
            request = pstate_request(w)
            if request is not None:
                ratio, monitoring = request
                wanted[w.key] = (w.core_ids, ratio, True) if monitoring and ratio is not None else None
        for key, params in list(self._pstate_params.items()):
            if wanted.get(key, ()) != params:
                try:
                    await controller.remove(key)
                except CpufreqWriteError as exc:
                    log.error("P-state of %s: %s", key, exc)
                del self._pstate_params[key]
        for key, params in wanted.items():
            if key in self._pstate_params:
                continue
            if params is not None:
                try:
                    await controller.apply(key, *params)
                except AgentError as exc:  # e.g. PStateConflict; the cache part stays enforced
                    log.error("P-state of %s: %s", key, exc)
            self._pstate_params[key] = params
        monitored = frozenset().union(
            *(p[0] for k, p in self._pstate_params.items() if p and controller.monitor(k))
        )
        idle = set(controller.control.originals) - monitored
        if idle:  # read ahead for a monitor that did not start, or left over: nothing to keep
            try:
                await asyncio.to_thread(controller.control.restore, idle)
            except CpufreqWriteError as exc:
                log.error("restoring frequency limits: %s", exc)
        await self._save_originals()

    async def _save_originals(self) -> None:
        assert self._pstate is not None
        originals = self._pstate.control.originals
        if originals != self._state.pstate_originals:
            self._state = dataclasses.replace(self._state, pstate_originals=dict(originals))
            await asyncio.to_thread(self._save, self._state)

    def _pstate_outcome(self, w: Workload) -> PstateOutcome | None:
        request = pstate_request(w)
        if request is None:
            return None
        result = self._pstate.results.get(w.key) if self._pstate is not None else None
        if result is None:
            result = PStateResult(PStateState.OFF)
        return PstateOutcome(result.state is not PStateState.UNSUPPORTED, result.reason or result.status)

    # -- results ---------------------------------------------------------------------------------------------

    def _applied(self, record: WorkloadRecord) -> AppliedWorkload:
        w = record.resolved or record.request
        failure = self._rejected.get(record.key)
        layout = self._layout
        if failure is not None or layout is None or record.resolved is None:
            status = f"Failed: {failure.message}" if failure is not None else "Pending: not reconciled yet"
            return AppliedWorkload(w, record.id, "", "none", status=status)
        group = layout.group_for(record.key)
        cache: dict[int, int] = {}
        mba: dict[int, int] = {}
        if group is not None:
            inventory = self._inventory(None)
            domains = inventory.domains_of(w.core_ids)
            resources = [r for r in group.schemata if r != "MB"]
            if resources:
                values = group.schemata[resources[-1]]
                cache = {d: int(values[d], 16) for d in sorted(domains) if d in values}
            if w.mba is not None and "MB" in group.schemata:
                mba = {d: int(v) for d, v in group.schemata["MB"].items() if d in domains}
        return AppliedWorkload(
            workload=w,
            id=record.id,
            cos_name=group.name if group is not None else "",
            pool=str(group.pool) if group is not None else "none",
            cache=cache,
            mba=mba,
            pstate=self._pstate_outcome(w),
            status=STATUS_OK,
        )

    def _cross_check(self, uid: str, container: str, cpus: frozenset[int]) -> str | None:
        try:
            checkpoint = read_cpu_manager_state(self.fs, self.settings.kubelet_dir)
        except (CheckpointError, HostReadError) as exc:
            log.warning("cpu_manager_state is unusable, relying on PodResources alone: %s", exc)
            return None
        if isinstance(checkpoint, Unsupported):
            return None
        return cross_check_cpus(checkpoint, uid, container, cpus)

    async def _refresh_probe(self, force: bool = False) -> None:
        if not force and self._probe is not None and time.monotonic() - self._probe[0] < PROBE_TTL_S:
            return
        report = await probe_async(self.settings, lookup=self._lookup)
        self._probe = (time.monotonic(), {f.feature: (f.supported, f.detail) for f in report.findings})

    # -- hooks -----------------------------------------------------------------------------------------------

    def _save(self, state: AgentState) -> None:
        if self.store.save(state):
            self._step("save")

    def _on_write(self, op: Operation) -> None:
        self._step(f"write {op}")

    def _step(self, what: str) -> None:
        if self._step_hook is not None:
            self._step_hook(what)


def create_engine(settings: AgentSettings) -> NodeEngine:
    """The engine `rmd-agent serve` runs (rmd_agent.server.app)."""
    return NodeEngine(settings)


__all__ = [
    "NodeEngine",
    "NodeFacts",
    "create_engine",
    "cross_check_cpus",
    "read_node_facts",
]
