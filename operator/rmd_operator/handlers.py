"""kopf glue: which objects the operator watches and what it does on their events. No decisions here.

Run with `rmd-operator run` (which loads the settings first) or `kopf run -m rmd_operator.handlers`; never in
kopf's file mode (it would put this directory on sys.path).

    RmdWorkload   a daemon per object runs reconcile passes: at start (creation, and every object when the
                  operator starts, i.e. resume), when woken (spec change, a change of a node it may target),
                  and when something is due (retry after backoff, drift check). Status is written by the
                  reconciler itself; the deletion handler holds the finalizer until the workload is removed
                  from every node.
    Node          indexed by name (labels); label changes wake the workloads they may concern.
    RmdNodeState  (written by each agent, in node_state_namespace only) indexed by node; changes wake the
                  workloads of that node, reset its backoff, and occasionally trigger an orphan sweep.
    Lease         the agents' heartbeats (rmd-agent-<node> in node_state_namespace, watched with a label
                  selector): heartbeats.py marks an RmdNodeState Ready=False when its agent's Lease expires;
                  a renewal may trigger the periodic orphan sweep, and a new holder (the agent restarted)
                  triggers one as soon as the agent is ready.
    NodeConfigTemplate, NodeConfig (wao.bitmedia.co.jp; unless node_config_templates is false), indexed with
                  the Nodes' InternalIPs: any change of them or of a Node wakes node_config_sync.TemplateSync,
                  which keeps each template's NodeConfigs and writes the templates' status.
    RmdConfig     (cluster-scoped; only with agent_manifests_configmap) each event, and each event of the
                  prometheus-operator ServiceMonitor CRD, wakes rmdconfig_sync.RmdConfigSync, which
                  deploys the agents' objects from the chart's manifests and writes the RmdConfig's status.
    NodeConfig    (unless node_telemetry is false) each event goes to node_telemetry.NodeTelemetry: its
                  collectors started, replaced or stopped; they write its status.sources and Events, and
                  their values are served on metrics_listen's /metrics.
    Pod           only pods bound to a node with a container limit on intel.com/l3_cache_ways: the pod flow
                  (pod_flow.py) creates their RmdWorkloads, and reacts to those workloads' status through the
                  RmdWorkload events. Standalone, pods come through our own watch (pod_watch.py), which keeps
                  nothing of the pods it does not want; with peering through kopf's (paused with the
                  replica, but it keeps a small record of every bound pod in the cluster).

Every handler is a coroutine: kopf runs plain functions in worker threads, and the reconciler's state
(asyncio events, tasks, gRPC channels) belongs to the event loop. Raw watch events, not on.update/on.field,
trigger the wake-ups: they need no last-handled annotation, so the operator never writes to Nodes or
RmdNodeStates except the Ready condition of one whose heartbeat expired (and to RmdWorkloads only their status
and its finalizer; the pod flow writes the RmdWorkloads
of pods, and deletes pods whose request failed unless delete_failed_pods is false). Pods are never annotated.
The template controller writes NodeConfigs (those of templates) and NodeConfigTemplates' status only; the
collectors write NodeConfigs' status only.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import kopf
from prometheus_client import CollectorRegistry

from rmd_api.agent_certs import SIGNER_NAME
from rmd_api.names import NODE_CONFIG, NODE_CONFIG_TEMPLATE, RMD_CONFIG, RMD_NODE_STATE, RMD_WORKLOAD
from rmd_api.node_state import LEASE_LABEL, LEASE_LABEL_VALUE
from rmd_operator.agent_certs import needs_action
from rmd_operator.agent_client import AgentClients, close_quietly
from rmd_operator.csr_signer import AgentCertificateSigner
from rmd_operator.errors import ConfigError, RetryLater
from rmd_operator.events import EventPoster
from rmd_operator.heartbeats import AgentLiveness, Seen
from rmd_operator.kube import NodeStateApi, StatusWriter
from rmd_operator.metrics_http import MetricsServer
from rmd_operator.node_config_api import NodeConfigApi
from rmd_operator.node_config_plan import (
    Node,
    NodeConfig,
    Template,
    internal_ips,
    node_config_of,
    template_of,
)
from rmd_operator.node_config_sync import Inputs, TemplateSync
from rmd_operator.node_telemetry import NodeTelemetry, TelemetryKubeApi
from rmd_operator.pod_flow import PodFlow
from rmd_operator.pod_objects import PodObjectsApi
from rmd_operator.pod_watch import BOUND, PodWatch, wanted
from rmd_operator.reconcile import Reconciler
from rmd_operator.rmdconfig_api import RmdConfigApi
from rmd_operator.rmdconfig_plan import SERVICE_MONITOR_CRD, scheduler_extra
from rmd_operator.rmdconfig_sync import RmdConfigSync
from rmd_operator.settings import OperatorSettings, active
from rmd_operator.targets import Cluster, NodeAgent, node_agent
from rmd_operator.telemetry.metrics import TelemetryCollector

log = logging.getLogger(__name__)

# Read at import: the decorators below are evaluated now (rmd-operator run activates the settings first).
SETTINGS = active()

FINALIZER = "intel.com/rmd-operator"
ANNOTATION_PREFIX = "rmd-operator.intel.com"
CSR_GROUP = "certificates.k8s.io"
# kopf's (group, version, plural) of the resources handled here.
WORKLOADS = (RMD_WORKLOAD.group, RMD_WORKLOAD.version, RMD_WORKLOAD.plural)
NODE_STATES = (RMD_NODE_STATE.group, RMD_NODE_STATE.version, RMD_NODE_STATE.plural)
LEASES = ("coordination.k8s.io", "v1", "leases")
RMD_CONFIGS = (RMD_CONFIG.group, RMD_CONFIG.version, RMD_CONFIG.plural)
CRDS = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NODE_CONFIGS = (NODE_CONFIG.group, NODE_CONFIG.version, NODE_CONFIG.plural)
NODE_CONFIG_TEMPLATES = (
    NODE_CONFIG_TEMPLATE.group,
    NODE_CONFIG_TEMPLATE.version,
    NODE_CONFIG_TEMPLATE.plural,
)
_K = TypeVar("_K")
_V = TypeVar("_V")


def workload_in_scope(namespace: str | None, **_: Any) -> bool:
    return not SETTINGS.namespaces or namespace in SETTINGS.namespaces


def pod_wanted(body: kopf.Body, **_: Any) -> bool:
    # Evaluated for every pod event: a dictionary walk over the containers' limits, nothing more.
    return wanted(body, SETTINGS.namespaces)


def node_state_in_scope(namespace: str | None, **_: Any) -> bool:
    # RmdNodeStates (and Leases) elsewhere are not the agents': an endpoint from them is never used.
    return namespace == SETTINGS.node_state_namespace


class _FirstValues(Mapping[_K, _V]):
    """A kopf index (key -> store of values) seen as key -> its one value; live, not copied."""

    def __init__(self, index: kopf.Index[_K, _V]) -> None:
        self._index = index

    def __getitem__(self, key: _K) -> _V:
        for value in self._index[key]:
            return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[_K]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def _index(kwargs: Mapping[str, Any], name: str) -> kopf.Index[Any, Any]:
    """An index, which kopf passes to handlers as a kwarg named after its function (kopf's callback protocols
    cannot declare such kwargs, so they come through **kwargs)."""
    index: kopf.Index[Any, Any] = kwargs[name]
    return index


def _cluster(kwargs: Mapping[str, Any]) -> Cluster:
    return Cluster(_FirstValues(_index(kwargs, "node_labels")), _FirstValues(_index(kwargs, "node_agents")))


class NothingToDiff(kopf.DiffBaseStorage):
    """kopf keeps each object's last handled spec (an annotation written after every change) to give
    on.create/on.update handlers their diff. This operator has none: its daemons react to every change and
    compare for themselves. So nothing is kept and every object counts as handled as it is, which saves one
    write per RmdWorkload change (and the watch event it causes)."""

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return self.build(body=body)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


def configure_kopf(settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    settings.persistence.finalizer = FINALIZER
    # Annotations, not status: the CRD's structural schema would prune kopf's status fields.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = NothingToDiff()
    settings.posting.enabled = False  # Events are ours (events.py), not kopf's per log line
    settings.watching.server_timeout = ours.watch_timeout_seconds
    settings.watching.client_timeout = ours.watch_timeout_seconds + 10
    settings.watching.connect_timeout = 10
    settings.watching.chunk_size = ours.list_page_size
    settings.watching.field_selectors["v1", "pods"] = BOUND  # (kopf watches pods only with peering)
    settings.watching.field_selectors[CSR_GROUP, "certificatesigningrequests"] = (
        f"spec.signerName={SIGNER_NAME}"
    )
    # Only the agents' heartbeats, not every Lease of the cluster (each node's kubelet renews one).
    settings.watching.label_selectors[LEASES[0], LEASES[2]] = f"{LEASE_LABEL}={LEASE_LABEL_VALUE}"
    logging.getLogger("rmd_operator").setLevel(ours.log_level.upper())


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure_kopf(settings, SETTINGS)
    try:
        clients = await AgentClients.create(SETTINGS)
    except ConfigError as exc:  # unreadable certificates: retrying will not help
        raise kopf.PermanentError(str(exc)) from None
    writer = await StatusWriter.create()
    pod_objects = await PodObjectsApi.create()
    memo.agent_clients = clients
    memo.status_writer = writer
    memo.pod_objects = pod_objects
    memo.events = events = await EventPoster.create(SETTINGS.instance or socket.gethostname())
    if SETTINGS.agent_signer_ca_cert:
        try:
            memo.agent_signer = await AgentCertificateSigner.create(SETTINGS)
        except ConfigError as exc:  # an unreadable CA: retrying will not help
            raise kopf.PermanentError(str(exc)) from None
    memo.reconciler = Reconciler(SETTINGS, agents=clients, status_sink=writer, events=events.post)
    memo.liveness_api = liveness_api = await NodeStateApi.create(SETTINGS.node_state_namespace)
    memo.liveness = liveness = AgentLiveness(liveness_api, SETTINGS.node_state_namespace)
    memo.liveness_task = asyncio.create_task(liveness.run(), name="agent-heartbeats")
    memo.pod_flow = pod_flow = PodFlow(SETTINGS, agents=clients, objects=pod_objects, events=events.post)
    if SETTINGS.node_config_templates:
        memo.node_config_api = node_config_api = await NodeConfigApi.create()
        memo.template_sync = template_sync = TemplateSync(
            node_config_api,
            events.post,
            retry_initial=SETTINGS.retry_initial_seconds,
            retry_max=SETTINGS.retry_max_seconds,
        )
        memo.template_sync_task = asyncio.create_task(template_sync.run(), name="node-config-templates")
    if SETTINGS.agent_manifests_configmap:
        memo.rmd_config_api = rmd_config_api = await RmdConfigApi.create()
        memo.rmd_config_sync = rmd_config_sync = RmdConfigSync(
            rmd_config_api,
            events.post,
            namespace=SETTINGS.node_state_namespace,
            configmap=SETTINGS.agent_manifests_configmap,
            resync=SETTINGS.rmdconfig_resync_seconds,
            extra=scheduler_extra(
                SETTINGS.node_state_namespace, SETTINGS.cluster_name, SETTINGS.agent_pods_fingerprint_method
            ),
        )
        memo.rmd_config_task = asyncio.create_task(rmd_config_sync.run(), name="rmdconfig")
    registry = CollectorRegistry()
    if SETTINGS.node_telemetry:
        memo.node_telemetry = node_telemetry = NodeTelemetry(await TelemetryKubeApi.create(), events.post)
        registry.register(TelemetryCollector(node_telemetry.manager))
    if SETTINGS.metrics_listen:
        memo.metrics_server = metrics_server = MetricsServer(registry)
        try:
            port = await metrics_server.start(SETTINGS.metrics_listen)
        except ConfigError as exc:  # the port is taken: retrying will not help
            raise kopf.PermanentError(str(exc)) from None
        log.info("metrics on %s (port %d)", SETTINGS.metrics_listen, port)
    if not SETTINGS.peering:
        # One watch per handled namespace (the RBAC may allow pods there only), else one for all.
        memo.pod_watch_api = api = await PodWatch.api_client()
        memo.pod_watches = [
            PodWatch.on_loop(
                pod_flow.pod_changed,
                api,
                namespace=namespace,
                page_size=SETTINGS.list_page_size,
                timeout_seconds=SETTINGS.watch_timeout_seconds,
            )
            for namespace in SETTINGS.namespaces or (None,)
        ]
        for watch in memo.pod_watches:
            watch.start()
    log.info(
        "rmd-operator started: workloads in %s, agents' RmdNodeStates in %s, %s to agents",
        ", ".join(SETTINGS.namespaces) or "all namespaces",
        SETTINGS.node_state_namespace,
        "PLAINTEXT" if SETTINGS.insecure_agents else "mTLS",
        extra={
            "namespaces": list(SETTINGS.namespaces) or "all",
            "node_state_namespace": SETTINGS.node_state_namespace,
            "tls": not SETTINGS.insecure_agents,
        },
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    watches: list[PodWatch] = memo.get("pod_watches") or []
    for watch in watches:
        await asyncio.to_thread(watch.stop)
    if watches:
        await asyncio.to_thread(memo.pod_watch_api.close)
    pod_flow: PodFlow | None = memo.get("pod_flow")
    if pod_flow is not None:
        await pod_flow.close()
    reconciler: Reconciler | None = memo.get("reconciler")
    if reconciler is not None:
        await reconciler.close()
    template_sync_task: asyncio.Task[None] | None = memo.get("template_sync_task")
    if template_sync_task is not None:
        template_sync_task.cancel()
        await asyncio.gather(template_sync_task, return_exceptions=True)
        await asyncio.to_thread(memo.node_config_api.close)
    rmd_config_task: asyncio.Task[None] | None = memo.get("rmd_config_task")
    if rmd_config_task is not None:
        rmd_config_task.cancel()
        await asyncio.gather(rmd_config_task, return_exceptions=True)
        await asyncio.to_thread(memo.rmd_config_api.close)
    metrics_server: MetricsServer | None = memo.get("metrics_server")
    if metrics_server is not None:
        await metrics_server.close()
    node_telemetry: NodeTelemetry | None = memo.get("node_telemetry")
    if node_telemetry is not None:
        await node_telemetry.close()
        await asyncio.to_thread(node_telemetry.api.close)
    liveness_task: asyncio.Task[None] | None = memo.get("liveness_task")
    if liveness_task is not None:
        liveness_task.cancel()
        await asyncio.gather(liveness_task, return_exceptions=True)
        await asyncio.to_thread(memo.liveness_api.close)
    await close_quietly(memo.get("agent_clients"))
    signer: AgentCertificateSigner | None = memo.get("agent_signer")
    if signer is not None:
        await asyncio.to_thread(signer.close)
    events: EventPoster | None = memo.get("events")
    if events is not None:
        await events.close()
    writer: StatusWriter | None = memo.get("status_writer")
    if writer is not None:
        await asyncio.to_thread(writer.close)
    pod_objects: PodObjectsApi | None = memo.get("pod_objects")
    if pod_objects is not None:
        await asyncio.to_thread(pod_objects.close)


# -- indexes: complete before any handler runs, so no pass ever sees half the cluster ---------------------


@kopf.index("v1", "nodes")
async def node_labels(name: str, labels: kopf.Labels, **_: Any) -> dict[str, dict[str, str]]:
    return {name: dict(labels)}


@kopf.index(*NODE_STATES, when=node_state_in_scope)
async def node_agents(body: kopf.Body, **_: Any) -> dict[str, NodeAgent]:
    agent = node_agent(body)
    return {agent.node: agent} if agent is not None else {}


@kopf.index(*WORKLOADS, when=workload_in_scope)
async def workload_uids(namespace: str | None, name: str, uid: str, **_: Any) -> dict[tuple[str, str], str]:
    return {(namespace or "", name): uid}


# -- wake-ups --------------------------------------------------------------------------------------------


@kopf.on.event("v1", "nodes")
async def node_event(type: str, name: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
    reconciler: Reconciler = memo.reconciler
    reconciler.node_changed(name, None if type == "DELETED" else dict(labels))


@kopf.on.event(*NODE_STATES, when=node_state_in_scope)
async def node_state_event(type: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:  # noqa: A002
    reconciler: Reconciler = memo.reconciler
    node = (body.get("spec") or {}).get("node")
    if not isinstance(node, str) or not node:
        return
    agent = None if type == "DELETED" else node_agent(body)
    reconciler.agent_changed(node, agent)
    pod_flow: PodFlow = memo.pod_flow
    pod_flow.agent_changed(node, agent)
    _sweep_orphans_if_due(reconciler, node, agent, kwargs)


@kopf.on.event(*LEASES, when=node_state_in_scope)
async def agent_lease_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:  # noqa: A002
    liveness: AgentLiveness = memo.liveness
    seen = liveness.lease_changed(type, body)
    if seen is None:
        return
    node, what = seen
    reconciler: Reconciler = memo.reconciler
    if what is Seen.RESTARTED:
        log.info("the agent of node %s restarted (new heartbeat holder)", node, extra={"node": node})
        reconciler.orphans.restarted(node)
    agents = _index(kwargs, "node_agents")
    agent = next(iter(agents.get(node, ())), None)
    _sweep_orphans_if_due(reconciler, node, agent, kwargs)


def _sweep_orphans_if_due(
    reconciler: Reconciler, node: str, agent: NodeAgent | None, kwargs: Mapping[str, Any]
) -> None:
    """Start an orphan sweep of the node when one is due (orphans.py) and its agent can answer."""
    if not (SETTINGS.remove_orphans and agent is not None and agent.endpoint and agent.ready is not False):
        return
    if reconciler.orphans.due(node):
        uids = _index(kwargs, "workload_uids")

        def existing_uid(namespace: str, name: str) -> str | None:
            for uid in uids.get((namespace, name), ()):
                return str(uid)
            return None

        reconciler.spawn(reconciler.orphans.sweep(node, agent.endpoint, existing_uid, workload_in_scope))


@kopf.on.event(*WORKLOADS, when=workload_in_scope)
async def workload_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
    if type != "DELETED":
        reconciler: Reconciler = memo.reconciler
        reconciler.workload_changed(body)
    pod_flow: PodFlow = memo.pod_flow
    pod_flow.workload_changed(type, body)


# -- the pod flow ----------------------------------------------------------------------------------------


if SETTINGS.peering:
    # kopf pauses its watches while another replica is active; our own pod watch would not know that.

    @kopf.on.event("v1", "pods", when=pod_wanted)
    async def pod_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
        pod_flow: PodFlow = memo.pod_flow
        pod_flow.pod_changed(type, body)


# -- NodeConfigTemplates (node_config_sync.py; docs/telemetry.md) -------------------------------------------


def _template_inputs(kwargs: Mapping[str, Any]) -> Callable[[], Inputs]:
    """What a template pass reads: kopf's indexes, live (complete before any handler runs)."""
    templates = _index(kwargs, "node_config_templates")
    configs = _index(kwargs, "node_configs")
    labels = _FirstValues(_index(kwargs, "node_labels"))
    addresses = _FirstValues(_index(kwargs, "node_addresses"))

    def read() -> Inputs:
        nodes = [Node(name, labels[name], addresses.get(name, ())) for name in labels]
        return Inputs(
            templates=[t for store in templates.values() for t in store],
            nodes=nodes,
            configs=[c for store in configs.values() for c in store],
        )

    return read


