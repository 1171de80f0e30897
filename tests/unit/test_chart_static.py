"""The Helm chart's files, without helm: values against the schema, the schema against the settings objects,
the chart's CRD copies against crds/, and the chart's version against the distribution's.

Rendering, `helm lint` and installing are in tests/e2e/test_chart.py (they need the helm binary).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import shutil
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml

from rmd_agent.settings import AgentSettings
from rmd_api.agent_certs import NODE_ANNOTATION, NODE_NAME_EXTRA, SIGNER_NAME, USAGES
from rmd_operator.settings import OperatorSettings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rmd"

# Settings the chart derives from the pod and its own mounts; a user value would be overridden (or would break
# the mounts), so the schema refuses them in agent.settings / operator.settings.
AGENT_SET_BY_CHART = {
    "node_name",
    "host_root",
    "kubelet_dir",
    "kubelet_config",
    "pod_resources_socket",
    "grpc_listen",
    "http_listen",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "tls_csr",  # tls.agentCertificates
    "tls_server_name",  # tls.agentDomain
    "tls_csr_expiration_seconds",  # tls.agentCertificateSeconds
    "state_path",
    "policy_file",
    "kubeconfig",
    "node_state_namespace",
    "advertise_address",
}
OPERATOR_SET_BY_CHART = {
    "agent_manifests_configmap",  # agent.deployedBy: rmdconfig
    "cluster_name",  # rmd.clusterName, for the scheduler an RmdConfig may deploy
    "agent_pods_fingerprint_method",  # agent.settings.nrt_pods_fingerprint_method
    "namespaces",
    "node_state_namespace",
    "agent_ca",
    "client_cert",
    "client_key",
    "agent_server_name",
    "agent_signer_ca_cert",  # tls.agentCertificates: csr mounts the CA
    "agent_signer_ca_key",
    "agent_service_account",
    "peering",
    "priority",
    "liveness_listen",
    "metrics_listen",  # from operator.ports.metrics
    "instance",
}
# The JSON schema types for each Python type of a setting (lists: a YAML list or a comma-separated string)
SCHEMA_TYPES: dict[str, set[str]] = {
    "bool": {"boolean"},
    "int": {"integer"},
    "float": {"number"},
    "str": {"string"},
    "tuple[str, ...]": {"array", "string"},
}


def load_values() -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(values, dict)
    return values


def load_schema() -> dict[str, Any]:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert isinstance(schema, dict)
    return schema


def validation_errors(values: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(load_schema())
    return sorted(f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(values))


def load_sync_tool() -> ModuleType:
    """tools/ is not a package: load the script as a module."""
    spec = importlib.util.spec_from_file_location("sync_chart_crds", REPO / "tools" / "sync_chart_crds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_schema_is_valid_draft7() -> None:
    jsonschema.Draft7Validator.check_schema(load_schema())


def test_default_values_match_the_schema() -> None:
    assert validation_errors(load_values()) == []


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        (("agent", "image", "tag"), "latest", "should not be valid"),
        (("agent", "settings", "nrt_enabeld"), True, "Additional properties"),
        (("agent", "settings", "node_name"), "worker-1", "Additional properties"),
        (("operator", "settings", "agent_server_name"), "x.{node}", "Additional properties"),
        (("agent", "settings", "log_format"), "xml", "is not one of"),
        (("agent", "ports", "grpc"), 70000, "is greater than the maximum"),
        (("agent", "hostPaths", "stateDir"), "var/lib/rmd-agent", "does not match"),
        (("operator", "runAsUser"), 0, "is less than the minimum"),
        (("operator", "watchNamespaces"), ["Team_A"], "does not match"),
        (("operator", "replicas"), 2, "Additional properties"),
        (("tls", "agentDomain"), "Bad_Domain", "does not match"),
    ],
)
def test_schema_refuses(path: tuple[str, ...], value: object, complaint: str) -> None:
    values = copy.deepcopy(load_values())
    node = values
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    errors = validation_errors(values)
    assert any(complaint in e for e in errors), errors


@pytest.mark.parametrize(
    ("settings_cls", "values_key", "set_by_chart"),
    [(AgentSettings, "agent", AGENT_SET_BY_CHART), (OperatorSettings, "operator", OPERATOR_SET_BY_CHART)],
)
def test_schema_offers_every_setting_the_chart_leaves_to_users(
    settings_cls: type, values_key: str, set_by_chart: set[str]
) -> None:
    """A new setting in the program must show up here: either in the schema (with a matching type) or in the
    chart's own list. This keeps values.schema.json in step with rmd_agent/rmd_operator settings."""
    fields = {f.name: str(f.type) for f in dataclasses.fields(settings_cls)}
    assert set_by_chart <= fields.keys(), set_by_chart - fields.keys()
    offered = load_schema()["properties"][values_key]["properties"]["settings"]["properties"]
    assert set(offered) == fields.keys() - set_by_chart
    for name, prop in offered.items():
        schema_types = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
        assert set(schema_types) == SCHEMA_TYPES[fields[name]], name


