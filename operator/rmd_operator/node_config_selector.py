"""A NodeConfigTemplate's nodeSelector (a metav1.LabelSelector) against a node's labels (pure).

The same meaning as Kubernetes gives it: every matchLabels pair and every matchExpressions requirement must
hold; `{}` selects every node. The CRD already refuses malformed requirements; check() repeats that for
objects stored before (or under wao-core's CRD), so a bad selector is reported instead of matching nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class SelectorError(ValueError):
    """A nodeSelector that selects nothing meaningful; the message says what is wrong."""


def check(selector: Any) -> None:
    """Raise SelectorError unless `selector` is a well-formed label selector."""
    if not isinstance(selector, Mapping):
        raise SelectorError("nodeSelector must be a label selector ({} selects every node)")
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise SelectorError("nodeSelector.matchLabels must map label keys to string values")
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise SelectorError("nodeSelector.matchExpressions must be a list")
    for i, req in enumerate(expressions):
        where = f"nodeSelector.matchExpressions[{i}]"
        if not isinstance(req, Mapping) or not req.get("key"):
            raise SelectorError(f"{where}: key is required")
        operator, values = req.get("operator"), req.get("values") or []
        if operator not in _OPERATORS:
            raise SelectorError(f"{where}: operator must be one of {', '.join(_OPERATORS)}, not {operator!r}")
        if (operator in ("In", "NotIn")) != bool(values):
            raise SelectorError(f"{where}: values must be non-empty for In and NotIn, empty otherwise")


def matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a node with `labels` is selected; `selector` must have passed check()."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for req in selector.get("matchExpressions") or []:
        key, operator, values = req["key"], req["operator"], req.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True
