"""The pod flow: which pods qualify, annotation parsing, the RmdWorkload body (pods.py, pure), and the
orchestration (pod_flow.py) with fake agents and a fake API (no network, no kopf)."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from rmd_api.agent.v1 import agent_pb2
from rmd_api.cpuset import parse_cpu_list
from rmd_operator import pod_cpus, pods
from rmd_operator.agent_client import CallFailure
from rmd_operator.pod_flow import PodFlow
from rmd_operator.settings import OperatorSettings
from rmd_operator.spec import workload_spec
from rmd_operator.status import MESSAGE_LIMIT, EventText, merge_diff
from rmd_operator.targets import NodeAgent

Obj = dict[str, Any]
WAYS = pods.CACHE_WAYS


def container(
    name: str,
    cpu: str | None = "2",
    memory: str | None = "1Gi",
    ways: str | None = "2",
    requests: Obj | None = None,
) -> Obj:
    limits: Obj = {}
    if cpu is not None:
        limits["cpu"] = cpu
    if memory is not None:
        limits["memory"] = memory
    if ways is not None:
        limits[WAYS] = ways
    return {
        "name": name,
        "resources": {"limits": limits, "requests": requests if requests is not None else limits},
    }


def pod(
    *containers: Obj,
    name: str = "web",
    namespace: str = "ns",
    uid: str = "uid-1",
    node: str = "worker-1",
    annotations: Mapping[str, str] | None = None,
    init: Sequence[Obj] = (),
    qos: str | None = None,
    phase: str | None = None,
    status: Obj | None = None,
) -> Obj:
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "annotations": dict(annotations or {}),
        },
        "spec": {"nodeName": node, "containers": list(containers or [container("c")])},
        "status": {},
    }
    if init:
        body["spec"]["initContainers"] = list(init)
    if qos:
        body["status"]["qosClass"] = qos
    if phase:
        body["status"]["phase"] = phase
    body["status"].update(status or {})
    return body


def rejected_pod(reason: str = "TopologyAffinityError", **fields: Any) -> Obj:
    """The pod as its kubelet leaves it after refusing it at admission."""
    message = "Pod was rejected: Resources cannot be allocated with Topology locality"
    return pod(phase="Failed", status={"reason": reason, "message": message}, **fields)


# -- qualification -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("containers", "init", "qos", "granted", "reasons"),
    [
        pytest.param([container("c", cpu="2")], [], None, ["c"], [], id="guaranteed-integer"),
        pytest.param([container("c", cpu="3000m")], [], None, ["c"], [], id="guaranteed-millicores-whole"),
        pytest.param([container("c", cpu="1500m")], [], None, [], [pods.FRACTIONAL_CPUS], id="fractional"),
        pytest.param(
            [container("c", requests={"cpu": "1", "memory": "1Gi", WAYS: "2"}, cpu="2")],
            [],
            None,
            [],
            [pods.NOT_GUARANTEED],
            id="burstable-requests-below-limits",
        ),
        pytest.param(
            [container("c", cpu=None, memory=None)], [], None, [], [pods.NOT_GUARANTEED], id="besteffort"
        ),
        pytest.param(
            [container("c")],
            [container("init", cpu=None, memory="1Gi", ways=None)],
            None,
            [],
            [pods.NOT_GUARANTEED],
            id="init-container-without-cpu-limit",
        ),
        pytest.param([container("c")], [], "Burstable", [], [pods.NOT_GUARANTEED], id="api-server-qos-wins"),
        pytest.param([container("c", ways="0")], [], None, [], [], id="zero-ways-is-no-request"),
        pytest.param([container("c", ways=None)], [], None, [], [], id="no-request"),
        pytest.param(
            [container("a", cpu="2"), container("b", cpu="500m"), container("side", cpu="1", ways=None)],
            [],
            None,
            ["a"],
            [pods.FRACTIONAL_CPUS],
            id="per-container",
        ),
    ],
)
def test_qualification(
    containers: list[Obj], init: list[Obj], qos: str | None, granted: list[str], reasons: list[str]
) -> None:
    request = pods.pod_request(pod(*containers, init=init, qos=qos))
    assert [c.container for c in request.containers] == granted
    assert [r.reason for r in request.refusals] == reasons
    for refusal in request.refusals:
        assert "no RmdWorkload is created" in refusal.message


def test_refusal_messages_say_why() -> None:
    burstable = pods.pod_request(pod(container("c", requests={"cpu": "1", "memory": "1Gi", WAYS: "2"})))
    assert "QoS class is Burstable" in burstable.refusals[0].message
    fractional = pods.pod_request(pod(container("c", cpu="1500m")))
    assert fractional.refusals[0].container == "c"
    assert "requests 1.5 CPUs" in fractional.refusals[0].message


def test_qos_class_computed_like_the_api_server() -> None:
    assert pods.qos_class(pod(container("c"))) == "Guaranteed"
    # a request left out defaults to the limit
    assert (
        pods.qos_class(pod({"name": "c", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}))
        == "Guaranteed"
    )
    assert pods.qos_class(pod(container("c", memory=None))) == "Burstable"
    assert pods.qos_class(pod({"name": "c"})) == "BestEffort"


def test_asks_for_cache_ways_looks_at_limits_of_app_containers() -> None:
    assert pods.asks_for_cache_ways(pod(container("a", ways=None), container("b"))["spec"])
    assert not pods.asks_for_cache_ways(pod(container("a", ways=None))["spec"])
    only_init = pod(container("a", ways=None), init=[container("i")])
    assert not pods.asks_for_cache_ways(only_init["spec"])


# -- annotations ---------------------------------------------------------------------------------------------


def test_annotations_configure_their_own_container_only() -> None:
    """c1's annotations never configure c10, and the other way round (rmd-operator matched prefixes)."""
    request = pods.pod_request(
        pod(
            container("c1", ways="3"),
            container("c10", ways="4"),
            annotations={
                "c1_cache_min": "3",
                "c1_mba_percentage": "50",
                "c10_cache_min": "2",
                "c10_pstate_ratio": "1.5",
                "c10_pstate_monitoring": "on",
            },
        )
    )
    by_name = {c.container: c for c in request.containers}
    assert by_name["c1"] == pods.ContainerRequest("c1", 3, cache_min=3, mba_percentage=50)
    assert by_name["c10"] == pods.ContainerRequest(
        "c10", 4, cache_min=2, pstate_ratio="1.5", pstate_monitoring="on"
    )
    assert request.refusals == () and request.ignored == ()


def test_cache_min_makes_best_effort_and_defaults_to_the_limit() -> None:
    (default,) = pods.pod_request(pod(container("c", ways="3"))).containers
    assert pods.workload_spec(pods.pod_request(pod()), default, [1])["rdt"]["cache"] == {"max": 3, "min": 3}
    request = pods.pod_request(pod(container("c", ways="3"), annotations={"c_cache_min": "1"}))
    assert pods.workload_spec(request, request.containers[0], [1])["rdt"]["cache"] == {"max": 3, "min": 1}


