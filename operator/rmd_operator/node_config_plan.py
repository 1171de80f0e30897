"""The template controller's decisions (pure): from every NodeConfigTemplate, Node and NodeConfig as the API
server has them, what to create, update and delete for each template, and why a node has no NodeConfig as
its template says.

* A template keeps one NodeConfig `<template>-<node>` per node its nodeSelector matches, in its namespace,
  controlled by it (owner reference), with the spec rendered for the node (node_config_render.py).
* A node that leaves the selector, or is deleted, loses its NodeConfig (wao-core left it behind).
* **One NodeConfig per node.** Two templates selecting one node, or a template selecting a node that has a
  NodeConfig of its own (written by hand), is a Conflict, reported on each template that yields: a
  hand-written NodeConfig wins over every template; between templates, the one that already has its
  NodeConfig there keeps it, else the oldest (creationTimestamp, then namespace/name). So adding a template
  never disturbs a node that works. The yielding template's own NodeConfig for the node, if any, is deleted.
  Two templates whose names give the same `<template>-<node>` for different nodes are a Conflict too.
* A template error for a node (an action that cannot be rendered, data the node lacks) leaves the node's
  existing NodeConfig as it is, and is reported; so is a malformed nodeSelector (then nothing is changed).

Everything that differs is planned at once; the caller writes it, and feeds what the API server refused back
as problems (node_config_status.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rmd_api.names import NODE_CONFIG, NODE_CONFIG_TEMPLATE
from rmd_api.node_config import CONFLICT, INVALID, TEMPLATE_ERROR, node_config_name
from rmd_operator.node_config_render import TemplateData, TemplateError, render_spec
from rmd_operator.node_config_selector import SelectorError, check, matches

MAX_NAME = 253  # a NodeConfig's name is a DNS subdomain


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str]
    internal_ips: tuple[str, ...] = ()


@dataclass(frozen=True)
class Template:
    namespace: str
    name: str
    uid: str
    created: str  # metadata.creationTimestamp: RFC 3339 in UTC, so it sorts as text
    generation: int
    spec: Mapping[str, Any]
    status: Mapping[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> tuple[str, str, str]:
        """Older first; the name breaks ties (timestamps have one-second resolution)."""
        return (self.created, self.namespace, self.name)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class NodeConfig:
    namespace: str
    name: str
    uid: str
    node: str | None  # spec.nodeName
    template_uid: str | None  # uid of the NodeConfigTemplate that controls it; None: written by hand
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class Create:
    node: str
    body: Mapping[str, Any]


@dataclass(frozen=True)
class Update:
    node: str
    name: str
    uid: str
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class Delete:
    name: str
    uid: str
    why: str


@dataclass(frozen=True)
class Problem:
    node: str
    reason: str  # rmd_api.node_config: TemplateError, Conflict, Invalid, WriteFailed
    message: str  # about the node, without naming it (shown as "<node>: <message>")


@dataclass
class TemplatePlan:
    template: Template
    matching: int = 0  # nodes its selector matches
    in_sync: int = 0  # its NodeConfigs that are already as it says
    creates: list[Create] = field(default_factory=list)
    updates: list[Update] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    selector_error: str | None = None


# -- the API objects, as the planner sees them ----------------------------------------------------------


def template_of(body: Mapping[str, Any]) -> Template:
    meta = body.get("metadata") or {}
    return Template(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        generation=int(meta.get("generation") or 0),
        spec=dict(body.get("spec") or {}),
        status=dict(body.get("status") or {}),
    )


def node_config_of(body: Mapping[str, Any]) -> NodeConfig:
    meta = body.get("metadata") or {}
    spec = dict(body.get("spec") or {})
    node = spec.get("nodeName")
    return NodeConfig(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        node=node if isinstance(node, str) and node else None,
        template_uid=_controlling_template(meta.get("ownerReferences") or ()),
        spec=spec,
    )


def _controlling_template(refs: Iterable[Any]) -> str | None:
    for ref in refs:
        if not isinstance(ref, Mapping) or not ref.get("controller"):
            continue
        group = str(ref.get("apiVersion") or "").rpartition("/")[0]
        if ref.get("kind") == NODE_CONFIG_TEMPLATE.kind and group == NODE_CONFIG_TEMPLATE.group:
            return str(ref.get("uid") or "") or None
    return None


def internal_ips(status: Mapping[str, Any] | None) -> tuple[str, ...]:
    """A Node's InternalIP addresses, in status order."""
    addresses = (status or {}).get("addresses") or ()
    return tuple(
        str(a.get("address"))
        for a in addresses
        if isinstance(a, Mapping) and a.get("type") == "InternalIP" and a.get("address")
    )


