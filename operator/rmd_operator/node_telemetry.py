"""NodeConfigs' collectors, driven from their watch events (docs/telemetry-collectors.md).

The handlers pass every NodeConfig event here: a change applies its spec to the TelemetryManager (which
replaces only the sources whose spec changed), a deletion stops its runners. After each fetch the runner's
report lands in `_report`: an Event for a change worth one (Warning on an error, Normal on recovery), and the
NodeConfig's status.sources merge-patched when it changed (node_telemetry_status.py decides).

What the collectors read from the API server, all through the `kubernetes` client in worker threads:

* Secrets, `get` by name in the NodeConfig's own namespace only (basic auth, CA bundles). A 403 is told as
  such: the chart grants Secrets per namespace (operator.nodeTelemetry.secretNamespaces), never cluster-wide.
* the node's CPU usage for the predictor: `usage.cpu` of the node's NodeMetrics (metrics.k8s.io, served by
  metrics-server) over the Node's `status.capacity.cpu`, in percent. Without a metrics API there is no
  usage, and the predictor reports InputsUnavailable rather than predicting from a made-up figure.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from rmd_api.names import NODE_CONFIG
from rmd_operator.kube import load_configuration
from rmd_operator.node_telemetry_status import sources_patch, transition_event
from rmd_operator.status import EventText
from rmd_operator.telemetry.errors import INVALID_CONFIG, UNREACHABLE, CollectError
from rmd_operator.telemetry.manager import TelemetryManager
from rmd_operator.telemetry.runner import Outcome
from rmd_operator.telemetry.spec import parse_node_config

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT_SECONDS = 10.0
METRICS_API = ("metrics.k8s.io", "v1beta1", "nodes")

PostEvent = Callable[[Mapping[str, Any], EventText], None]


def cpu_percent(usage: object, capacity: object) -> float | None:
    """A NodeMetrics `usage.cpu` over a Node's `capacity.cpu`, in percent; None if either is unusable."""
    try:
        used = Decimal(parse_quantity(usage))  # type: ignore[no-untyped-call]  # untyped library
        cores = Decimal(parse_quantity(capacity))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, InvalidOperation):
        return None
    if not used.is_finite() or not cores.is_finite() or cores <= 0 or used < 0:
        return None
    return float(used / cores * 100)


class TelemetryApi(Protocol):
    async def read_secret(self, namespace: str, name: str) -> Mapping[str, bytes] | None: ...
    async def cpu_usage(self, node: str) -> float | None: ...
    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool: ...
    def close(self) -> None: ...


