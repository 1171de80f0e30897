"""The agent's Kubernetes client: one way to build it, and conditional status writes.

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

from rmd_agent.errors import ConfigError
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


async def patch_status_if_changed(
    objects: client.CustomObjectsApi,
    current: Mapping[str, Any],
    desired_status: Mapping[str, Any],
    *,
    group: str,
    version: str,
    plural: str,
    field_manager: str | None = None,
) -> Obj | None:
    """Write `desired_status` through the status subresource of the namespaced custom object `current`,
    only if it differs from current's status; returns the object the server answered, None if unchanged.

    The patch carries current's resourceVersion, so the write is conditional on nobody having changed the
    object since it was read: ApiException 409 then (re-read and retry), 404 if it was deleted."""
    patch = merge_patch(current.get("status") or {}, desired_status)
    if not patch:
        return None
    metadata = current["metadata"]
    body = {"metadata": {"resourceVersion": metadata["resourceVersion"]}, "status": patch}
    result: Obj = await call(
        objects.patch_namespaced_custom_object_status,
        group,
        version,
        metadata["namespace"],
        plural,
        metadata["name"],
        body,
        field_manager=field_manager,
        field_validation="Strict",
        _content_type=MERGE_PATCH,
    )
    return result
