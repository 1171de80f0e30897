"""A NodeConfigTemplate's per-node values: wao-core's template data and the small part of Go's text/template
its templates use (pure).

wao-core renders `type`, `endpoint` and `basicAuthSecret.name` with Go's text/template (plus sprig) over
`.Hostname` (the node's kubernetes.io/hostname label) and `.IPv4.Address` / `.IPv4.Octet1..4` (its first
InternalIP). Here only that data is offered, and only actions that print one of its fields:
`{{.Hostname}}`, `{{ .IPv4.Octet4 }}`, with Go's trim markers `{{- ` and ` -}}`. Nothing is evaluated: the
text is scanned once, and anything else inside `{{ }}` is an error, not a guess. Where wao-core printed
placeholders for missing data ("undefined.example.com", "x.x.x.x") and kept a field verbatim when its
template failed, both are errors here: a NodeConfig pointing at https://x.x.x.x cannot work. The CRD's rule
(TEMPLATE_PATTERN) accepts exactly the templates this module can render.
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rmd_api.node_config import HOSTNAME_LABEL

ADDRESS_FIELD = "IPv4.Address"
FIELDS = ("Hostname", ADDRESS_FIELD, "IPv4.Octet1", "IPv4.Octet2", "IPv4.Octet3", "IPv4.Octet4")
_KNOWN = ", ".join("{{." + f + "}}" for f in FIELDS)
# The same language as the CRD's rule on templated strings (tests/unit/test_node_config_render.py).
_ACTION = r"[{][{](- )? *[.](Hostname|IPv4[.](Address|Octet[1-4])) *( -)?[}][}]"
TEMPLATE_PATTERN = r"^([^{]|[{][^{]|" + _ACTION + r")*[{]?$"
_FIELD = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)")
_WHITESPACE = " \t\r\n"


class TemplateError(ValueError):
    """A template that cannot be rendered for a node; the message says why."""


@dataclass(frozen=True)
class TemplateData:
    """What a template may print for one node; None: the node does not have it."""

    hostname: str | None
    ipv4: str | None

    @classmethod
    def of_node(cls, labels: Mapping[str, str], internal_ips: Iterable[str]) -> TemplateData:
        """The node's hostname label and its first IPv4 InternalIP. (wao-core took the first InternalIP of
        any family, so a dual-stack node listing IPv6 first got an IPv6 address as `.IPv4.Address`.)"""
        ipv4 = next((ip for ip in internal_ips if _is_ipv4(ip)), None)
        return cls(labels.get(HOSTNAME_LABEL) or None, ipv4)

    def value(self, field: str) -> str:
        if field == "Hostname":
            if self.hostname is None:
                raise TemplateError(f"the node has no {HOSTNAME_LABEL} label for {{{{.Hostname}}}}")
            return self.hostname
        if self.ipv4 is None:
            raise TemplateError(f"the node has no IPv4 InternalIP address for {{{{.{field}}}}}")
        if field == ADDRESS_FIELD:
            return self.ipv4
        return self.ipv4.split(".")[int(field[-1]) - 1]


def _is_ipv4(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False


def render(text: str, data: TemplateData) -> str:
    """`text` with each action replaced by its field's value; TemplateError if it cannot be."""
    out: list[str] = []
    rest = text
    while (start := rest.find("{{")) >= 0:
        end = rest.find("}}", start + 2)
        if end < 0:
            raise TemplateError(f"unclosed action in {text!r}")
        literal, action, rest = rest[:start], rest[start + 2 : end], rest[end + 2 :]
        if action.startswith("- "):
            literal = literal.rstrip(_WHITESPACE)
            action = action[2:]
        if action.endswith(" -"):
            rest = rest.lstrip(_WHITESPACE)
            action = action[:-2]
        out.append(literal)
        out.append(data.value(_field(action.strip(" "), text)))
    out.append(rest)
    return "".join(out)


def _field(action: str, text: str) -> str:
    """The field an action prints: `.Hostname` -> "Hostname"."""
    found = _FIELD.fullmatch(action)
    if found is None:
        raise TemplateError(
            f"unsupported action {{{{{action}}}}} in {text!r}: only a field such as {{{{.Hostname}}}} is "
            f"supported ({_KNOWN})"
        )
    if found.group(1) not in FIELDS:
        raise TemplateError(f"unknown field .{found.group(1)} in {text!r}: known are {_KNOWN}")
    return found.group(1)


def render_spec(template: Mapping[str, Any], node: str, data: TemplateData) -> dict[str, Any]:
    """The NodeConfig spec a template gives `node`: a copy of the template with nodeName set and every
    endpoint term's type, endpoint and basicAuthSecret.name rendered. TemplateError names each field that
    fails (all of them, so one round of fixes is enough)."""
    spec = copy.deepcopy(dict(template))
    spec["nodeName"] = node
    problems: list[str] = []
    for section in ("metricsCollector", "predictor"):
        terms = spec.get(section)
        if not isinstance(terms, dict):
            continue
        for name, term in terms.items():
            if not isinstance(term, dict):
                continue
            where = f"{section}.{name}"
            for key in ("type", "endpoint"):
                if isinstance(term.get(key), str):
                    term[key] = _render_field(term[key], data, f"{where}.{key}", problems)
            secret = term.get("basicAuthSecret")
            if isinstance(secret, dict) and isinstance(secret.get("name"), str):
                secret["name"] = _render_field(
                    secret["name"], data, f"{where}.basicAuthSecret.name", problems
                )
    if problems:
        raise TemplateError("; ".join(problems))
    return spec


def _render_field(text: str, data: TemplateData, where: str, problems: list[str]) -> str:
    try:
        return render(text, data)
    except TemplateError as exc:
        problems.append(f"{where}: {exc}")
        return text