def _templates_changed(memo: kopf.Memo, kwargs: Mapping[str, Any]) -> None:
    template_sync: TemplateSync = memo.template_sync
    template_sync.changed(_template_inputs(kwargs))


if SETTINGS.node_config_templates:

    @kopf.index("v1", "nodes")
    async def node_addresses(name: str, status: kopf.Status, **_: Any) -> dict[str, tuple[str, ...]]:
        return {name: internal_ips(status)}

    @kopf.index(*NODE_CONFIG_TEMPLATES, when=workload_in_scope)
    async def node_config_templates(body: kopf.Body, **_: Any) -> dict[tuple[str, str], Template]:
        template = template_of(body)
        return {(template.namespace, template.name): template}

    @kopf.index(*NODE_CONFIGS, when=workload_in_scope)
    async def node_configs(body: kopf.Body, **_: Any) -> dict[tuple[str, str], NodeConfig]:
        config = node_config_of(body)
        return {(config.namespace, config.name): config}

    @kopf.on.event("v1", "nodes")
    async def node_event_for_templates(memo: kopf.Memo, **kwargs: Any) -> None:
        _templates_changed(memo, kwargs)

    @kopf.on.event(*NODE_CONFIG_TEMPLATES, when=workload_in_scope)
    async def node_config_template_event(memo: kopf.Memo, **kwargs: Any) -> None:
        _templates_changed(memo, kwargs)

    @kopf.on.event(*NODE_CONFIGS, when=workload_in_scope)
    async def node_config_event(memo: kopf.Memo, **kwargs: Any) -> None:
        _templates_changed(memo, kwargs)


