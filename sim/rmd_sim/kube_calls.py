"""The synchronous kubernetes client from asyncio, as the simulated kubelet's node (rmd_sim.kubelet_api) uses
it: calls in threads, answers as plain JSON, patches as strategic merge patches."""

from __future__ import annotations

import asyncio
import datetime
import json
from typing import Any

from kubernetes.client.exceptions import ApiException

Obj = dict[str, Any]

STRATEGIC_MERGE = "application/strategic-merge-patch+json"


async def api_call(method: Any, *args: Any, missing_ok: bool = False, **kwargs: Any) -> Obj | None:
    """`method(*args, **kwargs)`'s answer as plain JSON; None for 404 when `missing_ok`."""
    try:
        response = await asyncio.to_thread(method, *args, _preload_content=False, **kwargs)
    except ApiException as exc:
        if missing_ok and exc.status == 404:
            return None
        raise
    result: Obj = json.loads(response.data)
    return result


async def api_patch(method: Any, *args: Any) -> None:
    await asyncio.to_thread(method, *args, _content_type=STRATEGIC_MERGE)


def describe(exc: Exception) -> str:
    return f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)


def timestamp() -> str:
    """The current time as the API writes timestamps."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