@pytest.mark.parametrize(
    ("settings_cls", "values_key"), [(AgentSettings, "agent"), (OperatorSettings, "operator")]
)
def test_default_settings_values_are_valid_settings(settings_cls: type, values_key: str) -> None:
    """What values.yaml puts into the config file is accepted by the program's own loader."""
    settings = load_values()[values_key]["settings"]
    names = {f.name for f in dataclasses.fields(settings_cls)}
    assert settings and set(settings) <= names
    defaults = settings_cls()
    assert any(getattr(defaults, k) != v for k, v in settings.items())  # the file changes something


def test_chart_crds_are_byte_identical_copies() -> None:
    """crds/ in the chart's crds/ (installed by helm, always), wao-core's API in wao-crds/ (templated, left
    out with nodeTelemetry.installCRDs: false)."""
    sources = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    always = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    optional = sorted(p.name for p in (CHART / "wao-crds").glob("*.yaml"))
    assert optional == ["nodeconfigs.wao.bitmedia.co.jp.yaml", "nodeconfigtemplates.wao.bitmedia.co.jp.yaml"]
    assert sorted(always + optional) == sources and not set(always) & set(optional)
    for name in always:
        assert (CHART / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes(), name
    for name in optional:
        assert (CHART / "wao-crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes(), name
    assert load_sync_tool().differences() == []


def test_wao_crds_are_templated_behind_their_value() -> None:
    template = (CHART / "templates" / "wao-crds.yaml").read_text()
    assert "{{- if .Values.nodeTelemetry.installCRDs }}" in template
    assert '.Files.Glob "wao-crds/*.yaml"' in template and "fromYaml" in template
    assert '"helm.sh/resource-policy" "keep"' in template
    assert load_values()["nodeTelemetry"] == {"installCRDs": True, "secretNamespaces": []}
    ignore = (CHART / ".helmignore").read_text().split()
    assert not any(p.startswith("wao-crds") for p in ignore)
    assert any(
        "Additional properties" in e for e in validation_errors({**load_values(), "nodeTelemetry": {"x": 1}})
    )


def test_sync_tool_reports_and_repairs_drift(tmp_path: Path) -> None:
    tool = load_sync_tool()
    source, chart = tmp_path / "crds", tmp_path / "chart"
    expected = tmp_path / "expected_crds.py"
    shutil.copytree(REPO / "crds", source)
    tool.sync(source, chart, expected)
    assert tool.differences(source, chart, expected) == []
    assert sorted(p.name for p in (chart / "wao-crds").iterdir()) == [
        "nodeconfigs.wao.bitmedia.co.jp.yaml",
        "nodeconfigtemplates.wao.bitmedia.co.jp.yaml",
    ]
    first = sorted((chart / "crds").glob("*.yaml"))[0].name
    (chart / "crds" / first).write_bytes((chart / "crds" / first).read_bytes() + b"# edited\n")
    (chart / "crds" / "stale.yaml").write_text("kind: Old\n")
    (chart / "crds" / "nodeconfigs.wao.bitmedia.co.jp.yaml").write_text("kind: Misplaced\n")
    (source / "new.example.com.yaml").write_text("kind: New\n")
    assert tool.differences(source, chart, expected) == [
        f"missing: {chart / 'crds' / 'new.example.com.yaml'}",
        f"differs: {chart / 'crds' / first}",
        f"not in {source}: {chart / 'crds' / 'nodeconfigs.wao.bitmedia.co.jp.yaml'}",
        f"not in {source}: {chart / 'crds' / 'stale.yaml'}",
    ]
    tool.sync(source, chart, expected)
    assert tool.differences(source, chart, expected) == []
    assert not (chart / "crds" / "stale.yaml").exists()
    assert not (chart / "crds" / "nodeconfigs.wao.bitmedia.co.jp.yaml").exists()


def test_sync_tool_keeps_the_digests_rmdctl_expects(tmp_path: Path) -> None:
    """A schema change in crds/ changes what `rmdctl validate` expects (expected_crds.py); --check says so."""
    tool = load_sync_tool()
    source, chart = tmp_path / "crds", tmp_path / "chart"
    expected = tmp_path / "expected_crds.py"
    shutil.copytree(REPO / "crds", source)
    tool.sync(source, chart, expected)
    crd_file = source / "rmdnodestates.intel.com.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["extra"] = {
        "type": "string"
    }
    crd_file.write_text(yaml.safe_dump(crd))
    shutil.copyfile(crd_file, chart / "crds" / crd_file.name)
    assert tool.differences(source, chart, expected) == [f"differs: {expected}"]
    before = expected.read_text()
    tool.sync(source, chart, expected)
    assert tool.differences(source, chart, expected) == []
    changed = [line for line in expected.read_text().splitlines() if line not in before.splitlines()]
    assert len(changed) == 1 and '"rmdnodestates.intel.com": ("v1alpha1", {"v1alpha1": ' in changed[0]


def test_chart_app_version_is_the_distribution_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    assert chart["apiVersion"] == "v2" and chart["name"] == "rmd"


def test_dashboard_is_shipped_from_the_chart_file() -> None:
    template = (CHART / "templates" / "dashboard.yaml").read_text()
    assert '.Files.Get "dashboards/rmd.json"' in template
    json.loads((CHART / "dashboards" / "rmd.json").read_text())
    # .helmignore must not drop it from the packaged chart.
    ignore = CHART / ".helmignore"
    patterns = ignore.read_text().split() if ignore.exists() else []
    assert not any(p in ("*.json", "dashboards/", "dashboards") for p in patterns)


def test_the_agents_csr_policy_spells_what_the_agent_asks_for() -> None:
    """The CEL of agent-csr-policy.yaml repeats rmd_api.agent_certs (helm cannot import it) and the longest
    lifetime the schema lets an agent ask for; tests/e2e/test_chart.py shows the agent's request passes it."""
    template = (CHART / "templates" / "agent-csr-policy.yaml").read_text()
    assert f"object.spec.signerName == '{SIGNER_NAME}'" in template
    assert "[" + ", ".join(f"'{u}'" for u in USAGES) + "]" in template
    assert f"size(variables.usages) == {len(USAGES)}" in template
    assert f"'{NODE_ANNOTATION}' in object.metadata.annotations" in template
    assert f"'{NODE_NAME_EXTRA}' in request.userInfo.extra" in template
    longest = load_schema()["properties"]["tls"]["properties"]["agentCertificateSeconds"]["maximum"]
    assert f"object.spec.expirationSeconds <= {longest})" in template
