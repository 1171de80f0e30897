"""The CRDs on a real kube-apiserver: users' manifests apply unchanged, meaningless requests are refused
with 422 and a message naming the field and the rule, the status subresource behaves, kubectl shows
documentation and columns.

The control_plane fixture (tests/e2e/conftest.py) installs every crds/*.yaml at session start.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError

from rmd_sim.control_plane import ControlPlane, repo_root

pytestmark = pytest.mark.e2e

EXAMPLES_DIR = repo_root() / "examples"
SAMPLES_DIR = Path(os.environ.get("RMD_SAMPLES_DIR", "/work/shared/samples"))
FIELD_MANAGER = "rmd-e2e-crds"
# Unknown or duplicate fields fail instead of being pruned with a warning: a manifest that applies
# under Strict keeps every field it was written with.
STRICT = [("fieldValidation", "Strict")]
WORKLOADS = "/apis/intel.com/v1alpha1/namespaces/{ns}/rmdworkloads"
NODE_STATES = "/apis/intel.com/v1alpha1/namespaces/{ns}/rmdnodestates"
TOPOLOGIES = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
Obj = dict[str, Any]


# --- helpers ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kube(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DynamicClient]:
    with control_plane.api_client() as api:
        # Own discovery cache: the default lives in /tmp, keyed by URL, and would outlive this server.
        cache = tmp_path_factory.mktemp("discovery") / "cache.json"
        yield DynamicClient(api, cache_file=str(cache))  # type: ignore[no-untyped-call]


def call(kube: DynamicClient, method: str, path: str, body: Obj | None = None, **kwargs: Any) -> Obj:
    result: Any = kube.request(method, path, body=body, **kwargs)
    return dict(result.to_dict())


def create(kube: DynamicClient, path: str, body: Obj) -> Obj:
    return call(kube, "post", path, body, query_params=list(STRICT))


def merge_patch(kube: DynamicClient, path: str, body: Obj) -> Obj:
    return call(kube, "patch", path, body, content_type="application/merge-patch+json")


def rejection(action: Callable[[], object]) -> tuple[int, str]:
    """(HTTP status, message) of a request the API server must refuse."""
    with pytest.raises(DynamicApiError) as info:
        action()
    body = json.loads(info.value.body or "{}")
    return info.value.status, str(body.get("message", ""))


def apply_manifest(kube: DynamicClient, doc: Obj, namespace: str) -> Obj:
    """Apply one document as a user would: server-side apply (create for generateName), strict fields."""
    resource = kube.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    ns = namespace if resource.namespaced else None
    if doc["metadata"].get("name"):
        result = kube.server_side_apply(  # type: ignore[no-untyped-call]
            resource, body=doc, namespace=ns, field_manager=FIELD_MANAGER, query_params=list(STRICT)
        )
    else:
        result = kube.create(resource, body=doc, namespace=ns, query_params=list(STRICT))  # type: ignore[no-untyped-call]
    return dict(result.to_dict())


def manifest_params() -> list[Any]:
    params = [pytest.param(p, id=f"examples/{p.name}") for p in sorted(EXAMPLES_DIR.glob("*.yaml"))]
    if SAMPLES_DIR.is_dir():
        params += [pytest.param(p, id=f"samples/{p.name}") for p in sorted(SAMPLES_DIR.glob("*.yaml"))]
    else:
        params.append(
            pytest.param(None, id="samples", marks=pytest.mark.skip(reason=f"{SAMPLES_DIR} does not exist"))
        )
    return params


def workload(spec: Obj, name: str = "wl") -> Obj:
    return {
        "apiVersion": "intel.com/v1alpha1",
        "kind": "RmdWorkload",
        "metadata": {"name": name},
        "spec": spec,
    }


def kubectl_until(
    cp: ControlPlane, args: list[str], ready: Callable[[str], bool], timeout: float = 60
) -> str:
    """kubectl output once `ready` accepts it; the API server publishes new CRDs' OpenAPI asynchronously."""
    deadline = time.monotonic() + timeout
    while True:
        out = cp.kubectl(*args, check=False)
        if out.returncode == 0 and ready(out.stdout):
            return out.stdout
        if time.monotonic() > deadline:
            raise AssertionError(f"kubectl {' '.join(args)}: rc={out.returncode}\n{out.stdout}\n{out.stderr}")
        time.sleep(0.5)