def template_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The NodeConfig spec a template gives: spec.template (wao-core's layout, nodeName ignored), or
    spec.metricsCollector / spec.predictor directly (the flat layout)."""
    if isinstance(spec.get("template"), Mapping):
        return {k: v for k, v in spec["template"].items() if k != "nodeName"}
    return {k: spec[k] for k in ("metricsCollector", "predictor") if k in spec}


def owner_reference(template: Template) -> dict[str, Any]:
    return {
        "apiVersion": NODE_CONFIG_TEMPLATE.api_version,
        "kind": NODE_CONFIG_TEMPLATE.kind,
        "name": template.name,
        "uid": template.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


# -- the plan ---------------------------------------------------------------------------------------------


@dataclass
class _Cluster:
    templates: dict[str, Template]  # by uid
    nodes: dict[str, Node]
    by_name: dict[tuple[str, str], NodeConfig]
    handwritten: dict[str, list[NodeConfig]]  # node -> its NodeConfigs that no template controls

    def owned(self, template: Template, node: str) -> NodeConfig | None:
        found = self.by_name.get((template.namespace, node_config_name(template.name, node)))
        return found if found is not None and found.template_uid == template.uid else None


def plan(
    templates: Sequence[Template], nodes: Sequence[Node], configs: Sequence[NodeConfig]
) -> list[TemplatePlan]:
    """One plan per template (in the order given)."""
    handwritten: dict[str, list[NodeConfig]] = defaultdict(list)
    for config in sorted(configs, key=lambda c: (c.namespace, c.name)):
        if config.template_uid is None and config.node is not None:
            handwritten[config.node].append(config)
    cluster = _Cluster(
        templates={t.uid: t for t in templates},
        nodes={n.name: n for n in nodes},
        by_name={(c.namespace, c.name): c for c in configs},
        handwritten=handwritten,
    )
    plans = {t.uid: TemplatePlan(t) for t in templates}
    selected = _selected_nodes(templates, nodes, plans)
    wins = _assign_nodes(cluster, selected, plans)
    claims = _claim_names(cluster, wins, plans)
    for template in templates:
        keep = _render(cluster, template, claims.get(template.uid, []), plans[template.uid])
        if plans[template.uid].selector_error is None:
            _delete_the_rest(cluster, template, keep, selected, plans[template.uid])
    return [plans[t.uid] for t in templates]


def _selected_nodes(
    templates: Sequence[Template], nodes: Sequence[Node], plans: dict[str, TemplatePlan]
) -> dict[str, list[Template]]:
    """node -> the templates whose selector matches it, oldest first."""
    selected: dict[str, list[Template]] = defaultdict(list)
    for template in sorted(templates, key=lambda t: t.rank):
        selector = template.spec.get("nodeSelector")
        try:
            check(selector)
        except SelectorError as exc:
            plans[template.uid].selector_error = str(exc)
            continue
        assert isinstance(selector, Mapping)
        for node in nodes:
            if matches(selector, node.labels):
                selected[node.name].append(template)
                plans[template.uid].matching += 1
    return selected


def _assign_nodes(
    cluster: _Cluster, selected: Mapping[str, list[Template]], plans: dict[str, TemplatePlan]
) -> dict[str, list[str]]:
    """template uid -> the nodes it keeps a NodeConfig for; every other candidate is told why not."""
    wins: dict[str, list[str]] = defaultdict(list)
    for node, candidates in sorted(selected.items()):
        own = cluster.handwritten.get(node)
        if own:
            held = ", ".join(f"{c.namespace}/{c.name}" for c in own)
            for template in candidates:
                plans[template.uid].problems.append(
                    Problem(
                        node,
                        CONFLICT,
                        f"the node already has NodeConfig {held}, not made by a template, and a node takes "
                        "one NodeConfig: delete that one, or keep the node out of this nodeSelector",
                    )
                )
            continue
        incumbents = [t for t in candidates if cluster.owned(t, node) is not None]
        winner = (incumbents or candidates)[0]
        wins[winner.uid].append(node)
        for template in candidates:
            if template is not winner:
                plans[template.uid].problems.append(
                    Problem(
                        node,
                        CONFLICT,
                        f"the node is also selected by NodeConfigTemplate {winner.ref}, which keeps its "
                        "NodeConfig there (a node takes one NodeConfig: the template that has it, else the "
                        "oldest, keeps it)",
                    )
                )
    return wins


def _claim_names(
    cluster: _Cluster, wins: Mapping[str, list[str]], plans: dict[str, TemplatePlan]
) -> dict[str, list[str]]:
    """template uid -> the nodes whose `<template>-<node>` name is free for it (or already its own)."""
    wanted: dict[tuple[str, str], list[tuple[Template, str]]] = defaultdict(list)
    for uid, nodes in wins.items():
        template = cluster.templates[uid]
        for node in nodes:
            wanted[(template.namespace, node_config_name(template.name, node))].append((template, node))
    claims: dict[str, list[str]] = defaultdict(list)
    for (namespace, name), claimants in sorted(wanted.items()):
        existing = cluster.by_name.get((namespace, name))
        holder = existing.template_uid if existing is not None else None
        if existing is not None and holder not in {t.uid for t, _ in claimants}:
            owner = cluster.templates.get(holder or "")
            if owner is not None:
                whose = f"NodeConfigTemplate {owner.ref}'s (for node {existing.node})"
            elif holder is not None:
                whose = "a deleted NodeConfigTemplate's, until the garbage collector removes it"
            else:
                whose = f"written by hand (for node {existing.node})"
            for template, node in claimants:
                plans[template.uid].problems.append(
                    Problem(node, CONFLICT, f"NodeConfig {namespace}/{name} exists and is {whose}")
                )
            continue
        # The template that has the name keeps it, else the oldest.
        (first, first_node), *rest = sorted(claimants, key=lambda c: (c[0].uid != holder, c[0].rank))
        claims[first.uid].append(first_node)
        for template, node in rest:
            plans[template.uid].problems.append(
                Problem(
                    node,
                    CONFLICT,
                    f"NodeConfig name {name} is also what NodeConfigTemplate {first.ref} gives node "
                    f"{first_node}",
                )
            )
    return claims


def _render(cluster: _Cluster, template: Template, nodes: Iterable[str], plan_: TemplatePlan) -> set[str]:
    """Plan the template's NodeConfig for each of `nodes`; returns the names it keeps."""
    keep: set[str] = set()
    spec = template_spec(template.spec)
    for node in sorted(nodes):
        name = node_config_name(template.name, node)
        keep.add(name)
        if len(name) > MAX_NAME:
            plan_.problems.append(
                Problem(node, INVALID, f"NodeConfig name {name} is longer than {MAX_NAME} characters")
            )
            continue
        facts = cluster.nodes[node]
        try:
            wanted = render_spec(spec, node, TemplateData.of_node(facts.labels, facts.internal_ips))
        except TemplateError as exc:
            plan_.problems.append(Problem(node, TEMPLATE_ERROR, str(exc)))
            continue
        existing = cluster.owned(template, node)
        if existing is None:
            body = {
                "apiVersion": NODE_CONFIG.api_version,
                "kind": NODE_CONFIG.kind,
                "metadata": {
                    "name": name,
                    "namespace": template.namespace,
                    "ownerReferences": [owner_reference(template)],
                },
                "spec": wanted,
            }
            plan_.creates.append(Create(node, body))
        elif dict(existing.spec) != wanted:
            plan_.updates.append(Update(node, name, existing.uid, wanted))
        else:
            plan_.in_sync += 1
    return keep


def _delete_the_rest(
    cluster: _Cluster,
    template: Template,
    keep: set[str],
    selected: Mapping[str, list[Template]],
    plan_: TemplatePlan,
) -> None:
    prefix = template.name + "-"
    for (namespace, name), config in sorted(cluster.by_name.items()):
        if namespace != template.namespace or config.template_uid != template.uid or name in keep:
            continue
        node = name[len(prefix) :] if name.startswith(prefix) else (config.node or "")
        if node not in cluster.nodes:
            why = f"node {node} is gone"
        elif template.uid not in {t.uid for t in selected.get(node, ())}:
            why = f"node {node} no longer matches the nodeSelector"
        else:
            why = f"node {node} keeps another NodeConfig (Conflict)"
        plan_.deletes.append(Delete(name, config.uid, why))
