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

The engine enforces; it hands the rest to its parts: P-state monitors to `PStateSync` (rmd_agent.pstate.sync),
container CPUs to `ContainerCpuLookup` (rmd_agent.kubelet.container_cpus), capabilities to
`NodeCapabilities` (rmd_agent.capabilities).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rmd_agent.act.resctrl_apply import ResctrlApplier, ResctrlWriteError
from rmd_agent.capabilities import NodeCapabilities
from rmd_agent.engine_api import (
    AppliedWorkload,
    CacheDomainSummary,
    ChangeListener,
    ContainerCpus,
    EngineUnavailable,
    NodeSummary,
)
from rmd_agent.errors import HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.kubelet.container_cpus import ContainerCpuLookup
from rmd_agent.kubelet.pod_lookup import PodLookup
from rmd_agent.kubelet.podresources import PodResourcesClient, pod_resources_client
from rmd_agent.observe.caches import L3Cache, read_l3_caches
from rmd_agent.observe.cpus import read_online_cpus
from rmd_agent.observe.numa import read_numa_nodes
from rmd_agent.observe.resctrl import RESCTRL, ResctrlState, read_resctrl
from rmd_agent.plan.allocation import free_ways, workload_allocation
from rmd_agent.plan.inventory import NodeInventory, PoolConfig
from rmd_agent.plan.mba import mba_applied
from rmd_agent.plan.policy import PolicyBook, platform_from_cpuinfo
from rmd_agent.plan.pstate_request import check_pstate_request
from rmd_agent.plan.registry_plan import plan_registry
from rmd_agent.plan.resctrl_layout import Layout, Operation
from rmd_agent.plan.workload import Workload, WorkloadRejected
from rmd_agent.pstate.counters import CounterSource, counter_source
from rmd_agent.pstate.plugin import DEFAULT_INTERVAL_S, PStateController
from rmd_agent.pstate.policy import FreqLimits
from rmd_agent.pstate.sync import PStateSync
from rmd_agent.settings import AgentSettings, load_policy_file
from rmd_agent.state_store import AgentState, StateStore, WorkloadRecord

log = logging.getLogger(__name__)

StepHook = Callable[[str], None]
_T = TypeVar("_T")

RDT_CPU_FLAGS = frozenset({"rdt_a", "cat_l3"})
# The capability probe (sysfs of every CPU, a PodResources List, the kubelet's configuration) is the dearest
# read of the node summary and its findings hardly change while the agent runs: probed again at most this
# often, and when readiness turns (resctrl mounted or unmounted).
CAPABILITIES_TTL_S = 300.0
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


async def _finish_then_cancel(step: Coroutine[Any, Any, _T]) -> _T:
    """Await `step` to its end even when the caller is cancelled meanwhile; then pass the cancellation on."""
    task = asyncio.ensure_future(step)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


@dataclass(frozen=True)
class _Converged:
    state: AgentState
    layout: Layout
    rejected: Mapping[str, WorkloadRejected]
    writes: int


