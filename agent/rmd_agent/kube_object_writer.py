"""One per-node custom object kept as its writer wants it: created when missing (again after a deletion),
written only when it differs, every write conditional on the resourceVersion read.

`ObjectWriter` remembers the object as the API server last returned it and compares with that, so a sync
that changes nothing costs no request; `verify` re-reads the object and its Node instead of trusting memory.
A write refused because the object changed since it was read (409) re-reads it and compares again; one
refused because it vanished (404) creates it again. After a few such rounds the sync gives up with a 409,
for the caller's retry and backoff. Any failure makes the next sync re-read everything.

What is desired is the caller's: a function building the object to create, and functions telling which
write (a `Change`) the current object needs, if any. The writer talks to an `ObjectClient`, injected as
resource-topology-exporter's NRTUpdater takes its clientset: kube.KubeObjectClient in production, an
in-memory one in tests. Users: node_state.py (RmdNodeState) and nrt/publisher.py (NodeResourceTopology).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from rmd_agent.errors import KubeApiError

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Verb = Literal["replace", "patch", "patch_status"]

CREATED = "created"  # outcomes of a sync, besides the past tense of the last write's verb
UNCHANGED = "unchanged"
ABSENT = "absent"  # the object does not exist and was not created
ATTEMPTS = 3  # rounds of write, conflict, re-read before a sync gives up
_DONE: dict[Verb, str] = {"replace": "replaced", "patch": "patched", "patch_status": "status patched"}


@dataclass(frozen=True)
class ObjectRef:
    """Which object: cluster-scoped when namespace is None. `kind` is for messages."""

    group: str
    version: str
    plural: str
    kind: str
    name: str
    namespace: str | None = None

    @property
    def path(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


class ObjectClient(Protocol):
    """The requests ObjectWriter makes: one custom object, and the uid of a Node.

    get and node_uid answer None for an absent object. The others return the object as stored, or raise
    KubeApiError: create 409 when the object exists; replace and the patches (JSON merge patches) 409 when
    the resourceVersion in the body is not the stored one, 404 when the object is gone."""

    @property
    def ref(self) -> ObjectRef: ...

    async def get(self) -> Obj | None: ...

    async def create(self, body: Obj) -> Obj: ...

    async def replace(self, body: Obj) -> Obj: ...

    async def patch(self, body: Obj) -> Obj: ...

    async def patch_status(self, body: Obj) -> Obj: ...

    async def node_uid(self, node: str) -> str | None: ...


@dataclass(frozen=True)
class Change:
    """One write the object needs. The writer adds the resourceVersion it read, making the write conditional.

    body: the whole object for "replace", a JSON merge patch for "patch" and "patch_status".
    message: logged at `level` once written; by default "<kind> <name> <verb>ed"."""

    verb: Verb
    body: Obj
    message: str = ""
    level: int = logging.INFO


Build = Callable[[str | None], Obj]  # the object to create, given its Node's uid (None: no Node)
Desire = Callable[[Obj, str | None], Change | None]  # the write the current object needs, given the uid


def node_owner_reference(node: str, uid: str) -> Obj:
    """A Node as owner, so that the garbage collector deletes the object with it (a cluster-scoped owner of
    a namespaced object is allowed). No blockOwnerDeletion: it needs update on nodes/finalizers."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}


