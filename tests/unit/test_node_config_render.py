"""NodeConfigTemplate rendering and node selection (rmd_operator.node_config_render, node_config_selector):
wao-core's template data, the supported subset of Go's text/template, and the CRD's rule agreeing with it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rmd_operator.node_config_render import (
    TEMPLATE_PATTERN,
    TemplateData,
    TemplateError,
    render,
    render_spec,
)
from rmd_operator.node_config_selector import SelectorError, check, matches

ROOT = Path(__file__).resolve().parents[2]
DATA = TemplateData(hostname="worker-7.example.com", ipv4="10.0.3.17")


# -- the template data ------------------------------------------------------------------------------------


def test_data_of_a_node_is_its_hostname_label_and_first_ipv4_internal_ip() -> None:
    data = TemplateData.of_node(
        {"kubernetes.io/hostname": "w7", "x": "y"}, ["fd00::7", "not-an-ip", "10.0.0.7", "10.0.0.8"]
    )
    assert data == TemplateData("w7", "10.0.0.7")  # wao-core took fd00::7 and printed octets "x"
    assert TemplateData.of_node({}, []) == TemplateData(None, None)


@pytest.mark.parametrize(
    ("text", "rendered"),
    [
        ("https://10.0.100.{{.IPv4.Octet4}}", "https://10.0.100.17"),
        ("redfish-basicauth-{{.Hostname}}", "redfish-basicauth-worker-7.example.com"),
        ("http://{{ .IPv4.Address }}:5000", "http://10.0.3.17:5000"),
        ("{{.IPv4.Octet1}}.{{.IPv4.Octet2}}.{{.IPv4.Octet3}}", "10.0.3"),
        ("a  {{- .IPv4.Octet4 -}}  b", "a17b"),  # Go's trim markers eat the spaces around
        ("a {{- .IPv4.Octet4}} b", "a17 b"),
        ("plain, no action", "plain, no action"),
        ("", ""),
        ("x}}y{", "x}}y{"),  # braces outside an action are text
        ("{x{{.Hostname}}}", "{xworker-7.example.com}"),
    ],
)
def test_render(text: str, rendered: str) -> None:
    assert render(text, DATA) == rendered


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("https://{{.HostName}}", "unknown field .HostName"),
        ("{{.IPv4.Octet5}}", "unknown field .IPv4.Octet5"),
        ("{{.IPv6.Address}}", "unknown field .IPv6.Address"),
        ("{{ .Hostname | lower }}", "unsupported action"),  # wao-core had sprig; here nothing is evaluated
        ('{{ printf "%s" .Hostname }}', "unsupported action"),
        ("{{.}}", "unsupported action"),
        ("{{-.Hostname}}", "unsupported action"),  # Go needs "{{- " with the space
        ("{{{.Hostname}}", "unsupported action"),
        ("{{}}", "unsupported action"),
        ("https://{{.Hostname", "unclosed action"),
        ("{{/* a comment */}}", "unsupported action"),
    ],
)
def test_render_refuses_what_it_does_not_know(text: str, complaint: str) -> None:
    with pytest.raises(TemplateError, match=re.escape(complaint)):
        render(text, DATA)


def test_missing_data_is_an_error_not_a_placeholder() -> None:
    """wao-core printed undefined.example.com and x.x.x.x; a NodeConfig pointing there cannot work."""
    with pytest.raises(TemplateError, match=re.escape("no kubernetes.io/hostname label")):
        render("{{.Hostname}}", TemplateData(None, "10.0.0.1"))
    with pytest.raises(TemplateError, match=re.escape("no IPv4 InternalIP address for {{.IPv4.Octet4}}")):
        render("https://10.1.1.{{.IPv4.Octet4}}", TemplateData("w1", None))
    assert render("https://10.1.1.1", TemplateData(None, None)) == "https://10.1.1.1"  # not asked for


TEMPLATE: dict[str, Any] = {
    "metricsCollector": {
        "inletTemp": {
            "type": "Redfish",
            "endpoint": "https://10.0.100.{{.IPv4.Octet4}}",
            "basicAuthSecret": {"name": "bmc-{{.Hostname}}"},
            "fetchInterval": "10s",
        },
        "deltaP": {"type": "{{.Hostname}}", "endpoint": "http://10.0.0.1:5000"},
    },
    "predictor": {"powerConsumption": {"type": "Fake", "endpoint": ""}},
}


def test_render_spec_fills_in_each_templated_field_and_the_node() -> None:
    spec = render_spec(TEMPLATE, "worker-7", DATA)
    assert spec["nodeName"] == "worker-7"
    inlet = spec["metricsCollector"]["inletTemp"]
    assert inlet == {
        "type": "Redfish",
        "endpoint": "https://10.0.100.17",
        "basicAuthSecret": {"name": "bmc-worker-7.example.com"},
        "fetchInterval": "10s",
    }
    assert spec["metricsCollector"]["deltaP"]["type"] == "worker-7.example.com"  # the CRD refuses it later
    assert spec["predictor"] == TEMPLATE["predictor"]
    assert TEMPLATE["metricsCollector"]["inletTemp"]["endpoint"].endswith("{{.IPv4.Octet4}}")  # not mutated


def test_render_spec_names_every_field_that_fails() -> None:
    with pytest.raises(TemplateError) as info:
        render_spec(TEMPLATE, "worker-7", TemplateData(None, None))
    message = str(info.value)
    assert "metricsCollector.inletTemp.endpoint: the node has no IPv4 InternalIP" in message
    assert (
        "metricsCollector.inletTemp.basicAuthSecret.name: the node has no kubernetes.io/hostname" in message
    )
    assert "metricsCollector.deltaP.type" in message


def test_fetch_interval_is_not_templated() -> None:
    template = {"metricsCollector": {"inletTemp": {"type": "Fake", "fetchInterval": "{{.Hostname}}"}}}
    spec = render_spec(template, "n", DATA)
    assert spec["metricsCollector"]["inletTemp"]["fetchInterval"] == "{{.Hostname}}"


# -- the CRD accepts exactly what render() can render -----------------------------------------------------


def crd_template_rules() -> list[str]:
    """The regexes of the template CRD's rules on templated strings."""
    crd = yaml.safe_load((ROOT / "crds" / "nodeconfigtemplates.wao.bitmedia.co.jp.yaml").read_text())
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations", []):
                found.update(
                    r for r in re.findall(r"self\.matches\('([^']*)'\)", rule["rule"]) if "Hostname" in r
                )
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(crd)
    return sorted(found)