@pytest.mark.parametrize(
    ("annotations", "fragment"),
    [
        ({"c_cache_min": "3"}, "from 1 to 2"),
        ({"c_cache_min": "0"}, "from 1 to 2"),
        ({"c_cache_min": "two"}, "whole number"),
        ({"c_mba_percentage": "abc"}, "c_mba_percentage='abc'"),
        ({"c_mba_percentage": "101"}, "from 1 to 100"),
        ({"c_mba_percentage": "50", "c_mba_mbps": "1000"}, "mutually exclusive"),
        ({"c_cache_min": "1", "c_mba_percentage": "50"}, "needs guaranteed cache"),
        ({"c_policy": "silver", "c_mba_mbps": "100"}, "needs guaranteed cache"),
        ({"c_policy": "platinum"}, "gold, silver, bronze"),
        ({"c_policy": "gold", "c_cache_min": "1"}, "the policy sets the cache ways"),
        ({"c_pstate_ratio": "fast"}, "greater than 0 and less than 100"),
        ({"c_pstate_ratio": "0"}, "greater than 0 and less than 100"),
        ({"c_pstate_ratio": "100"}, "greater than 0 and less than 100"),
        (
            {"c_pstate_ratio": "9999.9999"},
            "annotation c_pstate_ratio='9999.9999' must be a decimal number greater than 0 and less than 100 "
            '(a branch-miss threshold in per cent), such as "3.0"',
        ),
        ({"c_mba_mbps": "4294967291"}, "from 1 to 4294967290"),
        ({"c_pstate_monitoring": "yes"}, '"on" or "off"'),
    ],
)
def test_invalid_annotations_refuse_the_container(annotations: dict[str, str], fragment: str) -> None:
    request = pods.pod_request(pod(container("c"), container("d"), annotations=annotations))
    assert [c.container for c in request.containers] == ["d"]
    assert request.refusals == ()
    (invalid,) = request.invalid
    assert invalid.container == "c" and any(fragment in p for p in invalid.problems)
    event = pods.annotation_event(request)
    assert event is not None and (event.type, event.reason) == ("Warning", pods.INVALID_REQUEST)
    assert event.message.startswith("container c: ") and event.message.endswith("; no RmdWorkload is created")


def test_the_edges_of_each_range_are_accepted() -> None:
    annotations = {"c_pstate_ratio": "99.9999", "c_mba_mbps": "4294967290", "d_pstate_ratio": "0.0001"}
    request = pods.pod_request(
        pod(container("c", ways="32"), container("d", ways="1"), annotations=annotations)
    )
    assert request.refusals == ()
    c, d = request.containers
    spec = workload_spec(pods.workload_spec(request, c, [1]))  # what the operator then reads back
    assert (spec.cache.max, spec.mba.mbps, spec.pstate.ratio) == (32, 4294967290, 99.9999)
    assert d.pstate_ratio == "0.0001"


def test_more_ways_than_a_cache_bit_mask_has_refuse_the_container() -> None:
    """The limit becomes the RmdWorkload's rdt.cache.max, which the API server would refuse: an Event says
    why instead. A policy sets the ways itself, so then the limit only counts for the kubelet."""
    request = pods.pod_request(pod(container("c", ways="33"), container("d", ways="2")))
    assert [c.container for c in request.containers] == ["d"]
    (invalid,) = request.invalid
    assert invalid == pods.Invalid(
        "c", (f"the {WAYS} limit (rdt.cache.max) must be an integer within 0..32, not 33",)
    )
    gold = pods.pod_request(pod(container("c", ways="33"), annotations={"c_policy": "gold"}))
    assert gold.refusals == () and gold.containers[0].policy == "gold"


def test_policy_replaces_cache_ways_and_empty_policy_is_none() -> None:
    gold = pods.pod_request(pod(annotations={"c_policy": "gold", "c_mba_percentage": "40"}))
    spec = pods.workload_spec(gold, gold.containers[0], [2, 3])
    assert (
        spec["policy"] == "gold" and "cache" not in spec["rdt"] and spec["rdt"]["mba"] == {"percentage": 40}
    )
    empty = pods.pod_request(pod(annotations={"c_policy": " "}))
    assert empty.containers[0].policy is None


def test_annotations_that_configure_nothing_are_reported() -> None:
    request = pods.pod_request(
        pod(
            container("nginx"),
            container("side", ways=None),
            annotations={
                "nginx_polcy": "gold",  # a typo'd setting
                "ngnix_policy": "gold",  # a typo'd container
                "side_policy": "gold",  # a container without the limit
                "example.com/nginx_policy": "gold",  # another tool's key: not ours to judge
                "unrelated": "x",
            },
        )
    )
    assert request.containers[0].policy is None
    assert len(request.ignored) == 3
    text = " ".join(request.ignored)
    assert "nginx_polcy: unknown setting 'polcy'" in text
    assert "'ngnix' is not a container of this pod" in text
    assert f"'side' does not request {WAYS}" in text
    event = pods.annotation_event(request)
    assert event is not None and (event.type, event.reason) == ("Warning", pods.IGNORED_ANNOTATION)
    assert event.message == "annotations ignored: " + "; ".join(request.ignored)


LONG = "a" * 63  # the longest container name: a DNS label


def test_the_prefixed_form_configures_any_container_name() -> None:
    """`<container>.rmd.intel.com/<setting>` fits a 63-character container; `<container>_<setting>` cannot (an
    annotation key's name part is at most 63 characters). Both forms may be mixed, even for one container."""
    request = pods.pod_request(
        pod(
            container(LONG, ways="3"),
            container("c"),
            annotations={
                f"{LONG}.rmd.intel.com/mba_percentage": "50",
                f"{LONG}.rmd.intel.com/pstate_ratio": "1.5",
                "c.rmd.intel.com/policy": "gold",
                "c_pstate_monitoring": "on",
            },
        )
    )
    by_name = {c.container: c for c in request.containers}
    assert by_name[LONG] == pods.ContainerRequest(LONG, 3, mba_percentage=50, pstate_ratio="1.5")
    assert by_name["c"] == pods.ContainerRequest("c", 2, policy="gold", pstate_monitoring="on")
    assert request.refusals == () and request.ignored == ()


def test_both_forms_disagreeing_on_a_setting_refuse_the_container() -> None:
    """Neither form wins silently: different values are a conflict; the same value is no conflict."""
    request = pods.pod_request(
        pod(
            container("c"),
            container("d"),
            annotations={
                "c_mba_percentage": "50",
                "c.rmd.intel.com/mba_percentage": "60",
                "d_policy": "gold",
                "d.rmd.intel.com/policy": " gold",
            },
        )
    )
    assert [c.container for c in request.containers] == ["d"] and request.containers[0].policy == "gold"
    event = pods.annotation_event(request)
    assert event is not None and event.reason == pods.INVALID_REQUEST
    assert event.message == (
        "container c: annotations c.rmd.intel.com/mba_percentage='60' and c_mba_percentage='50' disagree: "
        "give mba_percentage once; no RmdWorkload is created"
    )