class NodeEngine:
    """The Engine of one node, built complete: it reads the node's CPUs and caches and the policy file (so
    HostReadError and ConfigError come from here). `start()` before use, `close()` at the end (it restores
    cpufreq limits; resctrl groups stay, and the next start adopts them). `pods` is the agent's PodResources
    client, opened and closed by its owner; without one the engine opens its own. The other keywords are
    for tests and benchmarks; `step_hook` is called after each state save ("save") and kernel write
    ("write <op>").
    """

    def __init__(
        self,
        settings: AgentSettings,
        *,
        pods: PodResourcesClient | None = None,
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
        self.facts = read_node_facts(self.fs)
        if policies is None:
            policies = load_policy_file(Path(settings.policy_file) if settings.policy_file else None)
        self.pools = pools or PoolConfig()
        self._policies = policies.for_platform(self.facts.platform)
        if counters is None:
            counters = counter_source(settings.pstate_counters, self.fs)
        controller = PStateController(self.fs, counters, interval=pstate_interval)
        self.pstate = PStateSync(controller, self._save_originals)
        self._owns_pods = pods is None
        self.pods = pods or pod_resources_client(settings)
        lookup = PodLookup(self.pods)  # Get, or List where the kubelet has no Get
        self.containers = ContainerCpuLookup(lookup, self.fs, settings.kubelet_dir)
        self.capabilities = NodeCapabilities(settings, lookup, ttl=CAPABILITIES_TTL_S)
        self._step_hook = step_hook
        self._lock = asyncio.Lock()
        self._started = False
        self._closed = False
        self._reconciled = False
        self._not_ready = "starting: reconciling with the node"
        self._state = AgentState()
        self._layout: Layout | None = None  # None until the first change planned one
        self._rejected: Mapping[str, WorkloadRejected] = {}
        self._listeners: list[ChangeListener] = []
        self._readiness: tuple[bool, str] | None = None  # ready()'s last answer, to tell when it turns

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the registry and reconcile the node with it. StateError (unusable state file) and ConfigError
        (pool sizes) stop the start; an unmounted or busy resctrl does not: ready() reports it and the
        reconcile is retried."""
        async with self._lock:
            if self._started or self._closed:
                raise RuntimeError("NodeEngine.start() may be called once")
            self._state = await asyncio.to_thread(self.store.load)
            if self._owns_pods:
                await self.pods.__aenter__()
            try:
                await self.pstate.restore(self._state.pstate_originals)
                await self.capabilities.refresh()
                self._started = True
                with contextlib.suppress(EngineUnavailable):
                    await self._try_reconcile()
                    self._readiness = (True, "")  # what ready() answers now, as the probe above saw it
            except BaseException:
                self._started = False
                await self.pstate.close()
                if self._owns_pods:
                    await self.pods.close()
                raise
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
            await self.pstate.close()
            if self._owns_pods:
                await self.pods.close()

    # -- the Engine protocol ---------------------------------------------------------------------------------

    async def apply(self, workload: Workload) -> tuple[AppliedWorkload, bool]:
        async with self._lock:
            await self._ensure_reconciled()
            old = self._state.find(workload.key)
            before = self.pstate.params(workload.key)
            result = await self._change(self._state.with_request(workload), workload.key)
            record = self._state.find(workload.key)
            assert record is not None  # _change raised unless the workload was accepted
            changed = old != record or result.writes > 0 or self.pstate.params(workload.key) != before
            if changed:
                log.info("applied %s (%d resctrl write(s))", workload.key, result.writes)
                self._changed()
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
            self._changed()
            return True

    async def list(self) -> list[AppliedWorkload]:
        self._require_started()
        return [self._applied(r) for r in self._state.workloads]

    async def node(self) -> NodeSummary:
        self._require_started()
        capabilities = await self.capabilities.current()
        resctrl, inventory, caches = await self._caches()
        return NodeSummary(
            node_name=self.settings.node_name,
            capabilities=capabilities,
            cpus=len(self.facts.cpus),
            numa_nodes=self.facts.numa_nodes,
            caches=caches,
            closids_total=inventory.num_closids,
            closids_used=0 if resctrl is None else 1 + len(resctrl.groups),
            workloads=len(self._state.workloads),
        )

    async def node_capabilities(self) -> dict[str, tuple[bool, str]]:
        """The capabilities of node() without reading resctrl: what the RmdNodeState publishes."""
        self._require_started()
        return await self.capabilities.current()

    async def cache_domains(self) -> tuple[CacheDomainSummary, ...]:
        """The caches of node() without the capabilities, whose probe is most of node()'s cost: what the
        NodeResourceTopology's cache ways need."""
        self._require_started()
        return (await self._caches())[2]

    async def _caches(self) -> tuple[ResctrlState | None, NodeInventory, tuple[CacheDomainSummary, ...]]:
        current = await asyncio.to_thread(read_resctrl, self.fs)
        resctrl = None if isinstance(current, Unsupported) else current
        inventory = self._inventory(resctrl)
        caches = tuple(
            CacheDomainSummary(
                cache.id,
                cache.cpus,
                inventory.l3.ways if inventory.l3 is not None else cache.ways,
                free_ways(self._layout, inventory, cache.id) if self._layout is not None else {},
            )
            for cache in self.facts.caches
        )
        return resctrl, inventory, caches

    async def container_cpus(self, namespace: str, pod: str, uid: str, container: str) -> ContainerCpus:
        self._require_started()
        return await self.containers.container_cpus(namespace, pod, uid, container)

    async def ready(self) -> tuple[bool, str]:
        answer = await self._ready()
        if answer != self._readiness:
            self.capabilities.expire()
            self._readiness = answer
            self._changed()
        return answer

    async def _ready(self) -> tuple[bool, str]:
        if self._closed:
            return False, "closed"
        if not self._started:
            return False, self._not_ready
        mounted = await asyncio.to_thread(self.fs.is_dir, f"{RESCTRL}/info")
        if self.facts.rdt_capable and not mounted:
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
            log.error("workload %s from the registry cannot be enforced: %s", key, rejection.detail)
        self._reconciled = True
        self._not_ready = ""
        self._changed()  # the layout, so the free ways, exists from here on

    async def _change(self, target: AgentState, must_accept: str | None) -> _Converged:
        """Converge and commit as one step that cancelling the caller cannot split: the worker thread
        finishes its kernel writes and its state save whatever happens to the caller (a gRPC call whose
        deadline ran out, an operator that went away), so the in-memory state must follow it; otherwise the
        engine would take its own new group for another tool's."""

        async def step() -> _Converged:
            result = await asyncio.to_thread(self._converge, target, must_accept)
            self._state, self._layout, self._rejected = result.state, result.layout, result.rejected
            await self.pstate.follow(result.layout.accepted, self._state.pstate_originals)
            return result

        return await _finish_then_cancel(step())

    def _converge(self, target: AgentState, must_accept: str | None) -> _Converged:
        """Make resctrl match `target`'s registry (worker thread). With `must_accept`, that workload's
        refusal is raised before anything is saved or written."""
        with self.applier.locked() if self.fs.is_dir(RESCTRL) else contextlib.nullcontext():
            current = self._observe()
            inventory = self._inventory(current)
            requests = [r.request for r in target.workloads]
            layout, rejected, ops = plan_registry(inventory, requests, target.owned_groups, current)
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
                pstate_originals=self.pstate.originals_for(layout.accepted, target.pstate_originals),
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

    def _observe(self) -> ResctrlState | None:
        state = read_resctrl(self.fs)
        if isinstance(state, Unsupported):
            if self.facts.rdt_capable:
                raise EngineUnavailable(state.reason)
            return None
        return state

    def _inventory(self, current: ResctrlState | None) -> NodeInventory:
        return NodeInventory.from_observed(
            self.facts.cpus,
            self.facts.caches,
            current if current is not None else Unsupported("resctrl is not available"),
            pools=self.pools,
            platform=self.facts.platform,
            policies=self._policies,
        )

    # -- results ---------------------------------------------------------------------------------------------

    def _applied(self, record: WorkloadRecord) -> AppliedWorkload:
        w = record.resolved or record.request
        failure = self._rejected.get(record.key)
        layout = self._layout
        if failure is not None or layout is None or record.resolved is None:
            status = f"Failed: {failure.message}" if failure is not None else "Pending: not reconciled yet"
            return AppliedWorkload(w, record.id, "", "none", status=status)
        group = layout.group_for(record.key)
        if group is None:  # no cache or MBA part
            return AppliedWorkload(w, record.id, "", "none", pstate=self.pstate.outcome(w), status=STATUS_OK)
        cache, mba = workload_allocation(group, self._inventory(None), w)
        return AppliedWorkload(
            w,
            record.id,
            group.name,
            str(group.pool),
            cache,
            mba,
            self.pstate.outcome(w),
            mba_applied=mba_applied(w, mba, layout.mba),
        )

    # -- hooks -----------------------------------------------------------------------------------------------

    def add_change_listener(self, listener: ChangeListener) -> None:
        """ChangeNotifier: `listener()` after each apply or remove with an effect, each reconcile, and when
        ready()'s answer turns (noticed when someone asks: the gRPC health refresh, the readiness probe)."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # one reader's bug must not fail the change that was made
                log.exception("engine change listener failed")

    async def _save_originals(self, originals: Mapping[int, FreqLimits]) -> None:
        """PStateSync's save: the originals go into the state file with the registry they belong to."""
        if originals != self._state.pstate_originals:
            self._state = dataclasses.replace(self._state, pstate_originals=dict(originals))
            await asyncio.to_thread(self._save, self._state)

    def _save(self, state: AgentState) -> None:
        if self.store.save(state):
            self._step("save")

    def _on_write(self, op: Operation) -> None:
        self._step(f"write {op}")

    def _step(self, what: str) -> None:
        if self._step_hook is not None:
            self._step_hook(what)


def create_engine(settings: AgentSettings, pods: PodResourcesClient) -> NodeEngine:
    """The engine `rmd-agent serve` runs (rmd_agent.server.app), over the agent's PodResources client."""
    return NodeEngine(settings, pods=pods)


__all__ = [
    "NodeEngine",
    "NodeFacts",
    "create_engine",
    "read_node_facts",
]
