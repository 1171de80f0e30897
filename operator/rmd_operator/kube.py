"""The operator's own writes to the Kubernetes API: RmdWorkload status, through the status subresource, and
the Ready condition of an RmdNodeState whose agent's heartbeat expired (heartbeats.py).

kopf applies a handler's `patch` only when the handler returns, and a per-workload daemon never returns while
it runs, so the reconciler writes status itself, under the workload's lock, in the order it decides it. The
`kubernetes` client is synchronous: every call runs in a worker thread, never on the event loop. Credentials
are found the way kopf finds its own (in-cluster service account first, then KUBECONFIG), and like kopf the
client ignores HTTP(S)_PROXY.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from rmd_api.names import RMD_NODE_STATE, RMD_WORKLOAD, CustomResource
from rmd_api.node_state import node_state_name
from rmd_operator.errors import OperatorError

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT_SECONDS = 30.0
_T = TypeVar("_T")


class KubeError(OperatorError):
    """A write to the API server failed (other than the object being gone)."""


def load_configuration() -> client.Configuration:
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except ConfigException:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.proxy = None
    return configuration


class StatusWriter:
    """Merge-patches RmdWorkload status. Create with `await StatusWriter.create()`; `close()` at exit."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self._objects = client.CustomObjectsApi(api)

    @classmethod
    async def create(cls) -> StatusWriter:
        configuration = await asyncio.to_thread(load_configuration)
        return cls(client.ApiClient(configuration=configuration))

    async def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        """Apply a merge patch ({"status": {...}}) to the workload's status; False if the object is gone."""
        what = f"status of {namespace}/{name}"
        try:
            await _in_thread(_patch_status, what, self._objects, RMD_WORKLOAD, namespace, name, patch)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise KubeError(f"{what}: {exc.status} {exc.reason}") from None
        return True

    def close(self) -> None:
        self._api.close()


class NodeStateApi:
    """What heartbeats.AgentLiveness reads and writes in the agents' namespace: their Leases, and the
    RmdNodeStates' status. Create with `await NodeStateApi.create(namespace)`; `close()` at exit."""

    def __init__(self, api: Any, namespace: str) -> None:
        self._api = api
        self._namespace = namespace
        self._objects = client.CustomObjectsApi(api)
        self._leases = client.CoordinationV1Api(api)

    @classmethod
    async def create(cls, namespace: str) -> NodeStateApi:
        configuration = await asyncio.to_thread(load_configuration)
        return cls(client.ApiClient(configuration=configuration), namespace)

    async def read_lease(self, name: str) -> dict[str, Any] | None:
        def call() -> dict[str, Any]:
            response: Any = self._leases.read_namespaced_lease(  # raw: _preload_content=False
                name, self._namespace, _preload_content=False, _request_timeout=_REQUEST_TIMEOUT_SECONDS
            )
            lease: dict[str, Any] = json.loads(response.data)
            return lease

        return await self._read(call, f"Lease {name}")

    async def read_node_state(self, node: str) -> dict[str, Any] | None:
        def call() -> dict[str, Any]:
            state: Any = self._objects.get_namespaced_custom_object(
                *_node_states(self._namespace),
                node_state_name(node),
                _request_timeout=_REQUEST_TIMEOUT_SECONDS,
            )
            return dict(state)

        return await self._read(call, f"RmdNodeState of {node}")

    async def patch_node_state_status(self, node: str, patch: Mapping[str, Any]) -> bool:
        """Merge-patch the status; False if the object changed since the resourceVersion in `patch`."""
        what, name = f"status of RmdNodeState of {node}", node_state_name(node)
        try:
            await _in_thread(_patch_status, what, self._objects, RMD_NODE_STATE, self._namespace, name, patch)
        except ApiException as exc:
            if exc.status == 409:
                return False
            if exc.status == 404:
                return True  # gone: nothing left to mark
            raise KubeError(f"{what}: {exc.status} {exc.reason}") from None
        return True

    async def _read(self, call: Callable[[], dict[str, Any]], what: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await _in_thread(call, what)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise KubeError(f"{what}: {exc.status} {exc.reason}") from None
        return found

    def close(self) -> None:
        self._api.close()


def _node_states(namespace: str) -> tuple[str, str, str, str]:
    return RMD_NODE_STATE.group, RMD_NODE_STATE.version, namespace, RMD_NODE_STATE.plural


def _patch_status(
    objects: client.CustomObjectsApi,
    resource: CustomResource,
    namespace: str,
    name: str,
    patch: Mapping[str, Any],
) -> None:
    objects.patch_namespaced_custom_object_status(
        resource.group,
        resource.version,
        namespace,
        resource.plural,
        name,
        dict(patch),
        _content_type="application/merge-patch+json",
        _request_timeout=_REQUEST_TIMEOUT_SECONDS,
    )


async def _in_thread(call: Callable[..., _T], what: str, *args: Any) -> _T:
    """A blocking client call in a worker thread. ApiException passes; connection trouble (after urllib3's
    retries) becomes KubeError."""
    try:
        return await asyncio.to_thread(call, *args)
    except (OSError, urllib3.exceptions.HTTPError) as exc:
        raise KubeError(f"{what}: {exc}") from None