# -- the cluster's RmdConfig (rmdconfig_sync.py; docs/install.md "Deployed by an RmdConfig") ----------------


def is_service_monitor_crd(name: str, **_: Any) -> bool:
    return name == SERVICE_MONITOR_CRD


if SETTINGS.agent_manifests_configmap:

    @kopf.on.event(*RMD_CONFIGS)
    async def rmd_config_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
        rmd_config_sync: RmdConfigSync = memo.rmd_config_sync
        rmd_config_sync.changed(None if type == "DELETED" else body)

    @kopf.on.event(*CRDS, when=is_service_monitor_crd)
    async def service_monitor_crd_event(memo: kopf.Memo, **_: Any) -> None:
        rmd_config_sync: RmdConfigSync = memo.rmd_config_sync
        rmd_config_sync.wake()


# -- NodeConfigs' collectors (node_telemetry.py; docs/telemetry-collectors.md) ------------------------------


if SETTINGS.node_telemetry:

    @kopf.on.event(*NODE_CONFIGS, when=workload_in_scope)
    async def node_config_telemetry(
        type: str | None,  # noqa: A002
        body: kopf.Body,
        memo: kopf.Memo,
        **_: Any,
    ) -> None:
        node_telemetry: NodeTelemetry = memo.node_telemetry
        await node_telemetry.changed(type, body)


