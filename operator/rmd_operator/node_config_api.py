"""The template controller's writes: NodeConfigs (create, replace the spec, delete) and NodeConfigTemplate
status, through the `kubernetes` client in worker threads.

Each write is conditional on the object the plan saw: the spec is replaced only if the uid is still the one
planned (a JSON patch with a test), and a deletion carries the uid as a precondition, so a NodeConfig deleted
and created again meanwhile is never overwritten or removed by mistake.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_api.names import NODE_CONFIG, NODE_CONFIG_TEMPLATE
from rmd_operator.errors import OperatorError
from rmd_operator.kube import load_configuration

_REQUEST_TIMEOUT_SECONDS = 30.0
_T = TypeVar("_T")


class WriteError(OperatorError):
    """The API server refused a write, or could not be reached (status 0). `invalid_fields`: a 422 naming
    the object's fields (the CRD's schema or rules refused it), as opposed to a 422 of a failed JSON-patch
    test (the object is no longer the one planned)."""

    def __init__(self, status: int, message: str, *, invalid_fields: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.invalid_fields = invalid_fields


class NodeConfigApi:
    """Create with `await NodeConfigApi.create()`; `close()` at exit."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self._objects = client.CustomObjectsApi(api)

    @classmethod
    async def create(cls) -> NodeConfigApi:
        configuration = await asyncio.to_thread(load_configuration)
        return cls(client.ApiClient(configuration=configuration))

    async def create_node_config(self, namespace: str, body: Mapping[str, Any]) -> None:
        await self._call(
            lambda: self._objects.create_namespaced_custom_object(
                NODE_CONFIG.group,
                NODE_CONFIG.version,
                namespace,
                NODE_CONFIG.plural,
                dict(body),
                _request_timeout=_REQUEST_TIMEOUT_SECONDS,
            )
        )

    async def replace_spec(self, namespace: str, name: str, uid: str, spec: Mapping[str, Any]) -> None:
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "replace", "path": "/spec", "value": dict(spec)},
        ]
        await self._call(
            lambda: self._objects.patch_namespaced_custom_object(
                NODE_CONFIG.group,
                NODE_CONFIG.version,
                namespace,
                NODE_CONFIG.plural,
                name,
                patch,
                _content_type="application/json-patch+json",
                _request_timeout=_REQUEST_TIMEOUT_SECONDS,
            )
        )

    async def delete_node_config(self, namespace: str, name: str, uid: str) -> None:
        await self._call(
            lambda: self._objects.delete_namespaced_custom_object(
                NODE_CONFIG.group,
                NODE_CONFIG.version,
                namespace,
                NODE_CONFIG.plural,
                name,
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
                _request_timeout=_REQUEST_TIMEOUT_SECONDS,
            )
        )

    async def patch_template_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        await self._call(
            lambda: self._objects.patch_namespaced_custom_object_status(
                NODE_CONFIG_TEMPLATE.group,
                NODE_CONFIG_TEMPLATE.version,
                namespace,
                NODE_CONFIG_TEMPLATE.plural,
                name,
                {"status": dict(status)},
                _content_type="application/merge-patch+json",
                _request_timeout=_REQUEST_TIMEOUT_SECONDS,
            )
        )

    async def _call(self, call: Callable[[], _T]) -> None:
        try:
            await asyncio.to_thread(call)
        except ApiException as exc:
            body = status_body(exc)
            causes = (
                (body.get("details") or {}).get("causes") if isinstance(body.get("details"), dict) else None
            )
            message = str(body.get("message") or f"{exc.status} {exc.reason}")
            raise WriteError(exc.status or 0, message, invalid_fields=bool(causes)) from None
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # connection trouble, after urllib3's retries
            raise WriteError(0, str(exc)) from None

    def close(self) -> None:
        self._api.close()


def status_body(exc: ApiException) -> dict[str, Any]:
    """The Status object the API server answered with, if any."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}