# --- users' manifests ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", manifest_params())
def test_manifest_applies_unchanged(kube: DynamicClient, namespace: str, path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        stored = apply_manifest(kube, copy.deepcopy(doc), namespace)
        assert stored["kind"] == doc["kind"]
        if doc["kind"] == "Pod":
            # The API server adds defaults to pods; what must survive is what the node agent reads.
            assert stored["metadata"].get("annotations") == doc["metadata"].get("annotations")
            got = [c["resources"] for c in stored["spec"]["containers"]]
            want = [c["resources"] for c in doc["spec"]["containers"]]
            assert [{k: {r: str(v) for r, v in q.items()} for k, q in res.items()} for res in want] == got
        else:
            # Custom resources: nothing pruned, nothing defaulted, so the manifest means what it meant.
            assert stored["spec"] == doc["spec"]
            # A second apply of the same manifest is a no-op (same generation).
            again = apply_manifest(kube, copy.deepcopy(doc), namespace)
            assert again["metadata"]["generation"] == stored["metadata"]["generation"] == 1


# --- RmdWorkload validation ------------------------------------------------------------------------

VALID_WORKLOADS = {
    "shared-pool-no-cache": {"coreIds": ["0-3"], "nodes": ["n1"]},
    "guaranteed-mba-mbps": {
        "coreIds": ["4", "5"],
        "rdt": {"cache": {"max": 2, "min": 2}, "mba": {"mbps": 2000}},
        "nodes": ["n1"],
    },
    "v01-cache-with-v03-mba": {
        "coreIds": ["4"],
        "cache": {"max": 1, "min": 1},
        "rdt": {"mba": {"percentage": 100}},
        "nodes": ["n1"],
    },
    "allcores-reserved-selector": {
        "allCores": True,
        "reservedCoreIds": ["0-1", "5"],
        "policy": "silver",
        "nodeSelector": {"node.guaranteed.cache.only": "true"},
    },
    "nodes-and-selector": {
        "coreIds": ["0,3,8-95"],
        "rdt": {"cache": {"max": 0, "min": 0}},
        "nodes": ["n1"],
        "nodeSelector": {"a": "b"},
    },
    "pstate-only-integer-ratio": {"coreIds": ["7"], "plugins": {"pstate": {"ratio": "3"}}, "nodes": ["n1"]},
    # The edges of each range (rmd_api.limits) are in it.
    "pstate-ratio-highest": {"coreIds": ["7"], "pstate": {"ratio": "99.9999"}, "nodes": ["n1"]},
    "pstate-ratio-lowest": {
        "coreIds": ["7"],
        "plugins": {"pstate": {"ratio": "0.0001", "monitoring": "off"}},
        "nodes": ["n1"],
    },
    "cache-ways-32-mbps-highest": {
        "coreIds": ["4"],
        "rdt": {"cache": {"max": 32, "min": 32}, "mba": {"mbps": 4294967290}},
        "nodes": ["n1"],
    },
    "v01-cache-ways-32-besteffort": {
        "coreIds": ["4"],
        "cache": {"max": 32, "min": 1},
        "nodes": ["n1"],
    },
    "mba-percentage-lowest": {
        "coreIds": ["4"],
        "rdt": {"cache": {"max": 1, "min": 1}, "mba": {"percentage": 1}},
        "nodes": ["n1"],
    },
    "mba-mbps-lowest": {
        "coreIds": ["4"],
        "cache": {"max": 1, "min": 1},
        "rdt": {"mba": {"mbps": 1}},
        "nodes": ["n1"],
    },
}


@pytest.mark.parametrize("spec", VALID_WORKLOADS.values(), ids=VALID_WORKLOADS.keys())
def test_meaningful_workload_is_accepted(kube: DynamicClient, namespace: str, spec: Obj) -> None:
    stored = create(kube, WORKLOADS.format(ns=namespace), workload(spec))
    assert stored["spec"] == spec


BASE = {"coreIds": ["0-3"], "nodes": ["worker-node-1"]}
GUARANTEED = {"rdt": {"cache": {"max": 2, "min": 2}}}

# (id, spec, fragment naming the field, fragment naming the rule)
INVALID_WORKLOADS: list[tuple[str, Obj, str, str]] = [
    ("cpu-list-letters", {**BASE, "coreIds": ["0-a"]}, "spec.coreIds[0]", "must be a cpu list"),
    ("cpu-list-spaces", {**BASE, "coreIds": ["1, 2"]}, "spec.coreIds[0]", "must be a cpu list"),
    ("cpu-range-descending", {**BASE, "coreIds": ["0", "11-8"]}, "spec.coreIds[1]", "must be ascending"),
    (
        "reserved-cpu-list-malformed",
        {**BASE, "coreIds": [], "allCores": True, "reservedCoreIds": ["0-"]},
        "spec.reservedCoreIds[0]",
        "must be a cpu list",
    ),
    (
        "cache-min-above-max",
        {**BASE, "rdt": {"cache": {"max": 2, "min": 3}}},
        "spec.rdt.cache",
        "min must not exceed cache max",
    ),
    (
        "cache-max-without-min",
        {**BASE, "rdt": {"cache": {"max": 2, "min": 0}}},
        "spec.rdt.cache",
        "max > 0 needs min > 0",
    ),
    ("v01-cache-min-only", {**BASE, "cache": {"min": 1}}, "spec.cache", "min must not exceed cache max"),
    (
        "v01-cache-max-only",
        {**BASE, "cache": {"max": 3}},
        "spec.cache",
        "max > 0 needs min > 0",
    ),
    (
        "cache-ways-negative",
        {**BASE, "rdt": {"cache": {"max": -1, "min": -1}}},
        "spec.rdt.cache.max",
        "greater than or equal to 0",
    ),
    (
        "cache-ways-above-32",
        {**BASE, "rdt": {"cache": {"max": 33, "min": 33}}},
        "spec.rdt.cache.max",
        "less than or equal to 32",
    ),
    (
        "v01-cache-min-above-32",
        {**BASE, "cache": {"max": 33, "min": 33}},
        "spec.cache.min",
        "less than or equal to 32",
    ),
    (
        "pstate-ratio-not-numeric",
        {**BASE, "plugins": {"pstate": {"ratio": "fast"}}},
        "spec.plugins.pstate.ratio",
        "greater than 0 and less than 100",
    ),
    (
        "v01-pstate-ratio-zero",
        {**BASE, "pstate": {"ratio": "0.0"}},
        "spec.pstate.ratio",
        "greater than 0 and less than 100",
    ),
    (
        "pstate-ratio-negative",
        {**BASE, "plugins": {"pstate": {"ratio": "-1"}}},
        "spec.plugins.pstate.ratio",
        "greater than 0 and less than 100",
    ),
    (
        "pstate-ratio-100",
        {**BASE, "plugins": {"pstate": {"ratio": "100"}}},
        "spec.plugins.pstate.ratio",
        "greater than 0 and less than 100",
    ),
    (
        "v01-pstate-ratio-9999.9999",  # issue #13: this ended Successful
        {**BASE, "pstate": {"ratio": "9999.9999"}},
        "spec.pstate.ratio",
        "greater than 0 and less than 100",
    ),
    (
        "pstate-monitoring-unknown",
        {**BASE, "plugins": {"pstate": {"monitoring": "yes"}}},
        "spec.plugins.pstate.monitoring",
        'supported values: "on", "off"',
    ),
    ("pstate-empty", {**BASE, "plugins": {"pstate": {}}}, "spec.plugins.pstate", "set ratio, monitoring"),
    (
        "mba-percentage-zero",
        {**BASE, "rdt": {**GUARANTEED["rdt"], "mba": {"percentage": 0}}},
        "spec.rdt.mba.percentage",
        "greater than or equal to 1",
    ),
    (
        "mba-percentage-above-100",
        {**BASE, "rdt": {**GUARANTEED["rdt"], "mba": {"percentage": 101}}},
        "spec.rdt.mba.percentage",
        "less than or equal to 100",
    ),
    (
        "mba-mbps-zero",
        {**BASE, "rdt": {**GUARANTEED["rdt"], "mba": {"mbps": 0}}},
        "spec.rdt.mba.mbps",
        "greater than or equal to 1",
    ),
    (
        "mba-mbps-above-bound",
        {**BASE, "rdt": {**GUARANTEED["rdt"], "mba": {"mbps": 4294967291}}},
        "spec.rdt.mba.mbps",
        "less than or equal to 4294967290",
    ),
    (
        "mba-percentage-and-mbps",
        {**BASE, "rdt": {**GUARANTEED["rdt"], "mba": {"percentage": 50, "mbps": 1000}}},
        "spec.rdt.mba",
        "exactly one of percentage or mbps",
    ),
    (
        "mba-without-cache",
        {**BASE, "rdt": {"mba": {"percentage": 50}}},
        "spec.rdt.mba",
        "needs guaranteed cache",
    ),
    (
        "mba-with-besteffort-cache",
        {**BASE, "rdt": {"cache": {"max": 3, "min": 1}, "mba": {"mbps": 500}}},
        "spec.rdt.mba",
        "needs guaranteed cache",
    ),
    (
        "mba-with-shared-policy",
        {**BASE, "policy": "bronze", "rdt": {"mba": {"percentage": 40}}},
        "spec.rdt.mba",
        "needs guaranteed cache",
    ),
    (
        "v01-and-v03-cache",
        {**BASE, **GUARANTEED, "cache": {"max": 2, "min": 2}},
        "spec.cache",
        "spec.cache (v0.1 layout) and spec.rdt.cache (v0.3 layout) are mutually exclusive",
    ),
    (
        "v01-and-v03-pstate",
        {**BASE, "pstate": {"ratio": "2.0"}, "plugins": {"pstate": {"ratio": "2.0"}}},
        "spec.pstate",
        "spec.pstate (v0.1 layout) and spec.plugins.pstate (v0.3 layout) are mutually exclusive",
    ),
    (
        "policy-and-cache",
        {**BASE, **GUARANTEED, "policy": "gold"},
        "spec.policy",
        "the policy sets the cache ways",
    ),
    (
        "policy-unknown",
        {**BASE, "policy": "platinum"},
        "spec.policy",
        'supported values: "gold", "silver", "bronze"',
    ),
    (
        "cores-and-allcores",
        {**BASE, "allCores": True},
        "spec.coreIds",
        "spec.coreIds and spec.allCores are mutually exclusive",
    ),
    (
        "reserved-without-allcores",
        {**BASE, "reservedCoreIds": ["0"]},
        "spec.reservedCoreIds",
        "requires spec.allCores: true",
    ),
    (
        "no-cpus",
        {"nodes": ["worker-node-1"], "allCores": False},
        "spec",
        "spec.coreIds or spec.allCores: true is required",
    ),
    (
        "no-target-nodes",
        {"coreIds": ["0"], "nodes": [], "nodeSelector": {}},
        "spec",
        "spec.nodes or spec.nodeSelector is required",
    ),
    (
        "node-name-invalid",
        {**BASE, "nodes": ["Worker_1"]},
        "spec.nodes[0]",
        "should match",
    ),
    (
        "node-listed-twice",
        {**BASE, "nodes": ["worker-node-1", "worker-node-1"]},
        "spec.nodes[1]",
        "Duplicate value",
    ),
    (
        "unknown-field",
        {**BASE, "cores": ["0"]},
        "spec.cores",
        "unknown field",
    ),
]


@pytest.mark.parametrize(
    ("spec", "field", "rule"),
    [pytest.param(spec, field, rule, id=case_id) for case_id, spec, field, rule in INVALID_WORKLOADS],
)
def test_meaningless_workload_is_rejected(
    kube: DynamicClient, namespace: str, spec: Obj, field: str, rule: str
) -> None:
    status, message = rejection(lambda: create(kube, WORKLOADS.format(ns=namespace), workload(spec)))
    # Unknown fields are refused by strict field validation (400); everything else by the schema (422).
    assert status == (400 if rule == "unknown field" else 422), message
    assert field in message and rule in message, message


# --- RmdNodeState ----------------------------------------------------------------------------------


def node_state(node: str, name: str | None = None) -> Obj:
    return {
        "apiVersion": "intel.com/v1alpha1",
        "kind": "RmdNodeState",
        "metadata": {"name": name or f"rmd-node-state-{node}"},
        "spec": {"node": node},
    }


NODE_STATUS: Obj = {
    "endpoint": "10.0.0.7:8443",
    "capabilities": {
        "rdtL3Cat": {"supported": True, "detail": "11 ways, 16 classes"},
        "mba": {"supported": False, "reason": "NotInCpuFlags", "detail": "no rdt_a/mba cpu flag"},
        "cgroupVersion": {"supported": True, "detail": "v2"},
    },
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "ProbeSucceeded",
            "message": "resctrl mounted at /sys/fs/resctrl",
            "lastTransitionTime": "2026-01-02T03:04:05Z",
            "observedGeneration": 1,
        }
    ],
    "workloads": {"wl-a": {"ID": "1", "Core IDs": "0,1,2,3", "Status": "Successful", "Cache Max": "2"}},
}