# -- the agents' serving certificates (only with a signer CA) ----------------------------------------------


def csr_needs_action(body: kopf.Body, **_: Any) -> bool:
    return needs_action(body)


if SETTINGS.agent_signer_ca_cert:

    @kopf.on.event(CSR_GROUP, "v1", "certificatesigningrequests", when=csr_needs_action)
    async def agent_certificate(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        signer: AgentCertificateSigner = memo.agent_signer
        await signer.handle(body)


# -- the workloads ---------------------------------------------------------------------------------------


async def _until_stopped(stopped: kopf.DaemonStopped) -> None:
    await stopped.wait()


async def _sleep(wake: asyncio.Event, delay: float, stopped: kopf.DaemonStopped) -> None:
    """Sleep until `delay` passes, the workload is woken, or the daemon is told to stop."""
    waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(_until_stopped(stopped))]
    try:
        await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        wake.clear()  # the next pass covers every wake-up until now


@kopf.daemon(
    *WORKLOADS,
    id="reconcile",
    when=workload_in_scope,
    # Asked to stop, the daemon finishes its pass; it is cancelled only if that takes longer than this.
    cancellation_backoff=SETTINGS.agent_call_timeout_seconds + 5,
    cancellation_timeout=5.0,
)
async def reconcile_workload(
    *, body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo, **kwargs: Any
) -> None:
    reconciler: Reconciler = memo.reconciler
    wake = reconciler.attach(body)
    try:
        while not stopped:
            try:
                delay = await reconciler.reconcile(body, _cluster(kwargs))
            except Exception:
                log.exception(
                    "reconcile pass of %s/%s failed",
                    body.metadata.namespace,
                    body.metadata.name,
                    extra={"workload": f"{body.metadata.namespace}/{body.metadata.name}"},
                )
                delay = SETTINGS.retry_initial_seconds
            await _sleep(wake, delay, stopped)
    finally:
        reconciler.detach(str(body.metadata.uid))


@kopf.on.delete(*WORKLOADS, id="remove-from-nodes", when=workload_in_scope)
async def remove_from_nodes(*, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    reconciler: Reconciler = memo.reconciler
    try:
        await reconciler.finalize(body, _cluster(kwargs))
    except RetryLater as exc:
        raise kopf.TemporaryError(str(exc), delay=exc.delay) from None


@kopf.on.probe(id="rmd")
async def probe(memo: kopf.Memo, **_: Any) -> dict[str, int]:
    reconciler: Reconciler | None = memo.get("reconciler")
    pod_flow: PodFlow | None = memo.get("pod_flow")
    template_sync: TemplateSync | None = memo.get("template_sync")
    rmd_config_sync: RmdConfigSync | None = memo.get("rmd_config_sync")
    return {
        **(rmd_config_sync.health() if rmd_config_sync is not None else {}),
        **(reconciler.health() if reconciler is not None else {}),
        **(pod_flow.health() if pod_flow is not None else {}),
        **(template_sync.health() if template_sync is not None else {}),
    }