def test_the_crd_rule_is_the_renderers_pattern() -> None:
    assert crd_template_rules() == [TEMPLATE_PATTERN]


ALPHABET = st.sampled_from(
    ["{{", "}}", "{", "}", "-", " ", ".", "Hostname", "IPv4", "Address", "Octet4", "x"]
)


@given(st.lists(ALPHABET, max_size=12).map("".join))
def test_crd_rule_and_renderer_agree(text: str) -> None:
    """Anything the CRD lets through renders for a node that has the data, and nothing else does."""
    accepted = re.search(TEMPLATE_PATTERN, text) is not None
    try:
        render(text, DATA)
        rendered = True
    except TemplateError:
        rendered = False
    assert accepted == rendered, text


# -- node selection -----------------------------------------------------------------------------------------

LABELS = {"node.kubernetes.io/instance-type": "redfish-enabled", "zone": "a"}


@pytest.mark.parametrize(
    ("selector", "selected"),
    [
        ({}, True),  # {} selects every node, as in Kubernetes
        ({"matchLabels": {"node.kubernetes.io/instance-type": "redfish-enabled"}}, True),
        ({"matchLabels": {"node.kubernetes.io/instance-type": "other"}}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, False),
        ({"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["a"]}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, False),
        (
            {
                "matchLabels": {"zone": "a"},
                "matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "Exists"}],
            },
            True,
        ),
    ],
)
def test_selector_matches_like_kubernetes(selector: dict[str, Any], selected: bool) -> None:
    check(selector)
    assert matches(selector, LABELS) is selected


@pytest.mark.parametrize(
    ("selector", "complaint"),
    [
        (None, "must be a label selector"),
        ({"matchExpressions": [{"key": "zone", "operator": "In"}]}, "values must be non-empty"),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]}, "empty otherwise"),
        (
            {"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["1"]}]},
            "operator must be one of",
        ),
        ({"matchExpressions": [{"operator": "Exists"}]}, "key is required"),
        ({"matchLabels": {"zone": 1}}, "string values"),
    ],
)
def test_malformed_selector_is_an_error(selector: Any, complaint: str) -> None:
    with pytest.raises(SelectorError, match=complaint):
        check(selector)
