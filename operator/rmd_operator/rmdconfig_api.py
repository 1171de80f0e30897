"""The RmdConfig controller's reads and writes, through the `kubernetes` client in worker threads.

Objects are written with server-side apply (field manager rmd-operator, forced: the operator owns what it
deploys), so one call creates or updates any kind the plan holds, and a field the RmdConfig no longer sets
is removed. Reads that find nothing return None or an empty list; every refusal is a WriteError.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_api.names import RMD_CONFIG, RMD_NODE_STATE
from rmd_operator.kube import load_configuration
from rmd_operator.node_config_api import WriteError, status_body
from rmd_operator.rmdconfig_plan import MANAGER, ObjectRef

_TIMEOUT = 30.0
_T = TypeVar("_T")

# The kinds a plan may hold (the chart's agents' objects, and the scheduler's): kind -> plural.
PLURALS = {
    "DaemonSet": "daemonsets",
    "Deployment": "deployments",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
    "ConfigMap": "configmaps",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "ServiceMonitor": "servicemonitors",
}


def object_path(ref: ObjectRef) -> str:
    """/api/v1/namespaces/ns/services/name, /apis/apps/v1/namespaces/ns/daemonsets/name, ..."""
    plural = PLURALS.get(ref.kind)
    if plural is None:
        raise WriteError(0, f"{ref.kind} {ref.name}: not a kind the operator deploys")
    prefix = "/api/v1" if ref.api_version == "v1" else f"/apis/{ref.api_version}"
    scope = f"/namespaces/{ref.namespace}" if ref.namespace else ""
    return f"{prefix}{scope}/{plural}/{ref.name}"


class RmdConfigApi:
    """Create with `await RmdConfigApi.create()`; `close()` at exit."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._apps = client.AppsV1Api(api)
        self._objects = client.CustomObjectsApi(api)
        self._extensions = client.ApiextensionsV1Api(api)

    @classmethod
    async def create(cls) -> RmdConfigApi:
        configuration = await asyncio.to_thread(load_configuration)
        return cls(client.ApiClient(configuration=configuration))

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        found = await self._read(
            lambda: self._core.read_namespaced_config_map(name, namespace, _request_timeout=_TIMEOUT)
        )
        return dict(found.data or {}) if found is not None else None

    async def crd_exists(self, name: str) -> bool:
        found = await self._call(
            lambda: self._extensions.list_custom_resource_definition(
                field_selector=f"metadata.name={name}", _request_timeout=_TIMEOUT
            )
        )
        return bool(found.items)

    async def apply(self, obj: Mapping[str, Any]) -> None:
        path = object_path(ObjectRef.of(obj))
        query = [("fieldManager", MANAGER), ("force", "true")]
        await self._call(lambda: self._raw("PATCH", path, query, "application/apply-patch+yaml", dict(obj)))

    async def delete(self, ref: ObjectRef) -> None:
        path = object_path(ref)
        try:
            await self._call(lambda: self._raw("DELETE", path, [], None, None))
        except WriteError as exc:
            if exc.status != 404:
                raise

    def _raw(
        self, method: str, path: str, query: list[tuple[str, str]], content_type: str | None, body: Any
    ) -> None:
        """One request to a path of any kind (the client's typed methods know one kind each)."""
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type  # JSON is YAML: a dict body is sent as JSON
        request = self._api.param_serialize(
            method, path, query_params=query, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = self._api.call_api(*request, _request_timeout=_TIMEOUT)
        data = response.read()
        if not 200 <= response.status < 300:
            raise ApiException(
                status=response.status, reason=response.reason, body=data.decode(errors="replace")
            )

    async def read_daemonset(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = await self._read(
            lambda: self._apps.read_namespaced_daemon_set(name, namespace, _request_timeout=_TIMEOUT)
        )
        return self._api.sanitize_for_serialization(found) if found is not None else None

    async def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        found = await self._call(
            lambda: self._core.list_namespaced_pod(
                namespace, label_selector=selector, _request_timeout=_TIMEOUT
            )
        )
        return [self._api.sanitize_for_serialization(p) for p in found.items]

    async def node_labels(self) -> dict[str, dict[str, str]]:
        found = await self._call(lambda: self._core.list_node(_request_timeout=_TIMEOUT))
        nodes = [self._api.sanitize_for_serialization(n) for n in found.items]
        return {n["metadata"]["name"]: dict(n["metadata"].get("labels") or {}) for n in nodes}

    async def list_node_states(self, namespace: str) -> list[dict[str, Any]]:
        found = await self._call(
            lambda: self._objects.list_namespaced_custom_object(
                RMD_NODE_STATE.group,
                RMD_NODE_STATE.version,
                namespace,
                RMD_NODE_STATE.plural,
                _request_timeout=_TIMEOUT,
            )
        )
        items: list[dict[str, Any]] = (found.get("items") or []) if isinstance(found, dict) else []
        return items

    async def patch_status(self, name: str, status: Mapping[str, Any]) -> None:
        await self._call(
            lambda: self._objects.patch_cluster_custom_object_status(
                RMD_CONFIG.group,
                RMD_CONFIG.version,
                RMD_CONFIG.plural,
                name,
                {"status": dict(status)},
                _content_type="application/merge-patch+json",
                _request_timeout=_TIMEOUT,
            )
        )

    async def _read(self, call: Callable[[], _T]) -> _T | None:
        try:
            return await self._call(call)
        except WriteError as exc:
            if exc.status == 404:
                return None
            raise

    async def _call(self, call: Callable[[], _T]) -> _T:
        try:
            return await asyncio.to_thread(call)
        except ApiException as exc:
            body = status_body(exc)
            raise WriteError(
                exc.status or 0, str(body.get("message") or f"{exc.status} {exc.reason}")
            ) from None
        except (
            OSError,
            urllib3.exceptions.HTTPError,
        ) as exc:  # unreachable or timed out, after urllib3's retries
            raise WriteError(0, str(exc)) from None

    def close(self) -> None:
        self._api.close()
