"""The pod flow's own watch of the cluster's pods, whose cost does not grow with the pods it does not want.

kopf lists and watches a resource whole and filters on the client; for each object it sees it keeps a record
for the life of the object (a few KiB each), and its first list used to arrive in one piece. With 5,000
ordinary pods in a cluster that cost the operator over 100 MiB (bench/operator_rss.py). This watch:

* lists pods bound to a node (the server-side field selector `spec.nodeName!=`), in one namespace or in all,
  in pages of `page_size`, and watches from the list's resourceVersion with bookmarks, resuming where it
  stopped after a timeout or a dropped connection and listing again only when the server says the version
  is too old (410 Gone);
* parses one page or one event at a time and keeps only the uids of the pods it delivered (`wanted`: in a
  handled namespace and asking for cache ways): nothing of any other pod outlives its parse;
* after listing again, delivers a DELETED for each delivered pod the new list no longer has, so a deletion
  missed while the watch was down still stops the pod's flow.

The `kubernetes` client is synchronous, so the loop runs in one thread of its own; each delivery is handed to
the event loop in order (`loop.call_soon_threadsafe`). The thread is a daemon that `stop()` asks to finish.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_operator import pods
from rmd_operator.kube import load_configuration

log = logging.getLogger(__name__)

BOUND = "spec.nodeName!="
_LIST_TIMEOUT_SECONDS = 60.0
_RETRY_SECONDS = (0.5, 30.0)  # first and longest pause after a failed request

Obj = dict[str, Any]
Deliver = Callable[[str | None, Obj], None]  # (event type, None for the list; the pod)


class ListExpired(Exception):
    """The resourceVersion to resume from is too old: list again."""


def wanted(pod: Mapping[str, Any], namespaces: tuple[str, ...]) -> bool:
    """Whether the pod flow wants this pod: bound, in a handled namespace, asking for cache ways."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if namespaces and meta.get("namespace") not in namespaces:
        return False
    return bool(spec.get("nodeName")) and pods.asks_for_cache_ways(spec)


def split_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Complete newline-terminated lines of a byte stream (a watch sends one JSON event per line)."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        yield from (line for line in lines if line.strip())
    if buffer.strip():
        yield buffer


class PodWatch:
    """List-then-watch of bound pods, delivering the wanted ones. `start()` once, `stop()` at exit."""

    def __init__(
        self,
        core: Any,
        deliver: Deliver,
        *,
        namespace: str | None = None,
        page_size: int = 500,
        timeout_seconds: int = 300,
    ) -> None:
        self._core = core  # a kubernetes.client.CoreV1Api
        self._deliver = deliver
        self._namespace = namespace  # None: every namespace (then the RBAC must allow it cluster-wide)
        self._namespaces = (namespace,) if namespace else ()
        self._page_size = page_size
        self._timeout = timeout_seconds
        self._delivered: set[str] = set()  # uids of the pods delivered and not yet deleted
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None  # the open watch response, closed by stop()
        self.lists = 0  # how many times the pods were listed (the first and each relist)

    @classmethod
    def on_loop(
        cls, handler: Callable[[str | None, Obj], None], api: client.ApiClient, **kwargs: Any
    ) -> PodWatch:
        """A watch whose deliveries run `handler` on the running event loop."""
        loop = asyncio.get_running_loop()

        def deliver(event_type: str | None, pod: Obj) -> None:
            loop.call_soon_threadsafe(handler, event_type, pod)

        return cls(client.CoreV1Api(api), deliver, **kwargs)

    @staticmethod
    async def api_client() -> client.ApiClient:
        return client.ApiClient(configuration=await asyncio.to_thread(load_configuration))

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="pod-watch", daemon=True)
        self._thread.start()

    def stop(self, wait_seconds: float = 2.0) -> None:
        self._stopped.set()
        response = self._response
        if response is not None:
            response.shutdown()  # wakes the thread out of its read
        if self._thread is not None:
            self._thread.join(wait_seconds)

    # -- the loop (in its thread) -------------------------------------------------------------------------

    def run(self) -> None:
        version: str | None = None
        pause = _RETRY_SECONDS[0]
        while not self._stopped.is_set():
            try:
                if version is None:
                    version = self._list()
                    continue  # (stopped meanwhile?)
                version = self._watch(version)
                pause = _RETRY_SECONDS[0]
            except ListExpired:
                log.info("pod watch: resourceVersion %s is too old; listing the pods again", version)
                version = None
            except (ApiException, OSError, urllib3.exceptions.HTTPError, ValueError) as exc:
                if self._stopped.is_set():
                    break
                message = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)
                log.warning("pod watch: %s; trying again in %.1f s", message, pause)
                self._stopped.wait(pause)
                pause = min(pause * 2, _RETRY_SECONDS[1])

    def _list_call(self, **kwargs: Any) -> Any:
        if self._namespace:
            return self._core.list_namespaced_pod(self._namespace, **kwargs)
        return self._core.list_pod_for_all_namespaces(**kwargs)

    def _list(self) -> str:
        """List the bound pods page by page, delivering the wanted ones; the list's resourceVersion."""
        seen: set[str] = set()
        token: str | None = None
        version = ""
        while True:
            kwargs: dict[str, Any] = {"field_selector": BOUND, "limit": self._page_size}
            if token:
                kwargs["_continue"] = token
            try:
                response = self._list_call(
                    _preload_content=False, _request_timeout=_LIST_TIMEOUT_SECONDS, **kwargs
                )
            except ApiException as exc:
                if exc.status == 410:  # the continue token expired: start the list over
                    raise ListExpired from None
                raise
            page = json.loads(response.data)
            for pod in page.get("items") or ():
                uid = str((pod.get("metadata") or {}).get("uid") or "")
                if wanted(pod, self._namespaces):
                    seen.add(uid)
                    self._delivered.add(uid)
                    self._deliver(None, pod)
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            token = meta.get("continue") or None
            del page
            if not token:
                break
        for uid in sorted(self._delivered - seen):  # deleted while nobody watched
            self._delivered.discard(uid)
            self._deliver("DELETED", {"metadata": {"uid": uid}})
        self.lists += 1
        return version

    def _watch(self, version: str) -> str:
        """Watch from `version` until the server ends the request; the version to resume from."""
        response = self._list_call(
            watch=True,
            field_selector=BOUND,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._timeout,
            _preload_content=False,
            _request_timeout=(10, self._timeout + 30),
        )
        self._response = response
        try:
            for line in split_lines(response.stream(amt=None, decode_content=False)):
                if self._stopped.is_set():
                    break
                version = self._event(json.loads(line), version)
        finally:
            self._response = None
            response.release_conn()
        return version

    def _event(self, event: Mapping[str, Any], version: str) -> str:
        """Handle one watch event; the resourceVersion to resume from after it."""
        kind = event.get("type")
        obj: Obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise ListExpired
            raise ValueError(f"watch error {obj.get('code')}: {obj.get('message')}")
        meta = obj.get("metadata") or {}
        version = str(meta.get("resourceVersion") or version)
        if kind == "BOOKMARK":
            return version
        uid = str(meta.get("uid") or "")
        if kind == "DELETED":
            if uid in self._delivered:
                self._delivered.discard(uid)
                self._deliver("DELETED", obj)
        elif wanted(obj, self._namespaces) or uid in self._delivered:
            self._delivered.add(uid)
            self._deliver(str(kind), obj)
        return version