def test_node_state_accepts_agent_status(
    control_plane: ControlPlane, kube: DynamicClient, namespace: str
) -> None:
    path = NODE_STATES.format(ns=namespace)
    created = create(kube, path, node_state("worker-node-1"))
    assert created["spec"] == {"node": "worker-node-1"}
    stored = merge_patch(kube, f"{path}/rmd-node-state-worker-node-1/status", {"status": NODE_STATUS})
    assert stored["status"] == NODE_STATUS
    out = kubectl_until(
        control_plane, ["get", "rmdnodestates", "-n", namespace], lambda s: "10.0.0.7:8443" in s
    )
    header, row = out.splitlines()
    assert header.split() == ["NAME", "NODE", "ENDPOINT", "READY", "AGE"]
    assert row.split()[:4] == ["rmd-node-state-worker-node-1", "worker-node-1", "10.0.0.7:8443", "True"]


@pytest.mark.parametrize(
    ("status", "field", "rule"),
    [
        pytest.param({"endpoint": "10.0.0.7"}, "status.endpoint", "should match", id="endpoint-without-port"),
        pytest.param(
            {"endpoint": "node-1:70000"}, "status.endpoint", "within 1..65535", id="endpoint-port-range"
        ),
        pytest.param({"endpoint": "node-1:0"}, "status.endpoint", "within 1..65535", id="endpoint-port-zero"),
        pytest.param(
            {"capabilities": {"mba": {"detail": "x"}}},
            "status.capabilities.mba.supported",
            "Required value",
            id="capability-without-verdict",
        ),
        pytest.param(
            {"conditions": [{**NODE_STATUS["conditions"][0], "status": "Maybe"}]},
            "status.conditions[0].status",
            "supported values",
            id="condition-status",
        ),
        pytest.param(
            {"conditions": [{"type": "Ready", "status": "True"}]},
            "status.conditions[0].reason",
            "Required value",
            id="condition-incomplete",
        ),
    ],
)
def test_node_state_rejects_malformed_status(
    kube: DynamicClient, namespace: str, status: Obj, field: str, rule: str
) -> None:
    path = NODE_STATES.format(ns=namespace)
    create(kube, path, node_state("worker-node-2"))
    code, message = rejection(
        lambda: merge_patch(kube, f"{path}/rmd-node-state-worker-node-2/status", {"status": status})
    )
    assert code == 422, message
    assert field in message and rule in message, message


