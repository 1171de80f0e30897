"""The RmdConfig controller's loop (docs/install.md "Deployed by an RmdConfig"): on a change of the RmdConfig
or of the ServiceMonitor CRD, and on a timer, plan the agents' objects (rmdconfig_plan.py), apply them, read
back the DaemonSet, its pods, the nodes and their RmdNodeStates, and write the status (rmdconfig_status.py).

One task runs the passes, one at a time. The timer is short (5 s) while agents roll out or something failed
and `resync` otherwise: nothing watches the DaemonSet or its pods (the operator may only read them by name and
label), and a ServiceMonitor CRD installed later is found by the CRD's watch event or, at the latest, by the
next resync. Deleting the RmdConfig needs nothing here: its objects carry its controller owner reference, so
the garbage collector removes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from rmd_api.kube_time import now_time
from rmd_operator.node_config_api import WriteError
from rmd_operator.rmdconfig_plan import (
    SERVICE_MONITOR_CRD,
    Extra,
    ObjectRef,
    Plan,
    PlanError,
    no_extra,
    parse_base,
    plan,
    stale,
)
from rmd_operator.rmdconfig_status import Observed, desired_status, events, settled
from rmd_operator.status import EventText

log = logging.getLogger(__name__)
BUSY_SECONDS = 5.0
_T = TypeVar("_T")


class ClusterApi(Protocol):
    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None: ...
    async def crd_exists(self, name: str) -> bool: ...
    async def apply(self, obj: Mapping[str, Any]) -> None: ...
    async def delete(self, ref: ObjectRef) -> None: ...
    async def read_daemonset(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]: ...
    async def node_labels(self) -> dict[str, dict[str, str]]: ...
    async def list_node_states(self, namespace: str) -> list[dict[str, Any]]: ...
    async def patch_status(self, name: str, status: Mapping[str, Any]) -> None: ...


class RmdConfigSync:
    def __init__(
        self,
        api: ClusterApi,
        post_event: Callable[[Mapping[str, Any], EventText], None],
        *,
        namespace: str,
        configmap: str,
        resync: float,
        extra: Extra = no_extra,
        now: Callable[[], str] = now_time,
    ) -> None:
        self._api = api
        self._post = post_event
        self._namespace = namespace
        self._configmap = configmap
        self._resync = resync
        self._extra = extra
        self._now = now
        self._config: dict[str, Any] | None = None
        # The last status written, by uid: fresher than the watch event's until that event arrives, so a pass
        # in between neither writes it again nor repeats its Events. Dropped once an event shows it, so a
        # status someone else changes later is written again.
        self._written: tuple[str, dict[str, Any]] | None = None
        self._wake = asyncio.Event()
        self.passes = 0

    def changed(self, config: Mapping[str, Any] | None) -> None:
        """The RmdConfig as its last watch event showed it (None: deleted)."""
        self._config = dict(config) if config is not None else None
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def health(self) -> dict[str, int]:
        return {"rmdconfig_passes": self.passes}

    async def run(self) -> None:
        """Passes until cancelled."""
        delay: float | None = None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()
            config = self._config
            if config is None:
                delay = None  # nothing to do until an RmdConfig appears
                continue
            try:
                busy = await self.sync(config)
            except Exception:
                log.exception("RmdConfig pass failed")
                busy = True
            delay = BUSY_SECONDS if busy else self._resync

    async def sync(self, config: Mapping[str, Any]) -> bool:
        """One pass; True if the next one should come soon (rolling out, or something failed)."""
        self.passes += 1
        meta = config.get("metadata") or {}
        generation = int(meta.get("generation") or 0)
        uid = str(meta.get("uid") or "")
        previous: Mapping[str, Any] = config.get("status") or {}
        if self._written is not None and self._written[0] == uid:
            if previous == self._written[1]:
                self._written = None  # the watch caught up: from now on its status is the fresher one
            else:
                previous = self._written[1]
        failures: list[str] = []
        unapplied: dict[ObjectRef, str] = {}
        kept: list[ObjectRef] = []
        the_plan: Plan | None = None
        try:
            the_plan = await self._plan(config)
        except (PlanError, WriteError) as exc:
            failures.append(f"ConfigMap {self._namespace}/{self._configmap}: {exc}")
        if the_plan is not None:
            old = stale(previous.get("managedObjects") or [], the_plan)
            # An invalid spec leaves out the objects of the part it cannot honour (the scheduler's): what an
            # earlier pass made for it stays until the spec is fixed, rather than stop a working scheduler.
            if the_plan.spec_error:
                kept, old = old, []
            unapplied, undeleted = await self._write(the_plan, old)
            failures += [*unapplied.values(), *undeleted.values()]
            kept += undeleted
        daemonset: dict[str, Any] | None = None
        pods: list[dict[str, Any]] = []
        nodes: dict[str, dict[str, str]] = {}
        node_states: list[dict[str, Any]] = []
        if the_plan is not None:  # each read on its own: one refused must not blank what the others found
            ns = self._namespace
            ds_name = the_plan.daemonset["metadata"]["name"]
            daemonset = await _read(self._api.read_daemonset(ns, ds_name), None, "DaemonSet", failures)
            pods = await _read(self._api.list_pods(ns, the_plan.pod_labels), [], "pods", failures)
            nodes = await _read(self._api.node_labels(), {}, "Nodes", failures)
            node_states = await _read(self._api.list_node_states(ns), [], "RmdNodeStates", failures)
        seen = Observed(generation, daemonset, pods, nodes, node_states, failures, unapplied, kept, previous)
        status = desired_status(the_plan, seen, self._now())
        if status != previous:
            try:
                await self._api.patch_status(str(meta.get("name")), status)
            except WriteError as exc:
                log.warning("RmdConfig status not written: %s", exc)
                return True
            self._written = (uid, status)
            for event in events(previous, status):
                self._post(config, event)
        return bool(failures) or not settled(status)

    async def _plan(self, config: Mapping[str, Any]) -> Plan:
        data = await self._api.read_configmap(self._namespace, self._configmap)
        if data is None:
            raise PlanError(
                "not found (the chart creates it with agent.deployedBy rmdconfig; the operator's "
                "agent_manifests_configmap setting names it)"
            )
        base = parse_base(data)
        crd = await self._api.crd_exists(SERVICE_MONITOR_CRD)
        return plan(config, base, service_monitor_crd=crd, extra=self._extra)

    async def _write(
        self, the_plan: Plan, stale_refs: Sequence[ObjectRef]
    ) -> tuple[dict[ObjectRef, str], dict[ObjectRef, str]]:
        """Apply the plan, delete its removals and `stale_refs`; the refused applies and deletes, with why."""
        unapplied: dict[ObjectRef, str] = {}
        undeleted: dict[ObjectRef, str] = {}
        for obj in the_plan.apply:
            try:
                await self._api.apply(obj)
            except WriteError as exc:
                unapplied[ObjectRef.of(obj)] = f"{obj['kind']} {obj['metadata']['name']}: {exc}"
        for ref in [*the_plan.remove, *stale_refs]:
            try:
                await self._api.delete(ref)
            except WriteError as exc:
                undeleted[ref] = f"deleting {ref.kind} {ref.name}: {exc}"
        return unapplied, undeleted


async def _read(call: Awaitable[_T], default: _T, what: str, failures: list[str]) -> _T:
    """What `call` read; `default` if it was refused, and why in `failures`."""
    try:
        return await call
    except WriteError as exc:
        failures.append(f"reading {what}: {exc}")
        return default