def test_prefixed_keys_that_configure_nothing_are_reported() -> None:
    request = pods.pod_request(
        pod(
            container("nginx"),
            container("side", ways=None),
            annotations={
                "nginx.rmd.intel.com/polcy": "gold",  # a typo'd setting
                "ngnix.rmd.intel.com/policy": "gold",  # a typo'd container
                "side.rmd.intel.com/policy": "gold",  # a container without the limit
                "rmd.intel.com/policy": "gold",  # no container at all
                "nginx.example.com/policy": "gold",  # another tool's key: not ours to judge
                "rmd.intel.com/something-else": "x",  # ours, but not a setting of this form
            },
        )
    )
    assert request.containers[0].policy is None
    assert len(request.ignored) == 4
    text = " ".join(request.ignored)
    assert "nginx.rmd.intel.com/polcy: unknown setting 'polcy'" in text
    assert "'ngnix' is not a container of this pod" in text
    assert f"'side' does not request {WAYS}" in text
    assert "rmd.intel.com/policy: names no container (the form is <container>.rmd.intel.com/policy)" in text


def test_every_problem_of_a_container_is_listed_and_long_values_are_cut() -> None:
    request = pods.pod_request(
        pod(
            container("c"),
            annotations={
                "c_mba_percentage": "abc",
                "c_pstate_ratio": "fast",
                "c_pstate_monitoring": "yes",
                "c_mba_mbps": "9" * 5000,
            },
        )
    )
    event = pods.annotation_event(request)
    assert event is not None and len(event.message) < 600
    assert event.message.startswith("container c: annotation c_mba_percentage='abc' must be")
    assert event.message.endswith("; no RmdWorkload is created")
    for fragment in (
        "annotation c_mba_mbps='" + "9" * 40 + "'... must be a whole number from 1 to 4294967290",
        "annotation c_mba_percentage='abc' must be a whole number from 1 to 100",
        "annotation c_pstate_ratio='fast' must be a decimal number",
        'annotation c_pstate_monitoring=\'yes\' must be "on" or "off"',
        "annotations c_mba_mbps and c_mba_percentage are mutually exclusive",
    ):
        assert fragment in event.message


@pytest.mark.parametrize(
    ("ways", "annotations", "problems"),
    [
        pytest.param(
            "33", {"c_policy": " "}, ["limit (rdt.cache.max) must be an integer"], id="empty-policy-is-none"
        ),
        pytest.param(
            "33",
            {"c_policy": "gold", "c.rmd.intel.com/policy": "silver"},
            ["disagree: give policy once"],
            id="a-conflicting-policy-is-not-judged-further",
        ),
        pytest.param(
            "2",
            {"c_policy": "platinum", "c_cache_min": "1", "c_mba_percentage": "50"},
            ["must be one of gold, silver, bronze", "are mutually exclusive: the policy sets the cache ways"],
            id="no-guess-whether-mba-has-guaranteed-cache",
        ),
        pytest.param(
            "2",
            {"c_cache_min": "1", "c_mba_percentage": "500", "c_mba_mbps": "x"},
            ["from 1 to 100", "from 1 to 4294967290", "are mutually exclusive: give the memory bandwidth"],
            id="bad-mba-values-and-both-units",
        ),
    ],
)
def test_each_problem_once_and_none_that_follows_from_another(
    ways: str, annotations: dict[str, str], problems: list[str]
) -> None:
    (invalid,) = pods.pod_request(pod(container("c", ways=ways), annotations=annotations)).invalid
    assert len(invalid.problems) == len(problems)
    for problem, fragment in zip(invalid.problems, problems, strict=True):
        assert fragment in problem


def test_annotations_are_checked_also_for_containers_refused_for_another_reason() -> None:
    """One look shows everything to fix: a Burstable pod's, a fractional container's annotations too."""
    burstable = pods.pod_request(
        pod(container("c", requests={"cpu": "1", "memory": "1Gi", WAYS: "2"}), annotations={"c_policy": "x"})
    )
    assert [r.reason for r in burstable.refusals] == [pods.NOT_GUARANTEED]
    assert [i.container for i in burstable.invalid] == ["c"] and burstable.containers == ()
    fractional = pods.pod_request(pod(container("c", cpu="1500m"), annotations={"c_policy": "x"}))
    assert [r.reason for r in fractional.refusals] == [pods.FRACTIONAL_CPUS]
    assert [i.container for i in fractional.invalid] == ["c"] and fractional.containers == ()


# -- the RmdWorkload -----------------------------------------------------------------------------------------


