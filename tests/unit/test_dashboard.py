"""The Grafana dashboard the chart ships: valid JSON, sound layout, and every PromQL query names only metrics
the agent or the operator exports (their catalogs); promtool parses every query. Also: the catalog covers
metrics defined elsewhere (gRPC server) and docs/metrics.md is what the generator writes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from rmd_agent.metrics import catalog
from rmd_agent.server.metrics import GrpcMetrics
from rmd_operator.telemetry import catalog as operator_catalog

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts/rmd/dashboards/rmd.json"
PROMTOOL = "/usr/bin/promtool"

# Grafana's variables, replaced by plausible values so queries can be parsed
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "30s",
    "$__range": "1h",
    "${datasource}": "prometheus",
    "$instance": ".*",
    "$namespace": ".*",
    "$zone": "package",
}
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


def load_dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: panel targets and query variables (label_values(<selector>, label))."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", var["query"]["query"])
            assert match, var["query"]
            exprs.append(match.group(1))
    return exprs


def substitute(expr: str) -> str:
    for name, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, labels of
    grouping clauses, label matchers, strings or durations."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def test_metric_name_extraction() -> None:
    expr = 'topk(5, sum by (namespace, pod) (rate(a_total{zone="x", b="rate(c)"}[5m]))) / on (pod) d unless e'
    assert metric_names(expr) == {"a_total", "d", "e"}
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(h_bucket[1m])))") == {"h_bucket"}


def test_dashboard_is_valid_grafana_json() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", target["expr"])) - {
                "__rate_interval",
                "__range",
                "__interval",
            }
            assert used <= variables, (panel["title"], used - variables)


def test_every_query_names_exported_metrics_only() -> None:
    exported = catalog.all_series_names() | {m.name for m in operator_catalog.METRICS}
    seen: set[str] = set()
    for expr in queries(load_dashboard()):
        names = metric_names(substitute(expr))
        assert names, f"no metric in {expr!r}"
        assert names <= exported, f"{expr!r} uses {sorted(names - exported)}, not in the catalog"
        seen |= names
    # what the issue asks the dashboard to show
    assert {"rmd_node_power_watts", "rmd_pod_energy_joules_total", "rmd_workload_cache_ways"} <= seen
    # issue #15: a panel of the NodeConfig values (the operator's), per node
    assert {
        "rmd_node_inlet_temperature_celsius",
        "rmd_node_differential_pressure_pascals",
        "rmd_node_predicted_power_watts",
    } <= seen


def test_promtool_parses_every_query(tmp_path: Path) -> None:
    if not os.path.exists(PROMTOOL):
        if os.environ.get("CI"):
            pytest.fail(f"{PROMTOOL} is missing; ./dev installs Debian's prometheus package")
        pytest.skip(f"{PROMTOOL} is not installed")
    rules = [
        {"record": f"dashboard:query_{i}", "expr": substitute(e)}
        for i, e in enumerate(queries(load_dashboard()))
    ]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_catalog_lists_the_grpc_server_metrics() -> None:
    registry = CollectorRegistry()
    GrpcMetrics(registry)
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        entry = catalog.spec(name)
        assert entry.type == family.type
        labels = {k for s in family.samples for k in s.labels} - {"le"}
        assert labels <= set(entry.labels)


def test_catalog_entries_are_well_formed() -> None:
    names = [m.name for m in catalog.METRICS]
    assert len(names) == len(set(names))
    for metric in catalog.METRICS:
        assert metric.name.startswith("rmd_"), metric.name
        assert metric.name.endswith("_total") == (metric.type == "counter"), metric.name
        assert set(metric.labels) <= set(catalog.LABELS), metric.name
        assert metric.group in {g.key for g in catalog.GROUPS}


def test_metrics_doc_is_generated_from_the_catalog() -> None:
    script = REPO / "tools/gen_metrics_doc.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


def test_dashboard_is_plain_json_without_grafana_export_leftovers() -> None:
    """A dashboard exported from a live Grafana carries a datasource uid that exists only there."""
    text = DASHBOARD.read_text()
    uids = set(re.findall(r'"uid":\s*"([^"]+)"', text))
    assert uids <= {"${datasource}", load_dashboard()["uid"]}