class ObjectWriter:
    """Keeps one object as desired through `client` (see the module docstring).

    `node` is the Node the object belongs to. With `needs_node` the object is created only while that Node
    exists (an object it does not own would outlive it) and a missing Node is looked for again at verify;
    without, the object is created ownerless and the Node looked for at every sync until it appears.
    `logger` is the caller's, so messages keep their origin."""

    def __init__(
        self, client: ObjectClient, node: str, *, needs_node: bool, logger: logging.Logger = log
    ) -> None:
        self.client = client
        self.node = node
        self._needs_node = needs_node
        self._log = logger
        self._current: Obj | None = None  # the object as the API server last returned it
        self._known = False  # whether _current reflects the server (None then means "absent")
        self._node_uid: str | None = None
        self._node_missing = False  # warned that the Node does not exist
        self.writes = 0  # creates and updates
        self.conflicts = 0  # updates refused because the object changed or vanished since it was read

    @property
    def current(self) -> Obj | None:
        """The object as the API server last returned it (None when absent or not read yet)."""
        return self._current

    async def read(self) -> None:
        """Read the Node and the object now, as a verifying sync would, so that the next sync without verify
        starts from them: the caller can overlap these round trips with computing what to write."""
        try:
            await self._read_node()
            await self._refresh()
        except Exception:
            self._known = False
            raise

    async def sync(self, build: Build | None, changes: Sequence[Desire], *, verify: bool = False) -> str:
        """Create the object when missing (with `build`), then make each of `changes` that the object needs,
        in order, each judged on the object as the previous one left it. Returns CREATED, UNCHANGED, ABSENT
        or the last write's verb in the past tense ("replaced").

        `build` None updates the object as it is: it is neither created nor its Node read (a last write
        at shutdown). KubeApiError 409 when the object keeps changing under the writes."""
        try:
            fresh = verify or not self._known
            if build is not None and (fresh or (self._node_uid is None and not self._needs_node)):
                await self._read_node()
            if fresh:
                await self._refresh()
            return await self._converge(build, changes, node_read=fresh)
        except Exception:
            self._known = False  # read everything again next time
            raise

    async def _converge(self, build: Build | None, changes: Sequence[Desire], *, node_read: bool) -> str:
        outcome = UNCHANGED
        for _ in range(ATTEMPTS):
            if self._current is None:
                if build is None or not await self._may_create(node_read):
                    return ABSENT
                node_read = True
                if not await self._create(build(self._node_uid)):
                    continue  # it appeared meanwhile: compare with it
                outcome = CREATED
            for desire in changes:
                assert self._current is not None
                change = desire(self._current, self._node_uid)
                if change is None:
                    continue
                if not await self._write(change):
                    break  # re-read or gone: start over
                if outcome != CREATED:
                    outcome = _DONE[change.verb]
            else:
                return outcome
        ref = self.client.ref
        raise KubeApiError(status=409, reason=f"{ref.kind} {ref.name} keeps changing")

    async def _may_create(self, node_read: bool) -> bool:
        if not self._needs_node:
            return True
        if not node_read:
            if self._node_missing:
                return False  # look for the Node again at the next verify, not at every sync
            # The object vanished: perhaps with its Node (garbage collection), or the Node was re-created
            # with a new uid. Read it again before creating.
            await self._read_node()
        return self._node_uid is not None

    async def _read_node(self) -> None:
        self._node_uid = await self.client.node_uid(self.node)
        if self._node_uid is None and not self._node_missing:
            ref = self.client.ref
            consequence = (
                f"{ref.kind} {ref.name} is not created until it exists"
                if self._needs_node
                else f"its {ref.kind} gets no owner"
            )
            self._log.warning("Node %s not found: %s", self.node, consequence)
        self._node_missing = self._node_uid is None

    async def _refresh(self) -> None:
        self._current = await self.client.get()
        self._known = True

    async def _create(self, body: Obj) -> bool:
        """True when created; False when it already existed (then _current holds it)."""
        try:
            self._current = await self.client.create(body)
        except KubeApiError as exc:
            if exc.status != 409:
                raise
            await self._refresh()
            return False
        self.writes += 1
        self._log.info("%s %s created", self.client.ref.kind, self.client.ref.path)
        return True

    async def _write(self, change: Change) -> bool:
        """True when written; False when the object changed (re-read) or vanished (then absent)."""
        assert self._current is not None
        metadata = {**(change.body.get("metadata") or {})}
        metadata["resourceVersion"] = self._current["metadata"]["resourceVersion"]
        body = {**change.body, "metadata": metadata}
        send = {
            "replace": self.client.replace,
            "patch": self.client.patch,
            "patch_status": self.client.patch_status,
        }[change.verb]
        try:
            written = await send(body)
        except KubeApiError as exc:
            if exc.status not in (404, 409):
                raise
            self.conflicts += 1
            if exc.status == 404:
                self._current = None
            else:
                await self._refresh()
            return False
        self._current = written
        self.writes += 1
        if change.message:
            self._log.log(change.level, "%s", change.message)
        else:
            ref = self.client.ref
            self._log.log(change.level, "%s %s %s", ref.kind, ref.name, _DONE[change.verb])
        return True
