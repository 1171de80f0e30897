"""Writing an RmdWorkload's status: merge-patch the managed fields where they differ from the object's.

A pass that runs before the watch brought this process's last write back still sees the old status; the writer
remembers (per uid) what it wrote on top of which status, so it does not write the same status twice.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rmd_operator import status as st
from rmd_operator.kube import KubeError

log = logging.getLogger(__name__)


class StatusSink(Protocol):
    async def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool: ...


class StatusWriter:
    def __init__(self, sink: StatusSink, wallclock: Callable[[], str]) -> None:
        self._sink = sink
        self._wallclock = wallclock
        # uid -> (the object's status a write was computed from, the status after that write)
        self._written: dict[str, tuple[Mapping[str, Any], Mapping[str, Any]]] = {}

    def forget(self, uid: str) -> None:
        self._written.pop(uid, None)

    async def write(
        self,
        body: Mapping[str, Any],
        outcomes: Mapping[str, st.Outcome],
        generation: int,
        spec_error: str | None = None,
    ) -> bool:
        """Patch the managed status fields where they differ from the object's; False if the write failed."""
        meta = body.get("metadata") or {}
        namespace, name, uid = (str(meta.get(k) or "") for k in ("namespace", "name", "uid"))
        current = body.get("status") or {}
        written = self._written.get(uid)
        if written is not None:
            if written[0] == current:  # the watch has not brought our last write back yet
                current = written[1]
            else:
                del self._written[uid]  # the watch caught up (or someone else wrote): the object is the truth
        entries = {node: st.entry(o) for node, o in sorted(outcomes.items())}
        desired = st.desired_status(entries, generation, current, self._wallclock(), spec_error)
        patch = st.status_patch(current, desired)
        if patch is None:
            return True
        try:
            await self._sink.patch_status(namespace, name, patch)
        except KubeError as exc:
            log.warning(
                "status write of %s/%s failed; retrying: %s",
                namespace,
                name,
                exc,
                extra={"workload": f"{namespace}/{name}", "error": str(exc)},
            )
            return False
        self._written[uid] = (
            copy.deepcopy(dict(body.get("status") or {})),
            {**copy.deepcopy(dict(current)), **desired},
        )
        return True