def test_node_state_name_and_node_are_tied(kube: DynamicClient, namespace: str) -> None:
    path = NODE_STATES.format(ns=namespace)
    code, message = rejection(lambda: create(kube, path, node_state("worker-node-1", name="state-of-node-1")))
    assert code == 422 and "metadata.name must be rmd-node-state-<spec.node>" in message, message
    code, message = rejection(lambda: create(kube, path, {**node_state("x"), "spec": {}}))
    assert code == 422 and "spec.node: Required value" in message, message

    create(kube, path, node_state("worker-node-3"))
    code, message = rejection(
        lambda: merge_patch(kube, f"{path}/rmd-node-state-worker-node-3", {"spec": {"node": "worker-node-4"}})
    )
    assert code == 422 and "spec.node" in message and "immutable" in message, message


# --- NodeResourceTopology --------------------------------------------------------------------------


@pytest.fixture
def topology_name(kube: DynamicClient) -> Iterator[str]:
    """A unique name for a cluster-scoped object, deleted afterwards (namespaces do not clean it up)."""
    name = f"e2e-node-{uuid.uuid4().hex[:8]}"
    yield name
    try:
        kube.request("delete", f"{TOPOLOGIES}/{name}")
    except DynamicApiError as exc:
        if exc.status != 404:
            raise


