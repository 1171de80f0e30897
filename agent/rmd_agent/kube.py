"""The agent's Kubernetes client: one way to build it, and `KubeObjectClient`, the requests of
kube_object_writer.ObjectWriter.

`create_api_client` loads the in-cluster service account (settings.kubeconfig empty) or a kubeconfig file.
A proxy is never taken from the environment: the agent talks to its own cluster's API server, and an
HTTPS_PROXY meant for image pulls or outbound traffic must not see its token. A kubeconfig that names a
proxy (`proxy-url`) explicitly is still honoured.

The kubernetes client is synchronous: `call` runs a request in a worker thread with a timeout.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from rmd_agent.errors import ConfigError
from rmd_agent.kube_object_writer import ObjectRef
from rmd_agent.settings import AgentSettings

REQUEST_TIMEOUT_SECONDS = 10.0
MERGE_PATCH = "application/merge-patch+json"

Obj = dict[str, Any]


def create_api_client(settings: AgentSettings) -> client.ApiClient:
    """An ApiClient for the in-cluster service account, or for settings.kubeconfig when set.

    ConfigError when neither works (no kubeconfig file, or not running in a pod)."""
    configuration = client.Configuration()
    configuration.proxy = None  # explicit: otherwise HTTPS_PROXY/ALL_PROXY from the environment is used
    try:
        if settings.kubeconfig:
            config.load_kube_config(  # type: ignore[no-untyped-call]  # the loader has no annotations
                config_file=settings.kubeconfig, client_configuration=configuration
            )
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError) as exc:
        where = f"kubeconfig {settings.kubeconfig}" if settings.kubeconfig else "in-cluster config"
        raise ConfigError(f"cannot configure the Kubernetes client from the {where}: {exc}") from None
    return client.ApiClient(configuration=configuration)


def api_client_factory(settings: AgentSettings) -> Callable[[], client.ApiClient]:
    """A no-argument factory, as NodeStateWriter and the NodeResourceTopology exporter take."""
    return functools.partial(create_api_client, settings)


async def call(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """One API request in a worker thread, bounded by REQUEST_TIMEOUT_SECONDS."""
    return await asyncio.to_thread(method, *args, _request_timeout=REQUEST_TIMEOUT_SECONDS, **kwargs)


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
    """The ObjectClient of kube_object_writer over the kubernetes client: `ref`, cluster-scoped or namespaced,
    and Nodes. Writes are by `field_manager` with fieldValidation=Strict: a field the CRD does not know is an
    error, not silently pruned."""

    def __init__(self, api_client: Any, ref: ObjectRef, field_manager: str) -> None:
        self.ref = ref
        self._field_manager = field_manager
        self._objects = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    async def get(self) -> Obj | None:
        try:
            found: Obj = await self._request("get_{}_custom_object", self.ref.name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None
        return found

    async def create(self, body: Obj) -> Obj:
        return await self._write("create_{}_custom_object", body)

    async def replace(self, body: Obj) -> Obj:
        return await self._write("replace_{}_custom_object", self.ref.name, body)

    async def patch(self, body: Obj) -> Obj:
        return await self._write("patch_{}_custom_object", self.ref.name, body, _content_type=MERGE_PATCH)

    async def patch_status(self, body: Obj) -> Obj:
        return await self._write(
            "patch_{}_custom_object_status", self.ref.name, body, _content_type=MERGE_PATCH
        )

    async def node_uid(self, node: str) -> str | None:
        try:
            found = await call(self._core.read_node, node)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None
        uid: str = found.metadata.uid
        return uid

    async def _write(self, method: str, *args: Any, **kwargs: Any) -> Obj:
        kwargs.update(field_manager=self._field_manager, field_validation="Strict")
        written: Obj = await self._request(method, *args, **kwargs)
        return written

    async def _request(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """CustomObjectsApi's `method` ("get_{}_custom_object") in the object's scope, with its address."""
        ref = self.ref
        if ref.namespace is None:
            where: tuple[str, ...] = (ref.group, ref.version, ref.plural)
            scoped = method.format("cluster")
        else:
            where = (ref.group, ref.version, ref.namespace, ref.plural)
            scoped = method.format("namespaced")
        return await call(getattr(self._objects, scoped), *where, *args, **kwargs)
