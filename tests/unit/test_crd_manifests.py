"""Static checks of the CRD manifests in crds/ and of the manifests in examples/ (no binaries needed).

The API server enforces the same things at install time (structural schema) or at request time (CEL),
but only the e2e suite runs one; these checks catch mistakes early and cover what the server does not
insist on: a description on every field (for `kubectl explain`), bounded sizes for CEL cost, printer
columns that point at real fields, and example/sample fields that the schema would silently prune.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rmd_api import node_config

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"
EXAMPLES_DIR = ROOT / "examples"
SAMPLES_DIR = Path("/work/shared/samples")

Schema = dict[str, Any]

EXPECTED_CRDS = {
    "rmdworkloads.intel.com": ("intel.com", "v1alpha1", "RmdWorkload", "Namespaced"),
    "rmdnodestates.intel.com": ("intel.com", "v1alpha1", "RmdNodeState", "Namespaced"),
    "rmdconfigs.intel.com": ("intel.com", "v1alpha1", "RmdConfig", "Cluster"),
    "noderesourcetopologies.topology.node.k8s.io": (
        "topology.node.k8s.io",
        "v1alpha2",
        "NodeResourceTopology",
        "Cluster",
    ),
    "nodeconfigs.wao.bitmedia.co.jp": ("wao.bitmedia.co.jp", "v1beta1", "NodeConfig", "Namespaced"),
    "nodeconfigtemplates.wao.bitmedia.co.jp": (
        "wao.bitmedia.co.jp",
        "v1beta1",
        "NodeConfigTemplate",
        "Namespaced",
    ),
}
WAO_CRDS = ["nodeconfigs.wao.bitmedia.co.jp", "nodeconfigtemplates.wao.bitmedia.co.jp"]


def load_crd(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((CRD_DIR / f"{name}.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def served_schema(crd: dict[str, Any]) -> Schema:
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    assert isinstance(schema, dict)
    return schema


# The JSONSchemaProps keywords these CRDs may use; anything else is a typo the server would reject.
KEYWORDS = {
    "type", "description", "properties", "required", "items", "additionalProperties", "enum",
    "minimum", "maximum", "minLength", "maxLength", "maxItems", "maxProperties", "pattern", "format",
    "anyOf", "x-kubernetes-int-or-string", "x-kubernetes-validations", "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys", "x-kubernetes-preserve-unknown-fields", "default",
}  # fmt: skip


def walk(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every schema node with a readable path: .a.b for properties, [] for items, {} for map values."""
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from walk(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def workload_rules() -> list[dict[str, str]]:
    spec = served_schema(load_crd("rmdworkloads.intel.com"))["properties"]["spec"]
    rules: list[dict[str, str]] = spec["x-kubernetes-validations"]
    return rules


def cel_regex(node: Schema) -> str:
    """The regex of the first `self.matches('...')` rule of a node (CEL uses RE2; ours are RE2 ∩ Python)."""
    for rule in node["x-kubernetes-validations"]:
        found = re.search(r"self\.matches\('([^']*)'\)", rule["rule"])
        if found:
            return found.group(1)
    raise AssertionError("no matches() rule")


# --- the CRDs themselves -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED_CRDS))
def test_crd_identity(name: str) -> None:
    group, version, kind, scope = EXPECTED_CRDS[name]
    crd = load_crd(name)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == name == f"{crd['spec']['names']['plural']}.{group}"
    assert crd["spec"]["group"] == group
    assert crd["spec"]["scope"] == scope
    assert crd["spec"]["names"]["kind"] == kind
    (v,) = crd["spec"]["versions"]
    assert (v["name"], v["served"], v["storage"]) == (version, True, True)


def test_no_unexpected_crd_files() -> None:
    assert {p.stem for p in CRD_DIR.glob("*.yaml")} == set(EXPECTED_CRDS)


@pytest.mark.parametrize("name", sorted(EXPECTED_CRDS))
def test_schema_is_structural(name: str) -> None:
    """The rules the API server applies to CRD schemas, checked before an install can fail."""
    schema = served_schema(load_crd(name))
    assert schema["type"] == "object"
    for path, node in walk(schema):
        assert set(node) <= KEYWORDS, f"{path}: unknown keywords {set(node) - KEYWORDS}"
        if node.get("x-kubernetes-int-or-string"):
            # The only place anyOf is allowed: int-or-string, with the branches carrying no more than a type.
            assert "type" not in node, path
            assert all(set(branch) == {"type"} for branch in node["anyOf"]), path
            assert sorted(b["type"] for b in node["anyOf"]) == ["integer", "string"], path
            continue
        if node.get("x-kubernetes-preserve-unknown-fields") and "type" not in node:
            # Any JSON value (RmdConfig's agentSettings values: string, number or boolean, checked by the
            # operator); the server allows no other keyword but a description beside it.
            assert set(node) == {"x-kubernetes-preserve-unknown-fields", "description"}, path
            continue
        assert node.get("type") in {"object", "array", "string", "integer", "boolean", "number"}, path
        assert not {"$ref", "definitions", "oneOf", "allOf", "not", "anyOf"} & node.keys(), path
        assert not ("properties" in node and "additionalProperties" in node), path
        if node["type"] == "array":
            assert isinstance(node.get("items"), dict), f"{path}: arrays need one item schema"
        if "properties" in node or "additionalProperties" in node:
            assert node["type"] == "object", path
        for req in node.get("required", []):
            assert req in node.get("properties", {}), f"{path}: required {req} is not a property"
    # The server refuses anything on metadata (even a description) but its type.
    assert schema["properties"]["metadata"] == {"type": "object"}


@pytest.mark.parametrize("name", sorted(EXPECTED_CRDS))
def test_every_field_is_described(name: str) -> None:
    """`kubectl explain` shows these descriptions; an undocumented field is a gap in the user docs."""
    missing = [
        path or "<root>"
        for path, node in walk(served_schema(load_crd(name)))
        if path != ".metadata" and not str(node.get("description", "")).strip()
    ]
    assert missing == []


@pytest.mark.parametrize("name", sorted(EXPECTED_CRDS))
def test_printer_columns_point_at_schema_fields(name: str) -> None:
    crd = load_crd(name)
    (version,) = crd["spec"]["versions"]
    columns = version["additionalPrinterColumns"]
    schema = served_schema(crd)
    assert columns[-1] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    for col in columns[:-1]:
        assert col["type"] in {"string", "integer", "number", "boolean", "date"}
        assert col.get("description"), col["name"]
        # Resolve the JSONPath through the schema: filters select array items, the rest are properties.
        node = schema
        for part in re.sub(r"\[\?\(.*?\)\]", "[]", col["jsonPath"]).strip(".").split("."):
            node = node["properties"][part.removesuffix("[]")]
            if part.endswith("[]"):
                node = node["items"]
        assert node.get("type") in {"string", "array", "object", "integer", "number", "boolean"}, col


def test_printer_columns_summarise_workloads_and_node_states() -> None:
    def paths(name: str) -> dict[str, str]:
        (version,) = load_crd(name)["spec"]["versions"]
        return {
            c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"] if not c.get("priority")
        }

    assert paths("rmdworkloads.intel.com") == {
        "Nodes": ".spec.nodes",
        "State": ".status.summary",
        "Age": ".metadata.creationTimestamp",
    }
    node_state = paths("rmdnodestates.intel.com")
    assert node_state["Node"] == ".spec.node"
    assert node_state["Ready"] == '.status.conditions[?(@.type=="Ready")].status'


@pytest.mark.parametrize(
    "name", ["rmdworkloads.intel.com", "rmdnodestates.intel.com", "rmdconfigs.intel.com", *WAO_CRDS]
)
def test_status_subresource(name: str) -> None:
    (version,) = load_crd(name)["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    assert "status" in served_schema(load_crd(name))["properties"]


@pytest.mark.parametrize("name", sorted(EXPECTED_CRDS))
def test_cel_rules_have_messages_and_bounded_inputs(name: str) -> None:
    """The API server refuses a CRD whose CEL cost it cannot bound; strings and lists walked by rules
    (matches, split, all) need maxLength / maxItems."""
    for path, node in walk(served_schema(load_crd(name))):
        for rule in node.get("x-kubernetes-validations", []):
            assert rule["rule"].strip() and rule["message"].strip(), path
            if node.get("type") == "string":
                assert "maxLength" in node, f"{path}: string with CEL rule needs maxLength"
        if node.get("type") == "array" and "x-kubernetes-validations" in node.get("items", {}):
            assert "maxItems" in node, f"{path}: list of CEL-validated items needs maxItems"


def test_workload_rejects_meaningless_combinations_in_cel() -> None:
    """Each rule of §3.3/3.4 has a CEL rule; its message names the field(s) it concerns."""
    messages = [r["message"] for r in workload_rules()]
    expected = [
        ("spec.coreIds and spec.allCores",),
        ("spec.reservedCoreIds requires spec.allCores",),
        ("spec.coreIds or spec.allCores",),
        ("spec.cache", "spec.rdt.cache", "mutually"),
        ("spec.pstate", "spec.plugins.pstate", "mutually"),
        ("spec.policy", "cache ways"),
        ("spec.rdt.mba", "guaranteed cache"),
        ("spec.nodes or spec.nodeSelector",),
    ]
    for fragments in expected:
        assert any(all(f in m for f in fragments) for m in messages), fragments
    assert len(messages) == len(expected)


def test_cache_rules_shared_by_both_layouts() -> None:
    spec = served_schema(load_crd("rmdworkloads.intel.com"))["properties"]["spec"]["properties"]
    v01 = spec["cache"]
    v03 = spec["rdt"]["properties"]["cache"]
    assert v01["x-kubernetes-validations"] == v03["x-kubernetes-validations"]
    assert v01["properties"] == v03["properties"]
    rules = " ".join(r["rule"] for r in v03["x-kubernetes-validations"])
    assert "self.min" in rules and "self.max" in rules
    assert spec["pstate"]["properties"] == spec["plugins"]["properties"]["pstate"]["properties"]
    assert spec["plugins"]["properties"]["pstate"]["properties"]["ratio"]["type"] == "string"


def test_mba_bounds_and_policy_set() -> None:
    spec = served_schema(load_crd("rmdworkloads.intel.com"))["properties"]["spec"]["properties"]
    mba = spec["rdt"]["properties"]["mba"]
    pct = mba["properties"]["percentage"]
    assert (pct["minimum"], pct["maximum"]) == (1, 100)
    assert mba["properties"]["mbps"]["minimum"] == 1
    assert "percentage" in mba["x-kubernetes-validations"][0]["rule"]
    assert spec["policy"]["enum"] == ["gold", "silver", "bronze"]


CPU_LISTS_OK = ["0", "4", "0-3", "0,3,8-95", "10-10", "1,2,4-7"]
CPU_LISTS_BAD = ["", "a", "0-a", " 1", "1 ", "1,,2", "1-", "-1", "1-2-3", "0x1", "1;2", "123456"]


def test_cpu_list_syntax() -> None:
    spec = served_schema(load_crd("rmdworkloads.intel.com"))["properties"]["spec"]["properties"]
    items = spec["coreIds"]["items"]
    assert spec["reservedCoreIds"]["items"] == items
    regex = re.compile(cel_regex(items))
    assert [c for c in CPU_LISTS_OK if not regex.search(c)] == []
    assert [c for c in CPU_LISTS_BAD if regex.search(c)] == []
    assert any("split" in r["rule"] and "<=" in r["rule"] for r in items["x-kubernetes-validations"])


def test_pstate_ratio_syntax() -> None:
    spec = served_schema(load_crd("rmdworkloads.intel.com"))["properties"]["spec"]["properties"]
    regex = re.compile(cel_regex(spec["pstate"]["properties"]["ratio"]))
    assert all(regex.search(r) for r in ["3.0", "2.5", "1", "22.25"])
    assert not any(regex.search(r) for r in ["fast", "", "3.", ".5", "-1", "1e3", "3,0"])


def test_node_state_patterns() -> None:
    schema = served_schema(load_crd("rmdnodestates.intel.com"))
    status = schema["properties"]["status"]["properties"]
    endpoint = re.compile(status["endpoint"]["pattern"])
    assert all(endpoint.search(e) for e in ["10.0.0.7:8443", "worker-node-1:50051", "[fd00::1]:8443"])
    assert not any(endpoint.search(e) for e in ["10.0.0.7", ":8443", "http://a:1", "a:b", "fd00::1:8443x"])
    assert "rmd-node-state-" in schema["x-kubernetes-validations"][0]["rule"]
    assert status["capabilities"]["additionalProperties"]["required"] == ["supported"]
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    workloads = status["workloads"]["additionalProperties"]["additionalProperties"]
    assert workloads["type"] == "string"


def test_topology_quantities() -> None:
    schema = served_schema(load_crd("noderesourcetopologies.topology.node.k8s.io"))
    zone = schema["properties"]["zones"]["items"]
    assert schema["required"] == ["zones"]
    assert zone["required"] == ["name", "type"]
    resource = zone["properties"]["resources"]["items"]
    assert resource["required"] == ["name", "capacity", "allocatable", "available"]
    quantity = re.compile(resource["properties"]["capacity"]["pattern"])
    assert all(quantity.search(q) for q in ["12", "1k", "33554432k", "2Gi", "500m", "1e3", "0.5"])
    assert not any(quantity.search(q) for q in ["", "abc", "1 Gi", "1GB", "Gi"])
    for field in ("allocatable", "available"):
        assert resource["properties"][field]["pattern"] == quantity.pattern


# --- manifests users apply ------------------------------------------------------------------------


def manifest_files() -> list[Path]:
    files = sorted(EXAMPLES_DIR.glob("*.yaml"))
    if SAMPLES_DIR.is_dir():
        for sub in (SAMPLES_DIR, SAMPLES_DIR / "wao", SAMPLES_DIR / "rmdconfig"):
            files += sorted(sub.glob("*.yaml"))
    return files


def pruned_fields(obj: Any, schema: Schema, path: str = "") -> list[str]:
    """Fields of obj the API server would drop because the schema does not declare them."""
    if not isinstance(obj, dict) or schema.get("type") != "object" or path.endswith(".metadata"):
        if isinstance(obj, list) and "items" in schema:
            return [p for i, o in enumerate(obj) for p in pruned_fields(o, schema["items"], f"{path}[{i}]")]
        return []
    out: list[str] = []
    for key, value in obj.items():
        if key in schema.get("properties", {}):
            out += pruned_fields(value, schema["properties"][key], f"{path}.{key}")
        elif isinstance(schema.get("additionalProperties"), dict):
            out += pruned_fields(value, schema["additionalProperties"], f"{path}.{key}")
        else:
            out.append(f"{path}.{key}")
    return out


def crd_for(doc: dict[str, Any]) -> dict[str, Any] | None:
    group, _, version = doc["apiVersion"].rpartition("/")
    for name, (g, v, kind, _) in EXPECTED_CRDS.items():
        if (g, v, kind) == (group, version, doc["kind"]):
            return load_crd(name)
    return None


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_manifest_fields_are_all_declared(path: Path) -> None:
    """A field the schema does not declare is silently pruned: the manifest would lose its meaning."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        crd = crd_for(doc)
        if crd is None:
            assert doc["apiVersion"] == "v1", f"{path}: unknown kind {doc['kind']}"
            continue
        assert pruned_fields(doc, served_schema(crd)) == []


def test_examples_cover_both_layouts_and_the_cache_ways_pod() -> None:
    docs = [yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES_DIR.glob("*.yaml"))]
    specs = [d["spec"] for d in docs if d["kind"] == "RmdWorkload"]
    assert any("cache" in s for s in specs) and any("pstate" in s for s in specs)  # v0.1
    assert any("rdt" in s for s in specs) and any("plugins" in s for s in specs)  # v0.3
    assert any(s.get("allCores") and s.get("reservedCoreIds") for s in specs)
    assert any("nodeSelector" in s for s in specs) and any("policy" in s for s in specs)
    pods = [d for d in docs if d["kind"] == "Pod"]
    limits = [c["resources"]["limits"] for p in pods for c in p["spec"]["containers"]]
    assert any("intel.com/l3_cache_ways" in lim for lim in limits)
    # Every example is a single object with a name or generateName, so tests and users can apply it as is.
    assert all(d["metadata"].get("name") or d["metadata"].get("generateName") for d in docs)


# --- NodeConfig, NodeConfigTemplate (wao-core's API) -------------------------------------------------------


def endpoint_terms(spec: Schema) -> dict[tuple[str, str], Schema]:
    """(section, field) -> the endpoint term's schema, for a NodeConfig spec or a template's config."""
    return {
        (section, name): term
        for section in ("metricsCollector", "predictor")
        for name, term in spec["properties"][section]["properties"].items()
    }


def node_config_spec() -> Schema:
    spec: Schema = served_schema(load_crd("nodeconfigs.wao.bitmedia.co.jp"))["properties"]["spec"]
    return spec


def template_spec() -> Schema:
    spec: Schema = served_schema(load_crd("nodeconfigtemplates.wao.bitmedia.co.jp"))["properties"]["spec"]
    return spec


def test_node_config_has_wao_cores_fields_and_each_field_its_types() -> None:
    spec = node_config_spec()
    assert spec["required"] == ["nodeName", "metricsCollector"]
    terms = endpoint_terms(spec)
    assert set(terms) == set(node_config.TERMS)  # responseTime* too: wao-core has them
    for key, types in node_config.TERMS.items():
        term = terms[key]
        assert set(term["properties"]) == {
            "type", "endpoint", "basicAuthSecret", "fetchInterval",  # wao-core's
            "caBundleSecret", "insecureSkipVerify",  # ours: TLS verified by default (telemetry-collectors.md)
        }, key  # fmt: skip
        assert term["properties"]["insecureSkipVerify"]["type"] == "boolean"
        assert term["properties"]["caBundleSecret"]["required"] == ["name"]
        assert term["required"] == ["type"], key  # the endpoint only where the type needs one (CEL)
        assert tuple(term["properties"]["type"]["enum"]) == types, key
        assert term["properties"]["basicAuthSecret"]["required"] == ["name"]
        (rule,) = term["x-kubernetes-validations"]
        assert rule["fieldPath"] == ".endpoint" and rule["reason"] == "FieldValueRequired"
        assert "self.type in ['', 'Fake']" in rule["rule"]
    # Every term is the same but for its types and description.
    shapes = {
        yaml.safe_dump({k: v for k, v in t.items() if k != "description"} | {"properties": {
            k: v for k, v in t["properties"].items() if k != "type"}}) for t in terms.values()
    }  # fmt: skip
    assert len(shapes) == 1


def test_template_config_is_the_node_configs_with_templated_strings() -> None:
    """spec.template and the flat layout take the same terms as a NodeConfig; type, endpoint and
    basicAuthSecret.name may be templates (the CRD's regex is the renderer's, test_node_config_render.py)."""
    spec = template_spec()
    template = spec["properties"]["template"]
    flat = {k: spec["properties"][k] for k in ("metricsCollector", "predictor")}
    assert spec["required"] == ["nodeSelector"] and template["required"] == ["metricsCollector"]
    for section, schema in flat.items():
        strip = lambda s: {k: v for k, v in s.items() if k != "description"}  # noqa: E731
        assert strip(schema) == strip(template["properties"][section]), section
    config_terms, template_terms = endpoint_terms(node_config_spec()), endpoint_terms(template)
    for key, types in node_config.TERMS.items():
        props = template_terms[key]["properties"]
        type_rules = " ".join(r["rule"] for r in props["type"]["x-kubernetes-validations"])
        assert "enum" not in props["type"] and all(f"'{t}'" in type_rules for t in types), key
        assert "self.contains('{{')" in type_rules
        assert props["fetchInterval"] == config_terms[key]["properties"]["fetchInterval"]  # never templated
    rules = [r["message"] for r in spec["x-kubernetes-validations"]]
    assert any("mutually exclusive" in m for m in rules) and any("is required" in m for m in rules)


def fetch_interval_rules() -> list[dict[str, str]]:
    term = endpoint_terms(node_config_spec())[("metricsCollector", "inletTemp")]
    rules: list[dict[str, str]] = term["properties"]["fetchInterval"]["x-kubernetes-validations"]
    return rules


def test_fetch_interval_is_a_positive_duration_of_at_least_a_second() -> None:
    rules = fetch_interval_rules()
    assert [r["message"] for r in rules] == [
        "must not be negative",
        "must be a duration such as 15s, 1m or 1m30s",
        "must be at least 1s",
    ]
    regex = re.compile(re.search(r"self\.matches\('([^']*)'\)", rules[1]["rule"]).group(1))  # type: ignore[union-attr]
    assert all(regex.search(d) for d in ["15s", "10s", "1m30s", "1.5s", "2h", "500ms"])
    assert not any(regex.search(d) for d in ["", "15", "-5s", "1x", "s", "1 s", "1.s"])
    description = endpoint_terms(node_config_spec())[("metricsCollector", "deltaP")]["properties"]
    assert "Absent: 15s" in description["fetchInterval"]["description"]
    assert node_config.DEFAULT_FETCH_INTERVAL_SECONDS == 15.0


def test_endpoints_must_be_http_urls_unless_templated() -> None:
    config = endpoint_terms(node_config_spec())[("predictor", "powerConsumption")]["properties"]["endpoint"]
    (rule,) = config["x-kubernetes-validations"]
    assert "url(self).getScheme() in ['http', 'https']" in rule["rule"] and "self == ''" in rule["rule"]
    templated = endpoint_terms(template_spec()["properties"]["template"])[("predictor", "powerConsumption")]
    first = templated["properties"]["endpoint"]["x-kubernetes-validations"][0]["rule"]
    assert "self.contains('{{') ||" in first and "isURL(self)" in first


def test_statuses_report_values_and_conditions() -> None:
    status = served_schema(load_crd("nodeconfigs.wao.bitmedia.co.jp"))["properties"]["status"]["properties"]
    assert set(status) == {"observedGeneration", "sources"}
    assert tuple(status["sources"]["properties"]) == node_config.SOURCES
    source = status["sources"]["properties"]["inletTemp"]["properties"]
    assert set(source) == {"value", "time", "conditions"}  # what the collectors write (SourceSnapshot.status)
    assert source["value"]["type"] == "string" and source["time"]["format"] == "date-time"
    assert source["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    assert all(t in source["conditions"]["description"] for t in node_config.SOURCE_CONDITION_TYPES)
    template = served_schema(load_crd("nodeconfigtemplates.wao.bitmedia.co.jp"))["properties"]["status"]
    problem = template["properties"]["problems"]["items"]
    assert problem["required"] == ["node", "reason", "message"]
    reasons = (
        node_config.TEMPLATE_ERROR,
        node_config.CONFLICT,
        node_config.INVALID,
        node_config.WRITE_FAILED,
    )
    assert all(r in problem["properties"]["reason"]["description"] for r in reasons)


def test_printer_columns_show_each_nodes_values_and_each_templates_state() -> None:
    def columns(name: str) -> dict[str, str]:
        (version,) = load_crd(name)["spec"]["versions"]
        return {
            c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"] if not c.get("priority")
        }

    assert columns("nodeconfigs.wao.bitmedia.co.jp") == {
        "Node": ".spec.nodeName",
        "InletTemp": ".status.sources.inletTemp.value",
        "DeltaP": ".status.sources.deltaP.value",
        "Power": ".status.sources.powerConsumption.value",
        "Age": ".metadata.creationTimestamp",
    }
    assert columns("nodeconfigtemplates.wao.bitmedia.co.jp")["Ready"] == (
        '.status.conditions[?(@.type=="Ready")].status'
    )


def test_the_seeds_template_uses_the_flat_layout() -> None:
    """The seed's NodeConfigTemplate has metricsCollector/predictor directly under spec (wao-core's CRD would
    prune them and refuse the object for lack of spec.template); both layouts are accepted here."""
    path = SAMPLES_DIR / "wao" / "nodeconfigtemplate.yaml"
    if not path.exists():
        pytest.skip(f"{path} does not exist")
    spec = yaml.safe_load(path.read_text())["spec"]
    assert "template" not in spec and "metricsCollector" in spec