def topology(name: str, zones: list[Obj]) -> Obj:
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "container"},
        ],
        "zones": zones,
    }


def numa_zone(i: int) -> Obj:
    return {
        "name": f"node-{i}",
        "type": "Node",
        "costs": [
            {"name": "node-0", "value": 10 if i == 0 else 21},
            {"name": "node-1", "value": 21 if i == 0 else 10},
        ],
        "resources": [
            {"name": "cpu", "capacity": 8, "allocatable": "6", "available": "4"},
            {"name": "memory", "capacity": "33554432k", "allocatable": "32Gi", "available": "30Gi"},
        ],
    }


def test_topology_accepts_numa_zones(
    control_plane: ControlPlane, kube: DynamicClient, topology_name: str
) -> None:
    body = topology(topology_name, [numa_zone(0), numa_zone(1)])
    stored = create(kube, TOPOLOGIES, body)
    assert stored["zones"] == body["zones"] and stored["attributes"] == body["attributes"]
    out = kubectl_until(
        control_plane, ["get", "noderesourcetopologies", topology_name], lambda s: "NAME" in s
    )
    header, row = out.splitlines()
    assert header.split() == ["NAME", "POLICY", "AGE"]
    assert row.split()[:2] == [topology_name, "single-numa-node"]


@pytest.mark.parametrize(
    ("mutate", "field", "rule"),
    [
        pytest.param(lambda b: b.pop("zones"), "zones", "Required value", id="no-zones"),
        pytest.param(
            lambda b: b["zones"][0].pop("type"), "zones[0].type", "Required value", id="zone-without-type"
        ),
        pytest.param(
            lambda b: b["zones"][1]["resources"][0].pop("available"),
            "zones[1].resources[0].available",
            "Required value",
            id="resource-without-available",
        ),
        pytest.param(
            lambda b: b["zones"][0]["resources"][1].update(capacity="lots"),
            "zones[0].resources[1].capacity",
            "should match",
            id="quantity-malformed",
        ),
        pytest.param(
            lambda b: b["zones"][0]["costs"][0].update(value="near"),
            "zones[0].costs[0].value",
            "must be of type integer",
            id="cost-not-integer",
        ),
    ],
)
def test_topology_rejects_malformed_objects(
    kube: DynamicClient, topology_name: str, mutate: Callable[[Obj], object], field: str, rule: str
) -> None:
    body = topology(topology_name, [numa_zone(0), numa_zone(1)])
    mutate(body)
    code, message = rejection(lambda: create(kube, TOPOLOGIES, body))
    assert code == 422, message
    assert field in message and rule in message, message


