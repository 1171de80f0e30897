"""Write this node's NodeResourceTopology: create it when missing, replace it only when its content changed.

The object is named after the node and owned by the Node (so it goes when the Node goes; while the Node
cannot be found it is written without an owner). This module decides the content and what a replace keeps
of other writers' edits; kube_object_writer.ObjectWriter does the writing: it compares with the object the
API server last returned, so a refresh that changes nothing costs no request at all; a `verify` pass (the
exporter's periodic resync) reads the object and the Node again, which recreates an object someone deleted
and repairs one someone edited. Replaces carry the resourceVersion read, so a concurrent edit is detected
(409) and re-read, not overwritten blindly. Writes use fieldValidation=Strict.

Only this node's objects are touched: GET of its Node, GET/POST/PUT of its NodeResourceTopology.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rmd_agent.kube import KubeObjectClient
from rmd_agent.kube_object_writer import (
    Build,
    Change,
    Desire,
    ObjectRef,
    ObjectWriter,
    node_owner_reference,
)
from rmd_agent.nrt.zones import NodeTopology
from rmd_api.names import NODE_RESOURCE_TOPOLOGY as NRT

log = logging.getLogger(__name__)

# The object's API names (rmd_api.names), as the client calls below take them.
GROUP, VERSION, PLURAL = NRT.group, NRT.version, NRT.plural
API_VERSION, KIND = NRT.api_version, NRT.kind
FIELD_MANAGER = "rmd-agent"

Obj = dict[str, Any]


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
    topologyPolicies does not, and resourceVersion makes the replace conditional. `current` is not changed:
    what is replaced is new, the rest shared (no deep copy: it took most of a replace's CPU)."""
    body = {k: v for k, v in current.items() if k not in ("topologyPolicies", "status")}
    body["zones"] = desired["zones"]
    body["attributes"] = desired["attributes"]
    metadata = body["metadata"] = dict(current.get("metadata") or {})
    wanted = desired["metadata"]
    if "ownerReferences" in wanted:
        metadata["ownerReferences"] = wanted["ownerReferences"]
    if wanted.get("annotations"):
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **wanted["annotations"]}
    return body


def replacement(current: Mapping[str, Any], desired: Obj, annotation_keys: frozenset[str]) -> Change | None:
    """The replace that makes `current` as desired; None when it already is. A `desired` without owner (the
    Node is unreadable) keeps whatever owner the object has."""
    refs = (current.get("metadata") or {}).get("ownerReferences")
    if refs and "ownerReferences" not in desired["metadata"]:
        desired = {**desired, "metadata": {**desired["metadata"], "ownerReferences": refs}}
    if managed_view(current, annotation_keys) == managed_view(desired, annotation_keys):
        return None
    return Change("replace", merged_object(current, desired))


def desired_writes(
    node_name: str, topology: NodeTopology, annotations: Mapping[str, str]
) -> tuple[Build, list[Desire]]:
    """What ObjectWriter.sync needs to publish `topology`: the object to create, given the Node's uid (None:
    no owner), and the replace an existing object needs."""
    keys = frozenset(annotations)

    def build(node_uid: str | None) -> Obj:
        owner = None if node_uid is None else node_owner_reference(node_name, node_uid)
        return desired_object(node_name, topology, annotations, owner)

    def replace(current: Obj, node_uid: str | None) -> Change | None:
        return replacement(current, build(node_uid), keys)

    return build, [replace]


class NrtPublisher:
    """Publishes one node's NodeResourceTopology through the agent's API client (kube.create_api_client)."""

    def __init__(self, api_client: Any, node_name: str) -> None:
        if not node_name:
            raise ValueError("the node name is needed to name its NodeResourceTopology")
        self.node_name = node_name
        kube = KubeObjectClient(api_client, ObjectRef(GROUP, VERSION, PLURAL, KIND, node_name), FIELD_MANAGER)
        self._object = ObjectWriter(kube, node_name, needs_node=False, logger=log)

    @property
    def writes(self) -> int:
        """Creates and replaces, for metrics and tests."""
        return self._object.writes

    async def read(self) -> None:
        """Read the Node and the object now (what `verify` does), for a publish without verify right after:
        the exporter overlaps these requests with computing the topology."""
        await self._object.read()

    async def publish(
        self, topology: NodeTopology, annotations: Mapping[str, str] | None = None, *, verify: bool = False
    ) -> str:
        """Make the object match; returns "created", "replaced" or "unchanged".

        `verify` re-reads the Node (owner uid) and the object first instead of trusting the remembered one.
        """
        build, changes = desired_writes(self.node_name, topology, dict(annotations or {}))
        return await self._object.sync(build, changes, verify=verify)
