"""The agent's Kubernetes client: one way to build it, and `KubeObjectClient`, the requests of
kube_object_writer.ObjectWriter.

`create_api_client` makes a kube_api.KubeApi for the in-cluster service account (settings.kubeconfig empty)
or for a kubeconfig file (kube_config.py says what it takes from one). A proxy is never taken from the
environment: the agent talks to its own cluster's API server, and an HTTPS_PROXY meant for image pulls or
outbound traffic must not see its token. A kubeconfig that names a proxy (`proxy-url`) explicitly is still
honoured.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rmd_agent.errors import KubeApiError
from rmd_agent.kube_api import JSON, MERGE_PATCH, KubeApi, object_path
from rmd_agent.kube_config import load_in_cluster, load_kubeconfig
from rmd_agent.kube_object_writer import ObjectRef
from rmd_agent.settings import AgentSettings

Obj = dict[str, Any]


def create_api_client(settings: AgentSettings) -> KubeApi:
    """A client for the in-cluster service account, or for settings.kubeconfig when set.

    ConfigError when neither works (no kubeconfig file, or not running in a pod)."""
    config = load_kubeconfig(Path(settings.kubeconfig)) if settings.kubeconfig else load_in_cluster()
    return KubeApi(config)


def api_client_factory(settings: AgentSettings) -> Callable[[], KubeApi]:
    """A no-argument factory, as NodeStateWriter, the heartbeat and the NodeResourceTopology exporter take."""
    return functools.partial(create_api_client, settings)


def merge_patch(current: Any, desired: Any) -> Any:
    """The JSON merge patch (RFC 7386) turning `current` into `desired`; {} when they are equal.

    Keys `current` has and `desired` lacks become null (deleted); lists and scalars are replaced whole.
    Mappings in `desired` must not hold None values (merge patch cannot express them)."""
    if not isinstance(current, Mapping) or not isinstance(desired, Mapping):
        return desired
    patch: Obj = {key: None for key in current if key not in desired}
    for key, value in desired.items():
        if key not in current:
            patch[key] = value
        elif current[key] != value:
            patch[key] = merge_patch(current[key], value)
    return patch


class KubeObjectClient:
    """The ObjectClient of kube_object_writer over the API: `ref`, cluster-scoped or namespaced, and Nodes.
    Writes are by `field_manager` with fieldValidation=Strict: a field the CRD does not know is an error, not
    silently pruned."""

    def __init__(self, api: KubeApi, ref: ObjectRef, field_manager: str) -> None:
        self.ref = ref
        self._api = api
        self._write_query = {"fieldManager": field_manager, "fieldValidation": "Strict"}

    async def get(self) -> Obj | None:
        try:
            return await self._api.call("GET", self._path(self.ref.name))
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            return None

    async def create(self, body: Obj) -> Obj:
        return await self._write("POST", self._path(None), body)

    async def replace(self, body: Obj) -> Obj:
        return await self._write("PUT", self._path(self.ref.name), body)

    async def patch(self, body: Obj) -> Obj:
        return await self._write("PATCH", self._path(self.ref.name), body, MERGE_PATCH)

    async def patch_status(self, body: Obj) -> Obj:
        return await self._write("PATCH", self._path(self.ref.name, "status"), body, MERGE_PATCH)

    async def node_uid(self, node: str) -> str | None:
        try:
            found = await self._api.call("GET", object_path("", "v1", "nodes", name=node))
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            return None
        uid: str = found["metadata"]["uid"]
        return uid

    async def _write(self, method: str, path: str, body: Obj, content_type: str = JSON) -> Obj:
        return await self._api.call(
            method, path, query=self._write_query, body=body, content_type=content_type
        )

    def _path(self, name: str | None, subresource: str | None = None) -> str:
        ref = self.ref
        return object_path(
            ref.group, ref.version, ref.plural, namespace=ref.namespace, name=name, subresource=subresource
        )