# --- status subresource, kubectl -------------------------------------------------------------------

WORKLOAD_STATUS: Obj = {
    "summary": "1/1 Successful",
    "workloadStates": {
        "worker-node-1": {
            "response": "Success: 200",
            "id": "1",
            "cosName": "COS2",
            "status": "Successful",
            "coreIds": ["0-3"],
            "rdt": {
                "cache": {"max": 2, "min": 2},
                # what the node holds beside what was asked (#13 item 5): pruned if the schema lacked it
                "mba": {
                    "percentage": 15,
                    "applied": 20,
                    "rounded": True,
                    "message": "MBA 15% rounded up to 20%: the node's MBA step (bandwidth_gran) is 10%",
                },
            },
        }
    },
}


def test_status_is_a_subresource(kube: DynamicClient, namespace: str) -> None:
    path = WORKLOADS.format(ns=namespace)
    created = create(kube, path, workload({**BASE, **GUARANTEED}, name="status-wl"))
    assert "status" not in created
    item = f"{path}/status-wl"

    after_status = merge_patch(kube, f"{item}/status", {"status": WORKLOAD_STATUS})
    assert after_status["status"] == WORKLOAD_STATUS
    assert after_status["metadata"]["generation"] == created["metadata"]["generation"] == 1

    # Status sent to the main resource is ignored; the spec change there bumps the generation only.
    after_spec = merge_patch(
        kube, item, {"spec": {"coreIds": ["4-7"]}, "status": {"summary": "0/1 Successful"}}
    )
    assert after_spec["spec"]["coreIds"] == ["4-7"]
    assert after_spec["metadata"]["generation"] == 2
    assert after_spec["status"] == WORKLOAD_STATUS

    # And spec sent to /status is ignored.
    after_both = merge_patch(kube, f"{item}/status", {"spec": {"coreIds": ["9"]}, "status": {"summary": "x"}})
    assert after_both["spec"]["coreIds"] == ["4-7"] and after_both["status"]["summary"] == "x"


