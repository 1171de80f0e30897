"""Whether an installed CRD is the one this release ships (crds/*.yaml), compared through a digest of each
version's schema. Descriptions do not count: the NodeResourceTopology CRD of scheduler-plugins or NROP is
ours field for field, descriptions aside, and either may be installed. The expected digests are generated
from crds/ into expected_crds.py by tools/sync_chart_crds.py (drift-checked by `./dev test`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

# Schema keywords whose value is a map of names to schemas, a schema, or a list of schemas.
_SCHEMA_MAPS = ("properties", "patternProperties", "definitions", "dependencies")
_SCHEMAS = ("items", "additionalProperties", "not", "additionalItems")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


def without_descriptions(schema: Any) -> Any:
    """An OpenAPI v3 schema with every schema's description removed (a property named "description" stays)."""
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "description":
            continue
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: without_descriptions(sub) for name, sub in value.items()}
        elif key in _SCHEMAS:
            out[key] = without_descriptions(value)
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [without_descriptions(sub) for sub in value]
        else:
            out[key] = value
    return out


def schema_digest(version: Mapping[str, Any]) -> str:
    """The digest of one entry of a CRD's spec.versions: its schema and subresources, descriptions aside."""
    content = {
        "schema": without_descriptions(((version.get("schema") or {}).get("openAPIV3Schema")) or {}),
        "subresources": version.get("subresources") or {},
    }
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def version_digests(crd: Mapping[str, Any]) -> dict[str, str]:
    """Served version name -> schema digest."""
    return {
        str(v.get("name")): schema_digest(v)
        for v in (crd.get("spec") or {}).get("versions") or ()
        if isinstance(v, Mapping) and v.get("served")
    }


def storage_version(crd: Mapping[str, Any]) -> str | None:
    for v in (crd.get("spec") or {}).get("versions") or ():
        if isinstance(v, Mapping) and v.get("storage"):
            return str(v.get("name"))
    return None
