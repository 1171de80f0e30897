"""One pod's resources from the kubelet: PodResources `Get` where the kubelet offers it, `List` where not.

`Get` is behind the kubelet feature gate KubeletPodResourcesGet: alpha (off by default) from 1.27, beta (on by
default) from 1.34, GA and locked on from 1.36. A kubelet with the gate off answers Get with status UNKNOWN
and the message "PodResources API Get method disabled"; one older than 1.27 has no Get (UNIMPLEMENTED). Only
those two answers (PodResourcesClient raises GetUnavailable for them) switch lookups to `List`, which every
kubelet with the v1 API offers: the pod is picked from all active pods by namespace and name. Any other
failure (kubelet down, deadline missed, rate limit) is passed on to the caller and changes nothing.

The outcome is remembered, so later lookups go straight to `List` instead of asking Get first every time.
Get is asked again on the first lookup after GET_RECHECK_SECONDS: a kubelet restarted with the gate turned
on is noticed then (at the latest), and lookups go back to Get. A kubelet that loses Get (restarted with the
gate off) is noticed at the next lookup, which then falls back at once.

`api` says what lookups use, for `rmd-agent probe` and the RmdNodeState (capability `podResourcesGet`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rmd_agent.kubelet.podresources import GetUnavailable, PodResources, PodResourcesClient

log = logging.getLogger(__name__)

GET_RECHECK_SECONDS = 600.0  # while Get is unavailable, ask it again this often (on the next lookup)

# What check() asks Get for when the kubelet lists no pod: no pod has this name, so a kubelet offering Get
# answers "not found", one that does not offer it answers as it always does.
_CHECK_POD = ("kube-system", "rmd-agent-podresources-get-check")


@dataclass(frozen=True)
class LookupApi:
    """Which PodResources API pod lookups use. `get` None: not known yet (no lookup or check answered)."""

    get: bool | None
    kubelet_message: str = ""  # the kubelet's answer to Get, when it does not offer it

    def describe(self) -> str:
        """What lookups use: "Get", "List (Get disabled: <the kubelet's answer>)" or "not known yet"."""
        if self.get is None:
            return "not known yet"
        if self.get:
            return "Get"
        return f"List (Get disabled: {self.kubelet_message})"


class PodLookup:
    """Finds pods through `client` (entered by the caller), choosing Get or List as described above. Safe to
    use from concurrent tasks of one event loop."""

    def __init__(
        self,
        client: PodResourcesClient,
        *,
        recheck_seconds: float = GET_RECHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._recheck_seconds = recheck_seconds
        self._clock = clock
        self._api = LookupApi(None)
        self._recheck_at = 0.0

    @property
    def api(self) -> LookupApi:
        return self._api

    @property
    def client(self) -> PodResourcesClient:
        return self._client

    async def find(self, namespace: str, name: str) -> PodResources | None:
        """The pod's resources, or None if the kubelet has no such (active) pod. KubeletUnavailable."""
        if self._api.get is False and self._clock() < self._recheck_at:
            return _pick(await self._client.list(), namespace, name)
        try:
            found = await self._client.get(namespace, name)
        except GetUnavailable as exc:
            self._unavailable(exc)
            return _pick(await self._client.list(), namespace, name)
        self._available()
        return found

    async def check(self, pods: Sequence[PodResources] | None = None) -> LookupApi:
        """Find out now whether the kubelet offers Get, without waiting for a lookup: Get one of `pods` (what
        List answered; listed here when None) or, when there are none, a pod that does not exist (a "not
        found" answer shows Get works as well). KubeletUnavailable when the kubelet cannot tell."""
        if pods is None:
            pods = await self._client.list()
        namespace, name = (pods[0].namespace, pods[0].name) if pods else _CHECK_POD
        try:
            await self._client.get(namespace, name)
        except GetUnavailable as exc:
            self._unavailable(exc)
        else:
            self._available()
        return self._api

    def _unavailable(self, exc: GetUnavailable) -> None:
        self._recheck_at = self._clock() + self._recheck_seconds
        message = exc.details or exc.code.name
        if self._api != LookupApi(False, message):
            log.warning(
                "the kubelet does not offer PodResources Get (it answers %s: %s): looking pods up with List; "
                "Get is asked again every %gs. Turn the kubelet feature gate KubeletPodResourcesGet on "
                "(the default from Kubernetes 1.34) to use Get",
                exc.code.name,
                message,
                self._recheck_seconds,
            )
        self._api = LookupApi(False, message)

    def _available(self) -> None:
        if self._api.get is False:
            log.info("the kubelet offers PodResources Get again: looking pods up with Get")
        self._api = LookupApi(True)


def _pick(pods: Sequence[PodResources], namespace: str, name: str) -> PodResources | None:
    return next((p for p in pods if p.namespace == namespace and p.name == name), None)