def test_status_generation_is_not_negative(kube: DynamicClient, namespace: str) -> None:
    path = WORKLOADS.format(ns=namespace)
    create(kube, path, workload(BASE, name="generation-wl"))
    code, message = rejection(
        lambda: merge_patch(kube, f"{path}/generation-wl/status", {"status": {"observedGeneration": -1}})
    )
    assert code == 422, message
    assert "status.observedGeneration" in message and "greater than or equal to 0" in message, message


def test_kubectl_explain_documents_fields(control_plane: ControlPlane) -> None:
    spec_doc = kubectl_until(control_plane, ["explain", "rmdworkload.spec"], lambda s: "coreIds" in s)
    for field in ("allCores", "coreIds", "reservedCoreIds", "policy", "rdt", "plugins", "cache", "pstate"):
        assert f"\n  {field}\t" in spec_doc, field
    text = " ".join(spec_doc.split())  # explain wraps descriptions
    assert "Cpus of the workload, as cpu lists" in text and "Mutually exclusive with allCores" in text
    cache_doc = " ".join(control_plane.kubectl("explain", "rmdworkload.spec.rdt.cache").stdout.split())
    assert "max == min > 0 is guaranteed" in cache_doc and "max <integer>" in cache_doc
    caps = " ".join(control_plane.kubectl("explain", "rmdnodestate.status.capabilities").stdout.split())
    assert "as found by the agent's probe" in caps


def test_kubectl_lists_workloads_with_state(
    control_plane: ControlPlane, kube: DynamicClient, namespace: str
) -> None:
    path = WORKLOADS.format(ns=namespace)
    create(kube, path, workload({**BASE, **GUARANTEED}, name="listed-wl"))
    merge_patch(kube, f"{path}/listed-wl/status", {"status": WORKLOAD_STATUS})
    out = kubectl_until(
        control_plane, ["get", "rmdworkloads", "-A"], lambda s: "listed-wl" in s and "Successful" in s
    )
    lines = out.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "NODES", "STATE", "AGE"]
    (row,) = [line.split() for line in lines if "listed-wl" in line]
    assert row[:5] == [namespace, "listed-wl", '["worker-node-1"]', "1/1", "Successful"]
    wide = control_plane.kubectl("get", "rmdwl", "-n", namespace, "-o", "wide").stdout
    assert wide.splitlines()[0].split() == ["NAME", "NODES", "SELECTOR", "CORES", "POLICY", "STATE", "AGE"]
    # The category lists every kind of the project at once.
    assert "listed-wl" in control_plane.kubectl("get", "rmd", "-n", namespace).stdout


def test_kubectl_rejects_invalid_manifest_with_reason(control_plane: ControlPlane, namespace: str) -> None:
    """What a user sees from `kubectl apply`: the field and the rule, not a generic failure."""
    manifest = yaml.safe_dump(workload({**BASE, "rdt": {"cache": {"max": 4, "min": 0}}}, name="bad"))
    out = subprocess.run(
        [
            str(control_plane.bin_dir / "kubectl"),
            f"--kubeconfig={control_plane.kubeconfig}",
            "apply",
            "--server-side",
            "-n",
            namespace,
            "-f",
            "-",
        ],
        input=manifest,
        capture_output=True,
        text=True,
        env=control_plane.env(),
        timeout=60,
        check=False,
    )
    assert out.returncode != 0
    assert "spec.rdt.cache" in out.stderr and "max > 0 needs min > 0" in out.stderr, out.stderr
