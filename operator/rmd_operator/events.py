"""The operator's Events (core/v1), posted in order without blocking the caller.

kopf.event() only works inside kopf's own handler context; the pod flow runs from our pod watch
(pod_watch.py), outside it, so both the reconciler and the pod flow post through this one poster instead: a
queue and a few tasks that create the Events through the `kubernetes` client in worker threads (each Event
carries the time it was posted, so `kubectl get events` shows them in order). An Event that
cannot be written (its namespace is being deleted, the API server refuses it) is logged and dropped after a
few tries: Events are information, never worth holding anything up.

An EventText with `once` gets a name derived from the object's uid and that key instead of a generated one:
posting it again, say after an operator restart, is refused as a duplicate (409), so it exists once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import logging
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_operator.kube import load_configuration
from rmd_operator.status import MESSAGE_LIMIT, EventText

log = logging.getLogger(__name__)

COMPONENT = "rmd-operator"
_TRIES = (0.5, 1.0, 2.0)  # pauses between tries after connection trouble or a server error
_REQUEST_TIMEOUT_SECONDS = 30.0
_SENDERS = 4  # Events in flight at once: a burst of changes must not leave its Events a minute behind
_MAX_NAME = 253


def _shortened(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."


def event_body(
    obj: Mapping[str, Any], event: EventText, *, instance: str, now: datetime.datetime
) -> dict[str, Any]:
    """The Event about `obj` (anything with apiVersion, kind and metadata name/namespace/uid)."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or "default"  # Events of cluster-scoped objects live in default
    involved = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind")}
    involved.update({k: meta[k] for k in ("name", "namespace", "uid") if meta.get(k)})
    stamp = now.isoformat().replace("+00:00", "Z")
    prefix = str(meta.get("name") or "rmd")
    naming: dict[str, str] = {"generateName": f"{prefix}."}
    if event.once:
        digest = hashlib.sha256(f"{meta.get('uid') or ''}/{event.once}".encode()).hexdigest()[:16]
        naming = {"name": f"{prefix[: _MAX_NAME - len(digest) - 1].rstrip('.-')}.{digest}"}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {**naming, "namespace": namespace},
        "involvedObject": involved,
        "type": event.type,
        "reason": event.reason,
        "message": _shortened(event.message),
        "source": {"component": COMPONENT},  # kubectl describe's "From" column
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventPoster:
    """Create with `await EventPoster.create(instance)`; `post()` from the event loop; `close()` at exit."""

    def __init__(self, core: Any, instance: str) -> None:
        self._core = core  # a kubernetes.client.CoreV1Api
        self._instance = instance
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(), name=f"event poster {i}") for i in range(_SENDERS)]

    @classmethod
    async def create(cls, instance: str) -> EventPoster:
        configuration = await asyncio.to_thread(load_configuration)
        return cls(client.CoreV1Api(client.ApiClient(configuration=configuration)), instance)

    def post(self, obj: Mapping[str, Any], event: EventText) -> None:
        now = datetime.datetime.now(datetime.UTC)
        self._queue.put_nowait(event_body(obj, event, instance=self._instance, now=now))

    async def close(self) -> None:
        """Post what is queued (bounded by the tries), then stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout=5.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self._core.api_client.close)

    async def _run(self) -> None:
        while True:
            body = await self._queue.get()
            try:
                await self._send(body)
            finally:
                self._queue.task_done()

    async def _send(self, body: dict[str, Any]) -> None:
        namespace = body["metadata"]["namespace"]
        what = f"Event {body['reason']} on {body['involvedObject'].get('kind')} {namespace}/"
        what += str(body["involvedObject"].get("name"))
        for pause in (*_TRIES, None):
            try:
                await asyncio.to_thread(
                    self._core.create_namespaced_event,
                    namespace,
                    body,
                    _request_timeout=_REQUEST_TIMEOUT_SECONDS,
                    _preload_content=False,
                )
                return
            except ApiException as exc:
                if exc.status == 409 and "name" in body["metadata"]:
                    log.debug("%s: posted before", what)  # an Event posted once (EventText.once)
                    return
                if exc.status < 500 and exc.status != 429:  # refused: trying again will not help
                    log.info("%s not posted: %s %s", what, exc.status, exc.reason)
                    return
                trouble = f"{exc.status} {exc.reason}"
            except (OSError, urllib3.exceptions.HTTPError) as exc:
                trouble = str(exc)
            if pause is None:
                log.warning("%s not posted: %s", what, trouble)
                return
            await asyncio.sleep(pause)
