"""The names both sides import (rmd_api.names, rmd_api.node_state) are the ones crds/ serves and the docs
describe. Literals here are the independent check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from rmd_api import node_config, node_state
from rmd_api.names import (
    CACHE_WAYS_RESOURCE,
    NODE_CONFIG,
    NODE_CONFIG_TEMPLATE,
    NODE_RESOURCE_TOPOLOGY,
    RMD_NODE_STATE,
    RMD_WORKLOAD,
    CustomResource,
)

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = [RMD_WORKLOAD, RMD_NODE_STATE, NODE_RESOURCE_TOPOLOGY, NODE_CONFIG, NODE_CONFIG_TEMPLATE]


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_resource_names_are_the_crds(resource: CustomResource) -> None:
    crd = yaml.safe_load((ROOT / "crds" / f"{resource.crd_name}.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    assert crd["metadata"]["name"] == resource.crd_name
    assert (crd["spec"]["group"], version["name"]) == (resource.group, resource.version)
    assert (crd["spec"]["names"]["kind"], crd["spec"]["names"]["plural"]) == (resource.kind, resource.plural)
    assert resource.api_version == f"{crd['spec']['group']}/{version['name']}"


def test_the_names_themselves() -> None:
    assert RMD_WORKLOAD.api_version == RMD_NODE_STATE.api_version == "intel.com/v1alpha1"
    assert NODE_RESOURCE_TOPOLOGY.api_version == "topology.node.k8s.io/v1alpha2"
    assert CACHE_WAYS_RESOURCE == "intel.com/l3_cache_ways"
    # wao-core's API as its users' manifests spell it (its later releases say node.waok8s.github.io).
    assert NODE_CONFIG.api_version == NODE_CONFIG_TEMPLATE.api_version == "wao.bitmedia.co.jp/v1beta1"
    assert (
        node_config.node_config_name("redfish-enabled-nodes", "worker-0") == "redfish-enabled-nodes-worker-0"
    )
    assert node_state.node_state_name("worker-1") == "rmd-node-state-worker-1"


def test_node_state_name_is_the_one_the_crd_enforces() -> None:
    crd = (ROOT / "crds" / f"{RMD_NODE_STATE.crd_name}.yaml").read_text()
    rule = f"self.metadata.name == '{node_state.NAME_PREFIX}' + self.spec.node"
    assert rule in crd


def test_capability_keys_are_the_documented_probe_features() -> None:
    documented = re.findall(r"^\| `(\w+)` \|", (ROOT / "docs" / "probe.md").read_text(), re.MULTILINE)
    keys = [
        node_state.RESCTRL_MOUNTED,
        node_state.RDT_L3_CAT,
        node_state.MBA,
        node_state.NUMA,
        node_state.L3_CACHE,
        node_state.RAPL,
        node_state.CPUFREQ,
        node_state.CGROUP,
        node_state.CPU_MANAGER_POLICY,
        node_state.TOPOLOGY_MANAGER_POLICY,
        node_state.POD_RESOURCES,
        node_state.POD_RESOURCES_GET,
    ]
    assert documented == keys
    assert (node_state.RDT_L3_CAT, node_state.MBA) == ("rdtL3Cat", "mba")


def test_ready_reasons_are_the_documented_ones() -> None:
    table = re.findall(
        r"^\| `(True|False)` \| `(\w+)` \|", (ROOT / "docs" / "node-state.md").read_text(), re.M
    )
    assert table == [
        ("True", node_state.AGENT_READY),
        ("False", node_state.ENGINE_NOT_READY),
        ("False", node_state.ENGINE_UNAVAILABLE),
        ("False", node_state.AGENT_STOPPED),
        ("False", node_state.HEARTBEAT_EXPIRED),
    ]
    assert node_state.READY == "Ready"


def test_template_ready_reasons_are_the_documented_ones() -> None:
    """docs/telemetry.md lists the reasons a template's Ready condition and problems carry."""
    doc = (ROOT / "docs" / "telemetry.md").read_text()
    table = re.findall(r"^\| `(\w+)` \| (?:Ready|problem)", doc, re.M)
    assert table == [
        node_config.SYNCED,
        node_config.INVALID_SELECTOR,
        node_config.TEMPLATE_ERROR,
        node_config.INVALID,
        node_config.CONFLICT,
        node_config.WRITE_FAILED,
    ]
