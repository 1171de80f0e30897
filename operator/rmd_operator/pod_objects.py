"""The pod flow's reads and writes in the API: the PodObjects protocol and its implementation over the
`kubernetes` client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, Protocol

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_api.names import RMD_WORKLOAD
from rmd_operator.errors import OperatorError
from rmd_operator.kube import KubeError, load_configuration

_REQUEST_TIMEOUT_SECONDS = 30.0

Obj = dict[str, Any]


class ObjectRefused(OperatorError):
    """The API server refused a write for a reason retrying will not fix (invalid, forbidden)."""


class PodObjects(Protocol):
    """The pod flow's reads and writes in the API. KubeError for trouble worth retrying, ObjectRefused for the
    rest."""

    async def get_workload(self, namespace: str, name: str) -> Obj | None: ...

    async def create_workload(self, body: Mapping[str, Any]) -> Obj | None:
        """The created object; None when one of that name exists already."""

    async def patch_workload(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Obj | None:
        """The patched object; None when it is gone."""

    async def delete_workload(self, namespace: str, name: str, uid: str) -> None:
        """Delete it if it still is the object with `uid`."""

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the pod if it still is the one with `uid`; whether it was deleted by this call."""

    async def pod_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the pod of that name, None if there is none."""

    async def container_started(self, namespace: str, name: str, uid: str, container: str) -> bool:
        """Whether the pod with `uid` shows the container started (running or ended) in its status."""


def _api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")


class PodObjectsApi:
    """PodObjects over the `kubernetes` client, every call in a worker thread. `close()` at exit."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self._objects = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)

    @classmethod
    async def create(cls) -> PodObjectsApi:
        configuration = await asyncio.to_thread(load_configuration)
        return cls(client.ApiClient(configuration=configuration))

    def close(self) -> None:
        self._api.close()

    async def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Obj | None:
        """The answer as plain JSON; None for 404 and 409 (gone, exists, or a failed uid precondition)."""

        def call() -> Any:
            return method(*args, _request_timeout=_REQUEST_TIMEOUT_SECONDS, _preload_content=False, **kwargs)

        try:
            response = await asyncio.to_thread(call)
        except ApiException as exc:
            if exc.status in (404, 409):
                return None
            if exc.status in (400, 403, 422):
                raise ObjectRefused(f"{what}: {_api_message(exc)}") from None
            raise KubeError(f"{what}: {_api_message(exc)}") from None
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            raise KubeError(f"{what}: {exc}") from None
        result: Obj = json.loads(response.data) if response.data else {}
        return result

    async def get_workload(self, namespace: str, name: str) -> Obj | None:
        return await self._call(
            f"read RmdWorkload {namespace}/{name}",
            self._objects.get_namespaced_custom_object,
            RMD_WORKLOAD.group,
            RMD_WORKLOAD.version,
            namespace,
            RMD_WORKLOAD.plural,
            name,
        )

    async def create_workload(self, body: Mapping[str, Any]) -> Obj | None:
        meta = body["metadata"]
        return await self._call(
            f"create RmdWorkload {meta['namespace']}/{meta['name']}",
            self._objects.create_namespaced_custom_object,
            RMD_WORKLOAD.group,
            RMD_WORKLOAD.version,
            meta["namespace"],
            RMD_WORKLOAD.plural,
            dict(body),
        )

    async def patch_workload(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Obj | None:
        return await self._call(
            f"update RmdWorkload {namespace}/{name}",
            self._objects.patch_namespaced_custom_object,
            RMD_WORKLOAD.group,
            RMD_WORKLOAD.version,
            namespace,
            RMD_WORKLOAD.plural,
            name,
            dict(patch),
            _content_type="application/merge-patch+json",
        )

    async def delete_workload(self, namespace: str, name: str, uid: str) -> None:
        await self._call(
            f"delete RmdWorkload {namespace}/{name}",
            self._objects.delete_namespaced_custom_object,
            RMD_WORKLOAD.group,
            RMD_WORKLOAD.version,
            namespace,
            RMD_WORKLOAD.plural,
            name,
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
        )

    async def pod_uid(self, namespace: str, name: str) -> str | None:
        found = await self._call(
            f"read pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace
        )
        return None if found is None else str((found.get("metadata") or {}).get("uid") or "")

    async def container_started(self, namespace: str, name: str, uid: str, container: str) -> bool:
        found = await self._call(
            f"read pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace
        )
        if found is None or (found.get("metadata") or {}).get("uid") != uid:
            return False
        statuses = (found.get("status") or {}).get("containerStatuses") or []
        status: dict[str, Any] = next((s for s in statuses if s.get("name") == container), {})
        state = status.get("state") or {}
        return bool(status.get("started") or state.get("running") or state.get("terminated"))

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        deleted = await self._call(
            f"delete pod {namespace}/{name}",
            self._core.delete_namespaced_pod,
            name,
            namespace,
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
        )
        return deleted is not None