def test_workload_body_shape_and_spec_accepted_by_the_operator() -> None:
    request = pods.pod_request(
        pod(
            container("nginx1", cpu="3", ways="2"),
            name="guaranteed-cache-pod-x7",
            namespace="team-a",
            uid="0b1c",
            node="worker-node-2",
            annotations={"nginx1_mba_mbps": "2000", "nginx1_pstate_ratio": "3.0"},
        )
    )
    (want,) = request.containers
    body = pods.workload_body(request, want, [5, 3, 4, 37])
    assert body["apiVersion"] == "intel.com/v1alpha1" and body["kind"] == "RmdWorkload"
    meta = body["metadata"]
    assert (meta["name"], meta["namespace"]) == ("guaranteed-cache-pod-x7-rmd-workload-nginx1", "team-a")
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "guaranteed-cache-pod-x7",
            "uid": "0b1c",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert meta["labels"] == {
        pods.MANAGED_BY_LABEL: "rmd-operator",
        pods.POD_LABEL: "guaranteed-cache-pod-x7",
        pods.POD_UID_LABEL: "0b1c",
        pods.CONTAINER_LABEL: "nginx1",
    }
    assert body["spec"] == {
        "coreIds": ["3-5,37"],
        "nodes": ["worker-node-2"],
        "rdt": {"cache": {"max": 2, "min": 2}, "mba": {"mbps": 2000}},
        "plugins": {"pstate": {"ratio": "3.0"}},
    }
    agent_spec = workload_spec(body["spec"])
    assert list(agent_spec.core_ids) == ["3-5,37"]
    assert (agent_spec.cache.max, agent_spec.cache.min, agent_spec.mba.mbps) == (2, 2, 2000)
    assert agent_spec.pstate.ratio == 3.0
    assert pods.owner_pod_uid(body) == "0b1c"
    assert pods.owner_pod_uid({"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "uid": "x"}]}}) is None


def test_long_names_are_cut_but_stay_distinct_and_valid() -> None:
    assert pods.workload_name("web", "c") == "web-rmd-workload-c"
    long_a, long_b = "a" * 250, "a" * 249 + "b"
    name_a, name_b = pods.workload_name(long_a, "c"), pods.workload_name(long_b, "c")
    assert len(name_a) <= 253 and len(name_b) <= 253 and name_a != name_b
    assert name_a.endswith("-rmd-workload-c")
    request = pods.pod_request(pod(name=long_a))
    assert pods.POD_LABEL not in pods.labels(request, "c")  # too long for a label value


def test_core_ids_respect_the_crd_item_length() -> None:
    cpus = range(0, 400, 2)  # 200 single cpus: no ranges
    entries = pods.core_ids(cpus)
    assert len(entries) > 1 and all(len(e) <= 128 for e in entries)
    assert set().union(*(parse_cpu_list(e) for e in entries)) == set(cpus)
    assert pods.core_ids([1, 2, 3]) == ["1-3"]


def test_workload_patch_compares_before_writing() -> None:
    request = pods.pod_request(pod(annotations={"c_mba_percentage": "50"}))
    before = pods.workload_body(request, request.containers[0], [1, 2])
    assert pods.workload_patch(before, copy.deepcopy(before)) is None
    current = copy.deepcopy(before)
    current["metadata"]["labels"]["team"] = "a"  # another tool's label stays
    plain = pods.pod_request(pod())
    desired = pods.workload_body(plain, plain.containers[0], [1, 3])
    patch = pods.workload_patch(current, desired)
    assert patch == {"spec": {"coreIds": ["1,3"], "rdt": {"mba": None}}}
    assert merge_diff(current["spec"], desired["spec"]) == patch["spec"]


def test_node_state_only_for_the_current_generation() -> None:
    workload: Obj = {
        "metadata": {"name": "w", "generation": 2},
        "status": {
            "observedGeneration": 1,
            "workloadStates": {"worker-1": {"status": "Failed", "response": "Fail: no"}},
        },
    }
    assert pods.node_state(workload, "worker-1") is None
    workload["status"]["observedGeneration"] = 2
    assert pods.node_state(workload, "worker-1") == pods.NodeState("Failed", "Fail: no")
    assert pods.node_state(workload, "worker-2") is None


@pytest.mark.parametrize(
    ("status", "reason", "never_fits"),
    [
        ("Failed", "Unsatisfiable", True),  # the agent: INVALID_ARGUMENT (e.g. more ways than a pool holds)
        ("Failed", "Unsupported", True),  # the node has no RDT L3 CAT (or MBA) at all
        ("Failed", "Rejected", False),  # capacity, conflicts: may pass later
        ("Failed", "", False),  # an entry of an operator that wrote no reason: as before
        ("Pending", "AgentUnreachable", False),
    ],
)
def test_node_state_tells_failures_that_never_pass_on_the_node(
    status: str, reason: str, never_fits: bool
) -> None:
    entry = {"status": status, "response": "Fail: x", **({"reason": reason} if reason else {})}
    workload: Obj = {
        "metadata": {"name": "w", "generation": 1},
        "status": {"observedGeneration": 1, "workloadStates": {"worker-1": entry}},
    }
    state = pods.node_state(workload, "worker-1")
    assert state is not None and state.reason == reason and state.never_fits is never_fits


@pytest.mark.parametrize("delete", [True, False])
def test_failure_decision(delete: bool) -> None:
    decision = pods.on_failure(delete, "c", "web-rmd-workload-c", "worker-1", "not enough cache left")
    assert decision.delete_pod is delete
    assert decision.event.type == "Warning" and decision.event.reason == pods.WORKLOAD_FAILED
    assert "not enough cache left" in decision.event.message
    assert ("deleting the pod" in decision.event.message) is delete


@pytest.mark.parametrize("delete", [True, False])
def test_a_failure_that_never_passes_on_the_node_never_deletes_the_pod(delete: bool) -> None:
    why = "cache max=6 exceeds this node's guaranteed pool of 5 ways per L3 cache (...): ask for at most 5"
    decision = pods.on_failure(delete, "c", "web-rmd-workload-c", "worker-1", why, never_fits=True)
    assert decision.delete_pod is False
    event = decision.event
    assert (event.type, event.reason) == ("Warning", pods.WORKLOAD_FAILED)
    assert why in event.message and "deleting" not in event.message
    assert "cannot change on node worker-1, so the pod is not deleted" in event.message
    assert "its controller would only create it again" in event.message
    assert event.once  # posted once, even across operator restarts


@pytest.mark.parametrize(
    ("reason", "says"),
    [
        ("TopologyAffinityError", "at most one L3 cache's guaranteed pool"),
        ("UnexpectedAdmissionError", "device plugin"),
        ("SMTAlignmentError", "threads per core"),
        ("OutOfintel.com/l3_cache_ways", "not enough intel.com/l3_cache_ways left"),
    ],
)
def test_a_pod_refused_by_its_kubelet_gets_one_warning_quoting_it(reason: str, says: str) -> None:
    event = pods.admission_rejection(rejected_pod(reason))
    assert event is not None
    assert (event.type, event.reason) == ("Warning", pods.POD_REJECTED)
    assert event.message.startswith(
        f"the kubelet of node worker-1 rejected the pod at admission ({reason}: Pod was rejected: "
        "Resources cannot be allocated with Topology locality), so no container gets cache ways and no "
        "RmdWorkload is created. "
    )
    assert says in event.message
    assert event.once == f"rejected/{reason}"


def test_other_pods_are_not_admission_rejections() -> None:
    assert pods.admission_rejection(pod(phase="Running")) is None
    assert pods.admission_rejection(pod(phase="Failed")) is None  # its containers failed: no reason
    assert pods.admission_rejection(pod(phase="Failed", status={"reason": "Evicted"})) is None
    assert pods.admission_rejection(pod(phase="Pending", status={"reason": "TopologyAffinityError"})) is None


def test_a_pod_awaits_its_kubelet_until_it_has_a_start_time() -> None:
    assert pods.awaiting_kubelet(pod(phase="Pending"))
    assert not pods.awaiting_kubelet(pod(phase="Pending", status={"startTime": "2026-01-01T00:00:00Z"}))
    assert not pods.awaiting_kubelet(pod(phase="Running"))
    assert not pods.awaiting_kubelet(rejected_pod())


@pytest.mark.parametrize(
    ("code", "message", "kind", "says"),
    [
        (
            "UNAVAILABLE",
            "kubelet PodResources Get on /host/var/lib/kubelet/pod-resources/kubelet.sock: unreachable (x)",
            "kubelet",
            "cannot ask the kubelet's PodResources API",
        ),
        (
            "UNAVAILABLE",
            "failed to connect to all addresses",
            "agent-unreachable",
            "runs and is ready (RmdNodeState rmd-node-state-worker-1)",
        ),
        ("DEADLINE_EXCEEDED", "Deadline Exceeded", "agent-unreachable", "can reach 10.0.0.5:50051"),
        ("UNAVAILABLE", "the engine is still starting", "agent-unreachable", "the engine is still starting"),
        ("PERMISSION_DENIED", "client not allowed", "agent-refused", "client certificate"),
        ("UNAUTHENTICATED", "", "agent-refused", "refused the operator's call (UNAUTHENTICATED)"),
        ("INTERNAL", "internal error (KeyError)", "agent-error-INTERNAL", "agent's log"),
    ],
)
def test_a_failed_cpu_lookup_says_why_and_what_to_check(
    code: str, message: str, kind: str, says: str
) -> None:
    problem = pods.call_failed_problem("c", "worker-1", "10.0.0.5:50051", code, message)
    assert problem.key == f"c/{kind}"
    event = problem.event
    assert (event.type, event.reason) == ("Warning", pods.CPUS_UNKNOWN)
    assert event.message.startswith("container c: cannot get its exclusive CPUs from the rmd agent of node")
    assert says in event.message and message in event.message and event.message.endswith("; retrying")


def test_slow_cpu_lookups_say_what_to_check() -> None:
    waiting = pods.not_allocated_problem("c", "worker-1", "the kubelet has no pod ns/web", 31.2)
    assert waiting.key == "c/not-allocated" and waiting.event.reason == pods.CPUS_UNKNOWN
    assert "reports no CPUs for it after 31s (the kubelet has no pod ns/web)" in waiting.event.message
    assert "which PodResources API the agent uses" in waiting.event.message
    nobody = pods.no_agent_problem("c", "worker-1", 45)
    assert nobody.key == "c/no-agent" and nobody.event.type == "Warning"
    assert "no rmd agent has published an endpoint for node worker-1 for 45s" in nobody.event.message
    found = pods.cpus_found_event("c", "worker-1", [4, 5, 6])
    assert (found.type, found.reason) == ("Normal", pods.CPUS_FOUND) and "CPUs 4-6" in found.message


# -- the orchestration ---------------------------------------------------------------------------------------

ALLOCATED = agent_pb2.GetContainerCpusResponse.ALLOCATED
NOT_YET = agent_pb2.GetContainerCpusResponse.NOT_YET_ALLOCATED
NOT_EXCLUSIVE = agent_pb2.GetContainerCpusResponse.NOT_EXCLUSIVE


class FakeAgents:
    """Per (namespace, pod, container): the answers to give in turn (the last one repeats)."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str, str], list[agent_pb2.GetContainerCpusResponse]] = {}
        self.held: list[agent_pb2.Workload] = []
        self.cpu_calls = 0
        self.down = False
        self.failure: CallFailure | None = None  # raised instead of answering, when set

    def allocate(self, namespace: str, name: str, cont: str, *cpus: int, after: int = 0) -> None:
        pending = [agent_pb2.GetContainerCpusResponse(state=NOT_YET)] * after
        self.answers[(namespace, name, cont)] = [
            *pending,
            agent_pb2.GetContainerCpusResponse(state=ALLOCATED, cpus=cpus),
        ]

    async def container_cpus(
        self, node: str, endpoint: str, *, namespace: str, pod: str, uid: str, container: str
    ) -> agent_pb2.GetContainerCpusResponse:
        self.cpu_calls += 1
        if self.down:
            raise CallFailure("UNAVAILABLE", "down")
        if self.failure is not None:
            raise self.failure
        queue = self.answers.get(
            (namespace, pod, container), [agent_pb2.GetContainerCpusResponse(state=NOT_YET)]
        )
        return queue.pop(0) if len(queue) > 1 else queue[0]

    async def list_workloads(self, node: str, endpoint: str) -> Sequence[agent_pb2.Workload]:
        return list(self.held)


class FakeObjects:
    """RmdWorkloads and pods in memory, with uids and generations like the API server's."""

    def __init__(self) -> None:
        self.workloads: dict[tuple[str, str], Obj] = {}
        self.writes: list[tuple[str, str]] = []
        self.deleted_pods: list[tuple[str, str, str]] = []
        self.not_started: set[tuple[str, str, str]] = set()  # containers whose status shows no start yet
        self.pods: dict[tuple[str, str], str] = {}  # what pod_uid answers
        self._uids = itertools.count(1)

    async def get_workload(self, namespace: str, name: str) -> Obj | None:
        found = self.workloads.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def create_workload(self, body: Mapping[str, Any]) -> Obj | None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if key in self.workloads:
            return None
        obj = copy.deepcopy(dict(body))
        obj["metadata"].update(uid=f"w{next(self._uids)}", generation=1)
        self.workloads[key] = obj
        self.writes.append(("create", key[1]))
        return copy.deepcopy(obj)

    async def patch_workload(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Obj | None:
        obj = self.workloads.get((namespace, name))
        if obj is None:
            return None
        _merge(obj, patch)
        if "spec" in patch:
            obj["metadata"]["generation"] += 1
        self.writes.append(("patch", name))
        return copy.deepcopy(obj)

    async def delete_workload(self, namespace: str, name: str, uid: str) -> None:
        obj = self.workloads.get((namespace, name))
        if obj is not None and obj["metadata"]["uid"] == uid:
            del self.workloads[(namespace, name)]
            self.writes.append(("delete", name))

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        self.deleted_pods.append((namespace, name, uid))
        return True

    async def pod_uid(self, namespace: str, name: str) -> str | None:
        return self.pods.get((namespace, name))

    async def container_started(self, namespace: str, name: str, uid: str, container: str) -> bool:
        return (namespace, name, container) not in self.not_started

    def set_status(
        self, namespace: str, name: str, node: str, status: str, response: str, *, reason: str = ""
    ) -> Obj:
        obj = self.workloads[(namespace, name)]
        entry = {"status": status, "response": response, "cosName": "COS3", "coreIds": ["1-2"]}
        if reason:
            entry["reason"] = reason
        obj["status"] = {
            "observedGeneration": obj["metadata"]["generation"],
            "workloadStates": {node: entry},
        }
        return copy.deepcopy(obj)


def _merge(target: Obj, patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class Harness:
    def __init__(self, **settings: Any) -> None:
        self.agents = FakeAgents()
        self.objects = FakeObjects()
        self.events: list[tuple[str, EventText]] = []
        self.flow = PodFlow(
            OperatorSettings(retry_initial_seconds=0.01, retry_max_seconds=0.05, **settings),
            agents=self.agents,
            objects=self.objects,
            events=lambda body, e: self.events.append((body["metadata"]["name"], e)),
        )
        self.flow.agent_changed("worker-1", NodeAgent("worker-1", endpoint="127.0.0.1:1"))

    def reasons(self) -> list[str]:
        return [e.reason for _, e in self.events]

    async def until(self, condition: Callable[[], bool], within: float = 3.0) -> None:
        async with asyncio.timeout(within):
            while not condition():  # noqa: ASYNC110  # polls the flow's effects, which signal nothing
                await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
def _fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_cpus, "ALLOCATION_POLL", (0.01, 0.02))
    monkeypatch.setattr(pod_cpus, "RELEASE_POLL", (0.01, 0.02))


async def test_cpus_are_retried_until_allocated_then_the_workload_is_created() -> None:
    h = Harness()
    h.agents.allocate("ns", "web", "c", 4, 5, after=3)
    h.flow.pod_changed(None, pod())
    await h.until(lambda: ("ns", "web-rmd-workload-c") in h.objects.workloads)
    assert h.agents.cpu_calls == 4
    assert h.objects.workloads[("ns", "web-rmd-workload-c")]["spec"]["coreIds"] == ["4-5"]
    # Success on the node: one Normal Event on the pod.
    h.flow.workload_changed(
        "MODIFIED", h.objects.set_status("ns", "web-rmd-workload-c", "worker-1", "Successful", "Success: OK")
    )
    h.flow.workload_changed(
        "MODIFIED", h.objects.set_status("ns", "web-rmd-workload-c", "worker-1", "Successful", "Success: OK")
    )
    assert h.reasons() == [pods.APPLIED]
    await h.flow.close()


async def test_cpus_retried_while_the_agent_is_unreachable() -> None:
    h = Harness()
    h.agents.down = True
    h.agents.allocate("ns", "web", "c", 7)
    h.flow.pod_changed(None, pod())
    await h.until(lambda: h.agents.cpu_calls >= 3)
    assert not h.objects.workloads
    h.agents.down = False
    await h.until(lambda: ("ns", "web-rmd-workload-c") in h.objects.workloads)
    await h.flow.close()


async def test_an_unreachable_agent_gives_one_warning_not_one_per_retry() -> None:
    h = Harness()
    h.agents.down = True
    h.agents.allocate("ns", "web", "c", 7)
    h.flow.pod_changed(None, pod())
    await h.until(lambda: h.agents.cpu_calls >= 4)
    assert h.reasons() == [pods.CPUS_UNKNOWN]
    (_, warning) = h.events[0]
    assert warning.type == "Warning" and "127.0.0.1:1: UNAVAILABLE: down" in warning.message
    # Back: a Normal Event saying so, then the workload as usual.
    h.agents.down = False
    await h.until(lambda: ("ns", "web-rmd-workload-c") in h.objects.workloads)
    assert h.reasons() == [pods.CPUS_UNKNOWN, pods.CPUS_FOUND]
    assert "CPUs 7" in h.events[1][1].message
    await h.flow.close()


async def test_each_distinct_reason_is_posted_once() -> None:
    h = Harness()
    h.agents.down = True
    h.flow.pod_changed(None, pod())
    await h.until(lambda: h.agents.cpu_calls >= 3)
    # The agent answers now, but cannot reach its kubelet: another reason, another Warning (once).
    h.agents.down = False
    h.agents.failure = CallFailure("UNAVAILABLE", "kubelet PodResources Get on /x.sock: no answer within 2s")
    calls = h.agents.cpu_calls
    await h.until(lambda: h.agents.cpu_calls >= calls + 3)
    # ... and the first reason again: already said.
    h.agents.failure = None
    h.agents.down = True
    calls = h.agents.cpu_calls
    await h.until(lambda: h.agents.cpu_calls >= calls + 2)
    assert h.reasons() == [pods.CPUS_UNKNOWN, pods.CPUS_UNKNOWN]
    assert "UNAVAILABLE: down" in h.events[0][1].message
    assert "cannot ask the kubelet's PodResources API" in h.events[1][1].message
    assert h.flow._pods["uid-1"].tasks  # still retrying
    await h.flow.close()


async def test_cpus_the_kubelet_does_not_report_for_long_give_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pod_cpus, "_QUIET_SECONDS", 0.1)
    h = Harness()
    h.agents.answers[("ns", "web", "c")] = [
        agent_pb2.GetContainerCpusResponse(state=NOT_YET, detail="the kubelet has no pod ns/web")
    ]
    h.flow.pod_changed(None, pod())
    await h.until(lambda: h.agents.cpu_calls >= 2)
    assert h.events == []  # normal for a moment after scheduling
    await h.until(lambda: bool(h.events))
    calls = h.agents.cpu_calls
    await h.until(lambda: h.agents.cpu_calls >= calls + 3)
    assert h.reasons() == [pods.CPUS_UNKNOWN]
    assert "(the kubelet has no pod ns/web)" in h.events[0][1].message
    h.agents.allocate("ns", "web", "c", 3)
    await h.until(lambda: ("ns", "web-rmd-workload-c") in h.objects.workloads)
    assert h.reasons() == [pods.CPUS_UNKNOWN, pods.CPUS_FOUND]
    await h.flow.close()


async def test_a_node_without_an_agent_gives_a_warning_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_cpus, "_QUIET_SECONDS", 0.1)
    h = Harness()
    h.flow.agent_changed("worker-1", None)
    h.agents.allocate("ns", "web", "c", 2)
    h.flow.pod_changed(None, pod())
    await h.until(lambda: bool(h.events))
    await asyncio.sleep(0.1)
    assert h.reasons() == [pods.CPUS_UNKNOWN] and h.agents.cpu_calls == 0
    assert "no rmd agent has published an endpoint for node worker-1" in h.events[0][1].message
    h.flow.agent_changed("worker-1", NodeAgent("worker-1", endpoint="127.0.0.1:1"))
    await h.until(lambda: ("ns", "web-rmd-workload-c") in h.objects.workloads)
    assert h.reasons() == [pods.CPUS_UNKNOWN, pods.CPUS_FOUND]
    await h.flow.close()


async def test_existing_equal_workload_is_not_written_and_a_changed_one_is_patched() -> None:
    h = Harness()
    h.agents.allocate("ns", "web", "c", 1, 2)
    request = pods.pod_request(pod())
    await h.objects.create_workload(pods.workload_body(request, request.containers[0], [1, 2]))
    h.objects.writes.clear()
    h.flow.pod_changed(None, pod())
    await h.until(lambda: not h.flow._pods[request.uid].tasks)
    assert h.objects.writes == []
    # An annotation added: the same pod, a new request.
    h.flow.pod_changed("MODIFIED", pod(annotations={"c_pstate_monitoring": "on"}))
    await h.until(lambda: h.objects.writes == [("patch", "web-rmd-workload-c")])
    assert h.objects.workloads[("ns", "web-rmd-workload-c")]["spec"]["plugins"] == {
        "pstate": {"monitoring": "on"}
    }
    await h.flow.close()


@pytest.mark.parametrize("delete", [True, False])
async def test_failure_on_the_node_deletes_the_pod_unless_told_not_to(delete: bool) -> None:
    h = Harness(delete_failed_pods=delete)
    h.agents.allocate("ns", "web", "c", 1)
    h.flow.pod_changed(None, pod())
    await h.until(lambda: ("ns", "web-rmd-workload-c") in h.objects.workloads)
    failed = h.objects.set_status(
        "ns", "web-rmd-workload-c", "worker-1", "Failed", "Fail: not enough cache left", reason="Rejected"
    )
    h.flow.workload_changed("MODIFIED", failed)
    h.flow.workload_changed("MODIFIED", failed)  # the same state again: nothing new
    await asyncio.sleep(0.05)
    assert h.reasons() == [pods.WORKLOAD_FAILED]
    assert "not enough cache left" in h.events[0][1].message
    assert h.objects.deleted_pods == ([("ns", "web", "uid-1")] if delete else [])
    await h.flow.close()


async def test_a_request_the_node_can_never_take_is_refused_once_and_the_pod_kept() -> None:
    """More ways than one L3 cache's pool holds (the scheduler counted all the node's caches): deleting the
    pod would only make its ReplicaSet create it again, be scheduled here again, fail again, ... forever."""
    h = Harness()  # delete_failed_pods: true (the default)
    h.agents.allocate("ns", "web", "c", 1)
    h.flow.pod_changed(None, pod(container("c", ways="6")))
    await h.until(lambda: ("ns", "web-rmd-workload-c") in h.objects.workloads)
    why = "cache max=6 exceeds this node's guaranteed pool of 5 ways per L3 cache (...): ask for at most 5"
    failed = h.objects.set_status(
        "ns", "web-rmd-workload-c", "worker-1", "Failed", f"Fail: {why}", reason="Unsatisfiable"
    )
    for _ in range(3):  # the same status again (a resync): nothing new
        h.flow.workload_changed("MODIFIED", failed)
    await asyncio.sleep(0.05)
    assert h.objects.deleted_pods == []
    assert h.reasons() == [pods.WORKLOAD_FAILED]
    event = h.events[0][1]
    assert why in event.message and "the pod is not deleted" in event.message and event.once
    await h.flow.close()


async def test_no_exclusive_cpus_before_the_container_started_is_waited_out() -> None:
    """A real kubelet lists an admitted container in PodResources just before its CPU manager allocates: the
    pod was failed and deleted in that window (real node). Until the container starts, it is not final."""
    h = Harness()
    h.objects.not_started.add(("ns", "web", "c"))
    h.agents.answers[("ns", "web", "c")] = [
        agent_pb2.GetContainerCpusResponse(state=NOT_EXCLUSIVE, detail="not allocated yet"),
        agent_pb2.GetContainerCpusResponse(state=agent_pb2.GetContainerCpusResponse.ALLOCATED, cpus=[3]),
    ]
    h.flow.pod_changed(None, pod())
    await h.until(lambda: bool(h.objects.workloads))
    assert not h.objects.deleted_pods and pods.WORKLOAD_FAILED not in h.reasons()
    await h.flow.close()


async def test_no_exclusive_cpus_is_a_failure_that_keeps_the_pod() -> None:
    """The kubelet's CPU manager policy is not static: no new pod on this node would fare better."""
    h = Harness()
    h.agents.answers[("ns", "web", "c")] = [
        agent_pb2.GetContainerCpusResponse(state=NOT_EXCLUSIVE, detail="shared pool")
    ]
    h.flow.pod_changed(None, pod())
    await h.until(lambda: bool(h.events))
    await asyncio.sleep(0.05)
    assert h.reasons() == [pods.WORKLOAD_FAILED] and not h.objects.workloads
    assert "CPU manager policy is not static" in h.events[0][1].message
    assert h.objects.deleted_pods == []
    await h.flow.close()


async def test_a_pod_refused_by_its_kubelet_gets_one_warning_and_nothing_else() -> None:
    """Bound, then refused at admission (single-numa-node could not align its CPUs and ways): no call to
    the agent for its CPUs, no RmdWorkload, one Warning quoting the kubelet."""
    h = Harness()
    h.agents.allocate("ns", "web", "c", 1)
    h.flow.pod_changed(None, pod(phase="Pending"))  # scheduled; its kubelet has not taken it yet
    await asyncio.sleep(0.1)
    assert h.agents.cpu_calls == 0 and h.events == []
    for _ in range(3):  # the refusal, then further updates of the refused pod
        h.flow.pod_changed("MODIFIED", rejected_pod())
    await asyncio.sleep(0.05)
    assert h.reasons() == [pods.POD_REJECTED]
    assert "(TopologyAffinityError: Pod was rejected: Resources cannot" in h.events[0][1].message
    assert h.agents.cpu_calls == 0 and not h.objects.workloads and h.objects.deleted_pods == []
    assert h.objects.writes == []
    await h.flow.close()


async def test_a_refused_pod_seen_first_at_start_gets_its_warning_too() -> None:
    h = Harness()
    h.flow.pod_changed(None, rejected_pod("UnexpectedAdmissionError"))
    await asyncio.sleep(0.05)
    assert h.reasons() == [pods.POD_REJECTED] and h.agents.cpu_calls == 0 and h.objects.writes == []
    await h.flow.close()


async def test_cpus_are_asked_for_once_the_kubelet_took_the_pod() -> None:
    h = Harness()
    h.agents.allocate("ns", "web", "c", 4)
    h.flow.pod_changed(None, pod(phase="Pending"))
    await asyncio.sleep(0.1)
    assert h.agents.cpu_calls == 0
    h.flow.pod_changed("MODIFIED", pod(phase="Running", status={"startTime": "2026-01-01T00:00:00Z"}))
    await h.until(lambda: ("ns", "web-rmd-workload-c") in h.objects.workloads)
    assert h.agents.cpu_calls == 1 and h.events == []
    await h.flow.close()


async def test_refusals_are_posted_once_and_nothing_is_created() -> None:
    h = Harness()
    burstable = pod(container("c", requests={"cpu": "1", "memory": "1Gi", WAYS: "2"}))
    h.flow.pod_changed(None, burstable)
    h.flow.pod_changed("MODIFIED", burstable)
    await asyncio.sleep(0.05)
    assert h.reasons() == [pods.NOT_GUARANTEED] and not h.objects.workloads and h.agents.cpu_calls == 0
    await h.flow.close()


async def test_every_annotation_problem_of_a_pod_is_in_one_event() -> None:
    """Every bad value of every container and every annotation that configures nothing, in one Warning; the
    valid container goes ahead."""
    h = Harness()
    h.agents.allocate("ns", "web", "ok", 6)
    annotations = {
        "c_mba_percentage": "abc",
        "c_pstate_ratio": "fast",
        "c_polcy": "gold",
        "d_pstate_monitoring": "yes",
        "d_cache_min": "1",
        "d_policy": "gold",
        "ok_mba_percentage": "50",
    }
    h.flow.pod_changed(None, pod(container("c"), container("d"), container("ok"), annotations=annotations))
    await h.until(lambda: ("ns", "web-rmd-workload-ok") in h.objects.workloads)
    assert h.objects.workloads[("ns", "web-rmd-workload-ok")]["spec"]["rdt"]["mba"] == {"percentage": 50}
    assert ("ns", "web-rmd-workload-c") not in h.objects.workloads
    assert ("ns", "web-rmd-workload-d") not in h.objects.workloads
    (event,) = (e for _, e in h.events)
    assert (event.type, event.reason) == ("Warning", pods.INVALID_REQUEST)
    for fragment in (
        "container c: annotation c_mba_percentage='abc' must be a whole number from 1 to 100; ",
        "annotation c_pstate_ratio='fast' must be a decimal number greater than 0 and less than 100",
        "container d: annotations d_cache_min and d_policy are mutually exclusive",
        'annotation d_pstate_monitoring=\'yes\' must be "on" or "off"',
        "no RmdWorkload is created. annotations ignored: c_polcy: unknown setting 'polcy'",
    ):
        assert fragment in event.message
    assert event.message.count("no RmdWorkload is created") == 2
    await h.flow.close()


async def test_more_problems_than_an_event_holds_are_counted() -> None:
    names = [f"container-{i:02}" for i in range(30)]
    h = Harness()
    annotations = {f"{n}_pstate_ratio": "fast" for n in names}
    h.flow.pod_changed(None, pod(*(container(n) for n in names), annotations=annotations))
    await asyncio.sleep(0.05)
    (event,) = (e for _, e in h.events)
    assert len(event.message) <= MESSAGE_LIMIT
    shown = event.message.count("_pstate_ratio='fast' must be")
    assert 0 < shown < 30
    assert event.message.endswith(
        f"{30 - shown} more problems not shown (an Event holds {MESSAGE_LIMIT} characters): fix these, "
        "and the next Event lists them"
    )
    await h.flow.close()


async def test_same_pod_name_in_two_namespaces_never_mixes() -> None:
    h = Harness()
    h.agents.allocate("a", "web", "c", 2, 3)
    h.agents.allocate("b", "web", "c", 8, 9)
    h.flow.pod_changed(None, pod(namespace="a", uid="ua"))
    h.flow.pod_changed(None, pod(namespace="b", uid="ub"))
    await h.until(lambda: len(h.objects.workloads) == 2)
    a, b = h.objects.workloads[("a", "web-rmd-workload-c")], h.objects.workloads[("b", "web-rmd-workload-c")]
    assert (a["spec"]["coreIds"], pods.owner_pod_uid(a)) == (["2-3"], "ua")
    assert (b["spec"]["coreIds"], pods.owner_pod_uid(b)) == (["8-9"], "ub")
    # b's failure concerns b's pod only.
    h.flow.workload_changed(
        "MODIFIED",
        h.objects.set_status("b", "web-rmd-workload-c", "worker-1", "Failed", "Fail: x", reason="Rejected"),
    )
    await h.until(lambda: bool(h.objects.deleted_pods))
    assert h.objects.deleted_pods == [("b", "web", "ub")]
    await h.flow.close()


async def test_an_earlier_same_named_pods_workload_is_replaced() -> None:
    h = Harness()
    old = pods.pod_request(pod(uid="old"))
    await h.objects.create_workload(pods.workload_body(old, old.containers[0], [1]))
    h.agents.allocate("ns", "web", "c", 6)
    h.flow.pod_changed(None, pod(uid="new"))
    await h.until(
        lambda: pods.owner_pod_uid(h.objects.workloads.get(("ns", "web-rmd-workload-c"), {})) == "new"
    )
    assert [w for w, _ in h.objects.writes] == ["create", "delete", "create"]
    await h.flow.close()


async def test_someone_elses_workload_of_that_name_is_left_alone() -> None:
    h = Harness()
    h.objects.workloads[("ns", "web-rmd-workload-c")] = {
        "metadata": {"name": "web-rmd-workload-c", "uid": "u"}
    }
    h.agents.allocate("ns", "web", "c", 6)
    h.flow.pod_changed(None, pod())
    await h.until(lambda: bool(h.events))
    assert h.reasons() == [pods.INVALID_REQUEST] and "does not belong to this pod" in h.events[0][1].message
    assert h.objects.writes == [] and h.objects.deleted_pods == []
    await h.flow.close()


async def test_waits_until_the_agent_released_the_cpus() -> None:
    h = Harness()
    h.agents.held = [
        agent_pb2.Workload(
            ref=agent_pb2.WorkloadRef(namespace="ns", name="old-rmd-workload-c", uid="x"), cpus=[3, 4]
        )
    ]
    h.agents.allocate("ns", "web", "c", 4, 5)
    h.flow.pod_changed(None, pod())
    await asyncio.sleep(0.1)
    assert not h.objects.workloads  # cpu 4 is still held
    h.agents.held = []
    await h.until(lambda: bool(h.objects.workloads))
    await h.flow.close()


async def test_finished_pod_loses_its_workloads_and_deleted_workload_of_running_pod_comes_back() -> None:
    h = Harness()
    h.agents.allocate("ns", "web", "c", 1)
    h.flow.pod_changed(None, pod(phase="Running"))
    await h.until(lambda: bool(h.objects.workloads))
    gone = h.objects.workloads.pop(("ns", "web-rmd-workload-c"))
    h.flow.workload_changed("DELETED", gone)
    await h.until(lambda: bool(h.objects.workloads))
    h.flow.pod_changed("MODIFIED", pod(phase="Succeeded"))
    await h.until(lambda: not h.objects.workloads)
    h.flow.workload_changed("DELETED", gone)  # not recreated for a finished pod
    await asyncio.sleep(0.05)
    assert not h.objects.workloads
    await h.flow.close()


async def test_deleted_pod_stops_waiting() -> None:
    h = Harness()
    h.flow.pod_changed(None, pod())  # never allocated
    await h.until(lambda: h.agents.cpu_calls >= 2)
    h.flow.pod_changed("DELETED", pod())
    calls = h.agents.cpu_calls
    await asyncio.sleep(0.05)
    assert h.agents.cpu_calls == calls and h.flow.health() == {"pods": 0}
    await h.flow.close()


async def test_a_pod_whose_deletion_the_watch_missed_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_cpus, "_POD_CHECK_SECONDS", 0.05)
    h = Harness()
    h.objects.pods[("ns", "web")] = "uid-1"
    h.flow.pod_changed(None, pod())  # never allocated
    await asyncio.sleep(0.2)
    assert h.flow.health() == {"pods": 1}  # still there: still asking
    h.objects.pods[("ns", "web")] = "uid-2"  # deleted and re-created while the watch was down
    await h.until(lambda: h.flow.health() == {"pods": 0})
    calls = h.agents.cpu_calls
    await asyncio.sleep(0.05)
    assert h.agents.cpu_calls == calls
    await h.flow.close()
