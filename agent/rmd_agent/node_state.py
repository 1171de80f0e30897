"""This node's RmdNodeState: how the operator finds the agent, what the node supports, what it enforces.

Named rmd-node-state-<node> in settings.node_state_namespace, owned by the Node (so the garbage collector
removes it with the Node), written only by this node's agent. spec: node, nodeUid. status: endpoint (where
the operator dials the gRPC API), capabilities (the probe's findings), conditions (Ready) and workloads, in
rmd-operator's map format (docs/node-state.md).

The first half of this module is pure: it builds the desired object and status from what the engine says,
and the writes (repair of spec and owner, status patch) an object needs to match. `NodeStateWriter` asks the
engine and hands these to kube_object_writer.ObjectWriter, which creates the object when missing (and again
after a deletion; only while the Node exists) and writes only what differs from what the API server last
returned, with the resourceVersion read as a precondition. A refresh that changes nothing costs no request;
every node_state_resync_seconds it re-reads the object and the Node instead of trusting memory. The engine
is asked again when notify() says it changed and at each resync; an engine that does not promise a
notification for every change (`poll_engine`) is also polled every ENGINE_POLL_SECONDS, and so is any
engine while its last answer was a failure. At shutdown the object stays, with Ready=False: the operator
must still see which workloads this node holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from rmd_agent.engine_api import AppliedWorkload, Engine
from rmd_agent.errors import ConfigError, KubeApiError, KubeConnectionError
from rmd_agent.kube import KubeObjectClient, merge_patch
from rmd_agent.kube_object_writer import ABSENT, Change, Desire, ObjectRef, ObjectWriter, node_owner_reference
from rmd_agent.settings import AgentSettings, split_host_port
from rmd_api.cpuset import format_cpu_list
from rmd_api.kube_time import format_time
from rmd_api.names import RMD_NODE_STATE
from rmd_api.node_state import (
    AGENT_READY,
    AGENT_STOPPED,
    ENGINE_NOT_READY,
    ENGINE_UNAVAILABLE,
    READY,
    node_state_name,
)

log = logging.getLogger(__name__)

# The object's API names (rmd_api.names), as the client calls below take them.
GROUP, VERSION, PLURAL = RMD_NODE_STATE.group, RMD_NODE_STATE.version, RMD_NODE_STATE.plural
API_VERSION, KIND = RMD_NODE_STATE.api_version, RMD_NODE_STATE.kind
MANAGED_BY = {"app.kubernetes.io/managed-by": "rmd-agent"}
FIELD_MANAGER = "rmd-agent"

ORIGIN = "gRPC"  # the "Origin" of every workload: the API it came through (RMD said "REST")
MAX_CAPABILITIES = 64  # the CRD's maxProperties
MAX_DETAIL = 1024  # the CRD's maxLength of a capability detail
MAX_MESSAGE = 4096  # well under the CRD's 32768: a condition message is for people

# The CRD's pattern for status.endpoint: a DNS-ish host or bracketed IPv6, then a port.
_ENDPOINT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?):[0-9]{1,5}$")
_WILDCARDS = frozenset({"0.0.0.0", "::"})

Obj = dict[str, Any]


# -- endpoint ------------------------------------------------------------------------------------------------


def format_endpoint(host: str, port: int) -> str:
    """host:port as the CRD wants it ("[fd00::1]:50051" for IPv6). ConfigError if the CRD would refuse it."""
    host = host.strip()
    with contextlib.suppress(ValueError):
        if isinstance(ipaddress.ip_address(host.strip("[]")), ipaddress.IPv6Address):
            host = f"[{host.strip('[]')}]"
    endpoint = f"{host}:{port}"
    if not _ENDPOINT.match(endpoint) or not 0 < port <= 65535:
        raise ConfigError(f"{endpoint!r} is not a valid endpoint (host:port, an IPv6 host in brackets)")
    return endpoint


def endpoint_from_settings(advertise_address: str, grpc_listen: str, port: int | None = None) -> str:
    """Where the operator dials this agent: advertise_address (else grpc_listen's host, unless it listens on
    every interface) and `port` (else grpc_listen's). "" when no address or port can be told."""
    listen_host, listen_port = split_host_port(grpc_listen)
    host = advertise_address or ("" if listen_host is None or listen_host in _WILDCARDS else listen_host)
    port = port if port is not None else listen_port
    if not host or not port:
        return ""
    return format_endpoint(host, port)


# -- status --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str  # CamelCase, the condition's reason
    message: str


def engine_readiness(ok: bool, why: str) -> Readiness:
    """The Ready condition for what Engine.ready() answered."""
    if ok:
        return Readiness(True, AGENT_READY, "the agent enforces workloads on this node")
    return Readiness(False, ENGINE_NOT_READY, why or "the agent's engine is not ready")


def stopped_readiness() -> Readiness:
    return Readiness(
        False,
        AGENT_STOPPED,
        "the agent stopped; the workloads listed stay in place on the node until it is back",
    )


def ready_condition(readiness: Readiness, previous: Sequence[Mapping[str, Any]], now: datetime) -> Obj:
    """The Ready condition; lastTransitionTime moves only when its status changes, so an unchanged state
    gives an identical condition (and no write)."""
    status = "True" if readiness.ready else "False"
    before = next((c for c in previous if isinstance(c, Mapping) and c.get("type") == READY), None)
    since = (
        before["lastTransitionTime"]
        if before is not None and before.get("status") == status and before.get("lastTransitionTime")
        else format_time(now)
    )
    return {
        "type": READY,
        "status": status,
        "lastTransitionTime": since,
        "reason": readiness.reason,
        "message": readiness.message[:MAX_MESSAGE],
    }


def capabilities_map(capabilities: Mapping[str, tuple[bool, str]]) -> Obj:
    """The probe's findings as status.capabilities: feature -> {supported, detail}."""
    features = sorted(capabilities)[:MAX_CAPABILITIES]
    result: Obj = {}
    for feature in features:
        supported, detail = capabilities[feature]
        result[feature] = {"supported": bool(supported), "detail": detail[:MAX_DETAIL]}
    return result


def workload_entry(applied: AppliedWorkload) -> dict[str, str]:
    """One workload in rmd-operator's map format (its UpdateNodeStatusWorkload keys and value syntax), plus
    "Namespace", which rmd-operator lacked because it keyed workloads by name alone, and the MBA value the
    node holds ("MBA Applied", "MBA Rounded", "MBA Message")."""
    w = applied.workload
    entry = {"Namespace": w.namespace}
    if applied.id:
        entry["ID"] = applied.id
    if w.core_ids:
        entry["Core IDs"] = format_cpu_list(w.core_ids)
    if applied.status:
        entry["Status"] = applied.status
    if applied.cos_name:
        entry["Cos Name"] = applied.cos_name
    # rmd-operator always sent both (0 for a shared-pool workload), so RMD always echoed them.
    entry["Cache Max"] = str(w.cache_max or 0)
    entry["Cache Min"] = str(w.cache_min or 0)
    if w.mba_percentage is not None:
        entry["MBA Percentage"] = str(w.mba_percentage)
    if w.mba_mbps is not None:
        entry["MBA Mbps"] = str(w.mba_mbps)
    held = applied.mba_applied
    if held is not None:  # additions: the value the kernel holds, which may be the request rounded up
        entry["MBA Applied"] = str(held.value)
        entry["MBA Rounded"] = "true" if held.rounded else "false"
        if held.detail:
            entry["MBA Message"] = held.detail
    entry["Origin"] = ORIGIN
    if w.policy:
        entry["Policy"] = w.policy
    if w.pstate_ratio is not None:
        entry["P-State Ratio"] = f"{w.pstate_ratio:f}"  # Go's %f, as rmd-operator printed it: "3.000000"
    if w.pstate_monitoring is not None:
        entry["P-State Monitoring"] = w.pstate_monitoring
    return entry


def workloads_map(applied: Sequence[AppliedWorkload]) -> dict[str, dict[str, str]]:
    """status.workloads: keyed by workload name as in rmd-operator (whose key was the RmdWorkload name).

    Names that several namespaces use on this node are keyed <namespace>/<name> instead, every one of
    them: a map cannot hold the same key twice, and a name never contains "/"."""
    counts: dict[str, int] = {}
    for a in applied:
        counts[a.workload.name] = counts.get(a.workload.name, 0) + 1
    result: dict[str, dict[str, str]] = {}
    for a in sorted(applied, key=lambda a: (a.workload.namespace, a.workload.name)):
        w = a.workload
        result[w.name if counts[w.name] == 1 else f"{w.namespace}/{w.name}"] = workload_entry(a)
    return result


def desired_status(
    *,
    endpoint: str,
    readiness: Readiness,
    capabilities: Mapping[str, tuple[bool, str]] | None,
    workloads: Sequence[AppliedWorkload] | None,
    previous: Mapping[str, Any],
    now: datetime,
) -> Obj:
    """The status to publish. `capabilities` or `workloads` None means "unknown right now" (the engine did not
    answer): the previous value is kept rather than replaced by nothing, since an empty workload map would
    tell the operator this node holds nothing. Conditions of other types are kept as they are."""
    status: Obj = {}
    if endpoint:
        status["endpoint"] = endpoint
    if capabilities is not None:
        status["capabilities"] = capabilities_map(capabilities)
    elif "capabilities" in previous:
        status["capabilities"] = previous["capabilities"]
    previous_conditions = [c for c in previous.get("conditions") or () if isinstance(c, Mapping)]
    others = [dict(c) for c in previous_conditions if c.get("type") != READY]
    status["conditions"] = [ready_condition(readiness, previous_conditions, now), *others]
    if workloads is not None:
        status["workloads"] = workloads_map(workloads)
    else:
        status["workloads"] = previous.get("workloads") or {}
    return status


# -- object --------------------------------------------------------------------------------------------------


def desired_object(node_name: str, namespace: str, node_uid: str) -> Obj:
    """The object as created, always owned by its Node, so that it never outlives the Node. Status is
    written separately: the API server ignores it on create."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": node_state_name(node_name),
            "namespace": namespace,
            "labels": dict(MANAGED_BY),
            "ownerReferences": [node_owner_reference(node_name, node_uid)],
        },
        "spec": {"node": node_name, "nodeUid": node_uid},
    }


def repair_patch(current: Mapping[str, Any], node_name: str, node_uid: str) -> Obj:
    """The merge patch that gives an existing object this Node (uid) as owner and spec.nodeUid; {} when it
    has them. A reference to another Node uid (the Node was re-created) is replaced; other owners stay."""
    metadata = current.get("metadata") or {}
    refs = [r for r in metadata.get("ownerReferences") or () if isinstance(r, Mapping)]
    ours = node_owner_reference(node_name, node_uid)
    has_ours = any(all(r.get(k) == v for k, v in ours.items()) for r in refs)
    stale = any(r.get("kind") == "Node" and r.get("uid") != node_uid for r in refs)
    patch: Obj = {}
    if not has_ours or stale:
        patch["metadata"] = {"ownerReferences": [*(dict(r) for r in refs if r.get("kind") != "Node"), ours]}
    if (current.get("spec") or {}).get("nodeUid") != node_uid:
        patch["spec"] = {"nodeUid": node_uid}
    return patch


def repair_change(current: Mapping[str, Any], node_name: str, node_uid: str | None) -> Change | None:
    """The patch of owner and spec.nodeUid, when they are not this Node's (uid None: the Node is unknown)."""
    if node_uid is None:
        return None
    patch = repair_patch(current, node_name, node_uid)
    if not patch:
        return None
    name = current["metadata"]["name"]
    return Change("patch", patch, f"{KIND} {name}: owner and spec.nodeUid set to Node uid {node_uid}")


def status_change(current: Mapping[str, Any], status: Obj) -> Change | None:
    """The status patch turning current's status into `status`; None when they are equal."""
    patch = merge_patch(current.get("status") or {}, status)
    if not patch:
        return None
    name = current["metadata"]["name"]
    before, after = _ready_of(current), _ready_of({"status": status})
    if before == after:
        return Change("patch_status", {"status": patch}, f"{KIND} {name} status updated", logging.DEBUG)
    return Change("patch_status", {"status": patch}, f"{KIND} {name}: Ready {after[0]} ({after[1]})")


def _ready_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == READY:
            return str(condition.get("status")), str(condition.get("reason"))
    return "Unknown", ""


# -- writer --------------------------------------------------------------------------------------------------

ENGINE_POLL_SECONDS = 5.0  # re-asks a polled engine this often; costs no API request unless something changed
ENGINE_TIMEOUT_SECONDS = 10.0
FINAL_WRITE_SECONDS = 10.0  # at most this long at shutdown for the Ready=False write
_T = TypeVar("_T")
Observation = tuple[Readiness, Mapping[str, tuple[bool, str]] | None, Sequence[AppliedWorkload] | None]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class NodeStateWriter:
    """Keeps this node's RmdNodeState current until stop() (see the module docstring).

    `api_client_factory` makes the API client (kube.api_client_factory(settings) in production);
    `endpoint` overrides the one derived from settings (e.g. once the gRPC server knows its port).
    `poll_engine` False: notify() is called after every change of the engine (companions.NotifyingEngine
    over a ChangeNotifier engine), so a quiet node costs nothing between resyncs. Readiness turning (resctrl
    unmounted) reaches it that way too, because the gRPC health refresh asks the engine's ready() every 5 s
    (server/app.py) and the engine tells its listeners when the answer turns.
    notify() and stop() are called from the event loop run() runs on.
    """

    def __init__(
        self,
        settings: AgentSettings,
        engine: Engine,
        api_client_factory: Callable[[], Any],
        *,
        endpoint: str | None = None,
        clock: Callable[[], datetime] = _utcnow,
        poll_engine: bool = True,
    ) -> None:
        if not settings.node_name:
            raise ConfigError("node_name is required to publish the RmdNodeState")
        if not settings.node_state_namespace:
            raise ConfigError("setting node_state_namespace must not be empty")
        if settings.node_state_resync_seconds <= 0:
            raise ConfigError("setting node_state_resync_seconds must be positive")
        if endpoint is None:
            endpoint = endpoint_from_settings(settings.advertise_address, settings.grpc_listen)
        elif endpoint and not _ENDPOINT.match(endpoint):
            raise ConfigError(f"{endpoint!r} is not a valid endpoint (host:port, an IPv6 host in brackets)")
        self.settings = settings
        self.engine = engine
        self.endpoint = endpoint
        self.name = node_state_name(settings.node_name)
        self.namespace = settings.node_state_namespace
        self._factory = api_client_factory
        self._clock = clock
        self.poll_engine = poll_engine
        self._wake = asyncio.Event()
        self._stopping = False
        self._verify_soon = False
        self._object: ObjectWriter | None = None  # made by run(), with the API client
        self.syncs = 0  # completed refreshes, for tests and metrics
        self.failures = 0

    @property
    def writes(self) -> int:
        """Creates and patches."""
        return self._object.writes if self._object else 0

    @property
    def conflicts(self) -> int:
        """Writes refused because the object changed or vanished since it was read."""
        return self._object.conflicts if self._object else 0

    def notify(self, reason: str = "changed") -> None:
        """Refresh soon, e.g. after a workload was applied or removed."""
        log.debug("RmdNodeState %s refresh requested: %s", self.name, reason)
        self._wake.set()

    def recheck(self) -> None:
        """Re-read the object soon instead of trusting memory: someone else may have written it (the operator
        marks Ready=False when the heartbeat expires)."""
        self._verify_soon = True
        self._wake.set()

    def stop(self) -> None:
        """End run(): it writes Ready=False (keeping the workloads) and returns."""
        self._stopping = True
        self._wake.set()

    @property
    def current(self) -> Obj | None:
        """The object as the API server last returned it (None when absent or not read yet)."""
        return self._object.current if self._object else None

    async def run(self) -> None:
        """Publish until stop() or cancellation; errors of one refresh are logged and retried, not raised.
        ConfigError when no Kubernetes client can be made."""
        if not self.endpoint:
            log.warning(
                "no endpoint for RmdNodeState %s: set advertise_address (the chart passes $POD_IP); the "
                "operator will not call this agent",
                self.name,
            )
        api_client = await asyncio.to_thread(self._factory)
        try:
            ref = ObjectRef(GROUP, VERSION, PLURAL, KIND, self.name, self.namespace)
            kube = KubeObjectClient(api_client, ref, FIELD_MANAGER)
            self._object = ObjectWriter(kube, self.settings.node_name, needs_node=True, logger=log)
            try:
                await self._loop(self._object)
            finally:
                try:
                    await asyncio.wait_for(self._final_write(self._object), FINAL_WRITE_SECONDS)
                except Exception as exc:  # shutdown goes on: the object is stale, not wrong
                    log.warning("could not mark RmdNodeState %s not ready at shutdown: %s", self.name, exc)
        finally:
            close = getattr(api_client, "close", None)
            if close is not None:
                await asyncio.to_thread(close)

    async def _loop(self, writer: ObjectWriter) -> None:
        resync = self.settings.node_state_resync_seconds
        next_verify = time.monotonic()  # the first refresh reads the object and the Node
        backoff = 0.0
        while not self._stopping:
            self._wake.clear()
            verify = self._verify_soon or time.monotonic() >= next_verify
            self._verify_soon = False
            engine_unwell = False
            try:
                observed = await self._observe()
                # Not ready or not answering: keep asking, it may recover without a change to notify.
                engine_unwell = not observed[0].ready or observed[1] is None or observed[2] is None
                # Owner and spec first: the status patch then carries the resourceVersion they left.
                await writer.sync(self._build, [self._repair, self._status(observed)], verify=verify)
            except Exception as exc:
                self.failures += 1
                backoff = min(max(1.0, backoff * 2), resync)
                if isinstance(exc, KubeConnectionError):
                    log.warning("RmdNodeState %s: %s", self.name, exc)
                elif isinstance(exc, KubeApiError):
                    log.warning("RmdNodeState %s: API error %s %s", self.name, exc.status, exc.reason)
                else:
                    log.warning("RmdNodeState %s refresh failed", self.name, exc_info=True)
            else:
                backoff = 0.0
                if verify:
                    next_verify = time.monotonic() + resync
            self.syncs += 1
            wait = backoff or max(0.0, next_verify - time.monotonic())
            if self.poll_engine or engine_unwell:
                wait = min(wait, ENGINE_POLL_SECONDS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def _final_write(self, writer: ObjectWriter) -> None:
        """Ready=False with the workloads the node still holds; never creates the object."""
        workloads = await self._ask("list()", self.engine.list)
        listed = None if isinstance(workloads, Exception) else workloads
        if await writer.sync(None, [self._status((stopped_readiness(), None, listed))]) != ABSENT:
            log.info("RmdNodeState %s marked not ready (agent stopped)", self.name)

    # -- what to write

    def _build(self, node_uid: str | None) -> Obj:
        assert node_uid is not None, "created only while the Node exists (needs_node)"
        return desired_object(self.settings.node_name, self.namespace, node_uid)

    def _repair(self, current: Obj, node_uid: str | None) -> Change | None:
        return repair_change(current, self.settings.node_name, node_uid)

    def _status(self, observed: Observation) -> Desire:
        readiness, capabilities, workloads = observed

        def change(current: Obj, _: str | None) -> Change | None:
            desired = desired_status(
                endpoint=self.endpoint,
                readiness=readiness,
                capabilities=capabilities,
                workloads=workloads,
                previous=current.get("status") or {},
                now=self._clock(),
            )
            return status_change(current, desired)

        return change

    # -- the engine

    async def _ask(self, what: str, call_engine: Callable[[], Awaitable[_T]]) -> _T | Exception:
        try:
            return await asyncio.wait_for(call_engine(), ENGINE_TIMEOUT_SECONDS)
        except TimeoutError:
            return TimeoutError(f"the engine did not answer {what} within {ENGINE_TIMEOUT_SECONDS:g}s")
        except Exception as exc:
            return exc

    async def _caps(self) -> dict[str, tuple[bool, str]]:
        return (await self.engine.node()).capabilities

    async def _observe(self) -> Observation:
        ready = await self._ask("ready()", self.engine.ready)
        if isinstance(ready, Exception):
            readiness = Readiness(False, ENGINE_UNAVAILABLE, str(ready) or type(ready).__name__)
        else:
            readiness = engine_readiness(*ready)
        # The capabilities alone where the engine gives them so: the node summary also reads resctrl.
        alone = getattr(self.engine, "node_capabilities", None)
        found = await (self._ask("node_capabilities()", alone) if alone else self._ask("node()", self._caps))
        listed = await self._ask("list()", self.engine.list)
        for what, answer in (("capabilities", found), ("list()", listed)):
            if isinstance(answer, Exception):
                log.debug("engine %s failed: %s", what, answer)
        capabilities = None if isinstance(found, Exception) else found
        workloads = None if isinstance(listed, Exception) else listed
        return readiness, capabilities, workloads
