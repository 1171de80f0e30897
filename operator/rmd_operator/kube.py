"""The operator's own writes to the Kubernetes API: RmdWorkload status, through the status subresource.

kopf applies a handler's `patch` only when the handler returns, and a per-workload daemon never returns while
it runs, so the reconciler writes status itself, under the workload's lock, in the order it decides it. The
`kubernetes` client is synchronous: every call runs in a worker thread, never on the event loop. Credentials
are found the way kopf finds its own (in-cluster service account first, then KUBECONFIG), and like kopf the
client ignores HTTP(S)_PROXY.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from rmd_api.names import RMD_WORKLOAD
from rmd_operator.errors import OperatorError

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT_SECONDS = 30.0


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

        def call() -> None:
            self._objects.patch_namespaced_custom_object_status(
                RMD_WORKLOAD.group,
                RMD_WORKLOAD.version,
                namespace,
                RMD_WORKLOAD.plural,
                name,
                dict(patch),
                _content_type="application/merge-patch+json",
                _request_timeout=_REQUEST_TIMEOUT_SECONDS,
            )

        try:
            await asyncio.to_thread(call)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise KubeError(f"status of {namespace}/{name}: {exc.status} {exc.reason}") from None
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # connection trouble, after urllib3's retries
            raise KubeError(f"status of {namespace}/{name}: {exc}") from None
        return True

    def close(self) -> None:
        self._api.close()