class TelemetryKubeApi:
    """The collectors' reads (Secrets, CPU usage) and the NodeConfig status writes. `close()` at exit."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._objects = client.CustomObjectsApi(api)
        self._metrics_missing_logged = False

    @classmethod
    async def create(cls) -> TelemetryKubeApi:
        configuration = await asyncio.to_thread(load_configuration)
        return cls(client.ApiClient(configuration=configuration))

    async def read_secret(self, namespace: str, name: str) -> Mapping[str, bytes] | None:
        try:
            secret = await asyncio.to_thread(
                self._core.read_namespaced_secret, name, namespace, _request_timeout=_REQUEST_TIMEOUT_SECONDS
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 403:
                raise CollectError(
                    INVALID_CONFIG,
                    f"the operator may not read Secret {namespace}/{name}: grant it Secrets in namespace "
                    f"{namespace} (chart value operator.nodeTelemetry.secretNamespaces)",
                ) from None
            raise CollectError(
                UNREACHABLE, f"reading Secret {namespace}/{name}: {exc.status} {exc.reason}"
            ) from None
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            raise CollectError(UNREACHABLE, f"reading Secret {namespace}/{name}: {exc}") from None
        return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}

    async def cpu_usage(self, node: str) -> float | None:
        try:
            metrics, capacity = await asyncio.to_thread(self._read_cpu, node)
        except ApiException as exc:
            if exc.status in (404, 503) and not self._metrics_missing_logged:
                self._metrics_missing_logged = True  # no metrics-server: said once, not per fetch
                log.warning(
                    "no CPU usage for node %s from metrics.k8s.io (%s %s): the power predictor reports "
                    "InputsUnavailable until a metrics API serves NodeMetrics",
                    node,
                    exc.status,
                    exc.reason,
                )
            else:
                log.debug("CPU usage of node %s: %s %s", node, exc.status, exc.reason)
            return None
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            log.debug("CPU usage of node %s: %s", node, exc)
            return None
        return cpu_percent((metrics.get("usage") or {}).get("cpu"), capacity)

    def _read_cpu(self, node: str) -> tuple[Mapping[str, Any], object]:
        metrics: Any = self._objects.get_cluster_custom_object(
            *METRICS_API, node, _request_timeout=_REQUEST_TIMEOUT_SECONDS
        )
        found = self._core.read_node(node, _request_timeout=_REQUEST_TIMEOUT_SECONDS)
        return metrics, (found.status.capacity or {}).get("cpu") if found.status else None

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        """Merge-patch a NodeConfig's status; False if the NodeConfig is gone. Other refusals (ApiException)
        and connection trouble raise: the caller logs them and writes again after the next fetch."""
        try:
            await asyncio.to_thread(
                self._objects.patch_namespaced_custom_object_status,
                NODE_CONFIG.group,
                NODE_CONFIG.version,
                namespace,
                NODE_CONFIG.plural,
                name,
                {"status": dict(status)},
                _content_type="application/merge-patch+json",
                _request_timeout=_REQUEST_TIMEOUT_SECONDS,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def close(self) -> None:
        self._api.close()


class NodeTelemetry:
    """The collectors of the handled NodeConfigs. `changed()` on every NodeConfig event; `close()` at exit."""

    def __init__(
        self, api: TelemetryApi, post_event: PostEvent, *, wall: Callable[[], float] = time.time
    ) -> None:
        self.api = api
        self._post = post_event
        self._wall = wall
        self.manager = TelemetryManager(api.read_secret, cpu_usage=api.cpu_usage, report=self._report)
        self._refs: dict[str, dict[str, Any]] = {}  # key -> the NodeConfig as an Event's involvedObject
        self._generations: dict[str, int] = {}
        self._written: dict[str, dict[str, dict[str, Any]]] = {}  # key -> source -> status entry held
        self._written_at: dict[str, dict[str, float]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def changed(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        key = f"{namespace}/{name}"
        if event_type == "DELETED":
            await self.manager.remove(key)
            for memory in (self._refs, self._generations, self._written, self._written_at, self._locks):
                memory.pop(key, None)
            return
        self._refs[key] = {
            "apiVersion": NODE_CONFIG.api_version,
            "kind": NODE_CONFIG.kind,
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid") if meta.get(k)},
        }
        self._generations[key] = int(meta.get("generation") or 0)
        if key not in self._written:
            # What the status holds already (an operator restarting): sources no longer configured go.
            sources = ((body.get("status") or {}).get("sources")) or {}
            self._written[key] = {k: dict(v) for k, v in sources.items() if isinstance(v, Mapping)}
            self._written_at[key] = {}
        await self.manager.apply(key, parse_node_config(namespace, name, body.get("spec") or {}))
        await self._publish(key)

    async def _report(self, outcome: Outcome) -> None:
        ref = self._refs.get(outcome.key)
        if ref is None:
            return  # removed meanwhile
        if outcome.transition is not None:
            self._post(ref, transition_event(outcome.source.kind, outcome.transition))
        await self._publish(outcome.key)

    async def _publish(self, key: str) -> None:
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key not in self._refs:
                return
            written, written_at = self._written[key], self._written_at[key]
            now = self._wall()
            patch = sources_patch(self.manager.snapshot(key), written, now, written_at)
            if not patch:
                return
            namespace, name = key.split("/", 1)
            status = {"observedGeneration": self._generations.get(key, 0), "sources": patch}
            try:
                await self.api.patch_status(namespace, name, status)
            except (ApiException, OSError, urllib3.exceptions.HTTPError) as exc:
                # Left as it was: the next fetch's report writes it again.
                log.warning("status of NodeConfig %s not written: %s", key, exc)
                return
            for kind, entry in patch.items():
                if entry is None:
                    written.pop(kind, None)
                    written_at.pop(kind, None)
                else:
                    written[kind], written_at[kind] = entry, now

    async def close(self) -> None:
        await self.manager.close()
