"""Write this node's NodeResourceTopology: create it when missing, replace it only when its content changed.

The object is named after the node and owned by the Node (so it goes when the Node goes). The publisher
remembers the object the API server last returned and compares the desired content with it, so a refresh
that changes nothing costs no request at all; a `verify` pass (the exporter's periodic resync) reads the
object and the Node again, which recreates an object someone deleted and repairs one someone edited.
Replaces carry the resourceVersion read, so a concurrent edit is detected (409) and re-read, not
overwritten blindly. Writes use fieldValidation=Strict: a field the CRD does not know is an error, not
silently pruned.

The kubernetes client is synchronous; each call runs in a worker thread with a request timeout. Only this
node's objects are touched: GET of its Node, GET/POST/PUT of its NodeResourceTopology.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_agent.nrt.zones import NodeTopology
from rmd_api.names import NODE_RESOURCE_TOPOLOGY as NRT

log = logging.getLogger(__name__)

# The object's API names (rmd_api.names), as the client calls below take them.
GROUP, VERSION, PLURAL = NRT.group, NRT.version, NRT.plural
API_VERSION, KIND = NRT.api_version, NRT.kind
FIELD_MANAGER = "rmd-agent"
REQUEST_TIMEOUT_SECONDS = 10.0
_CONFLICT_RETRIES = 3

Obj = dict[str, Any]


def owner_reference(node: Any) -> Obj:
    """The reference RTE sets: {v1, Node, name, uid}."""
    return {"apiVersion": "v1", "kind": "Node", "name": node.metadata.name, "uid": node.metadata.uid}


def desired_object(
    node_name: str, topology: NodeTopology, annotations: Mapping[str, str], owner: Obj | None
) -> Obj:
    metadata: Obj = {"name": node_name}
    if annotations:
        metadata["annotations"] = dict(sorted(annotations.items()))
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, **topology.content()}


def managed_view(obj: Mapping[str, Any], annotation_keys: frozenset[str]) -> Obj:
    """The parts of an object this publisher decides; two objects equal here need no write."""
    metadata = obj.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    return {
        "zones": obj.get("zones"),
        "attributes": obj.get("attributes"),
        "topologyPolicies": obj.get("topologyPolicies"),
        "ownerReferences": metadata.get("ownerReferences") or None,
        "annotations": {k: annotations[k] for k in sorted(annotation_keys) if k in annotations},
    }


def merged_object(current: Mapping[str, Any], desired: Mapping[str, Any]) -> Obj:
    """`current` with our parts replaced: other writers' labels and annotations survive, the deprecated
    topologyPolicies does not, and resourceVersion makes the replace conditional."""
    body = copy.deepcopy(dict(current))
    body.pop("topologyPolicies", None)
    body.pop("status", None)
    body["zones"] = desired["zones"]
    body["attributes"] = desired["attributes"]
    metadata = body.setdefault("metadata", {})
    wanted = desired["metadata"]
    if "ownerReferences" in wanted:
        metadata["ownerReferences"] = wanted["ownerReferences"]
    if wanted.get("annotations"):
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **wanted["annotations"]}
    return body


class NrtPublisher:
    """Publishes one node's NodeResourceTopology through a kubernetes ApiClient."""

    def __init__(self, api_client: Any, node_name: str) -> None:
        if not node_name:
            raise ValueError("the node name is needed to name its NodeResourceTopology")
        self.node_name = node_name
        self._objects = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._current: Obj | None = None  # the object as the API server last returned it
        self._known = False  # whether _current reflects the server (None then means "absent")
        self._owner: Obj | None = None
        self._owner_missing = False
        self.writes = 0  # creates and replaces, for metrics and tests
        self.last_written: Obj | None = None

    async def publish(
        self, topology: NodeTopology, annotations: Mapping[str, str] | None = None, *, verify: bool = False
    ) -> str:
        """Make the object match; returns "created", "replaced" or "unchanged".

        `verify` re-reads the Node (owner uid) and the object first instead of trusting the remembered one.
        """
        annotations = dict(annotations or {})
        if verify or not self._known or self._owner is None:
            self._owner = await self._read_owner()
        if verify or not self._known:
            await self._refresh_current()
        keys = frozenset(annotations)
        for _ in range(_CONFLICT_RETRIES):
            desired = desired_object(self.node_name, topology, annotations, self._owner)
            if self._current is None:
                if await self._create(desired):
                    return "created"
                continue  # it appeared meanwhile: compare with it
            if self._owner is None:  # the Node is unreadable: keep whatever owner the object has
                refs = (self._current.get("metadata") or {}).get("ownerReferences")
                if refs:
                    desired["metadata"]["ownerReferences"] = refs
            if managed_view(self._current, keys) == managed_view(desired, keys):
                return "unchanged"
            if await self._replace(merged_object(self._current, desired)):
                return "replaced"
        raise ApiException(status=409, reason=f"NodeResourceTopology {self.node_name} keeps changing")

    # --- API calls ---

    async def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(method, *args, _request_timeout=REQUEST_TIMEOUT_SECONDS, **kwargs)

    async def _read_owner(self) -> Obj | None:
        try:
            node = await self._call(self._core.read_node, self.node_name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            if not self._owner_missing:
                log.warning("Node %s not found: its NodeResourceTopology gets no owner", self.node_name)
            self._owner_missing = True
            return None
        self._owner_missing = False
        return owner_reference(node)

    async def _refresh_current(self) -> None:
        try:
            self._current = await self._call(
                self._objects.get_cluster_custom_object, GROUP, VERSION, PLURAL, self.node_name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._current = None
        self._known = True

    async def _create(self, body: Obj) -> bool:
        """True when created; False when it already exists (then _current holds it)."""
        try:
            self._current = await self._call(
                self._objects.create_cluster_custom_object,
                GROUP,
                VERSION,
                PLURAL,
                body,
                field_manager=FIELD_MANAGER,
                field_validation="Strict",
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
            await self._refresh_current()
            return False
        self._wrote("created")
        return True

    async def _replace(self, body: Obj) -> bool:
        """True when replaced; False on a conflict or a vanished object (then _current is re-read)."""
        try:
            self._current = await self._call(
                self._objects.replace_cluster_custom_object,
                GROUP,
                VERSION,
                PLURAL,
                self.node_name,
                body,
                field_manager=FIELD_MANAGER,
                field_validation="Strict",
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
            await self._refresh_current()
            return False
        self._wrote("replaced")
        return True

    def _wrote(self, what: str) -> None:
        self.writes += 1
        self.last_written = self._current
        log.info("NodeResourceTopology %s %s", self.node_name, what)
