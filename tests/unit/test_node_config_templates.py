"""The NodeConfigTemplate controller's decisions (rmd_operator.node_config_plan), the templates' status and
Events (node_config_status), and one pass of its loop against a fake API (node_config_sync)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from rmd_operator.node_config_api import WriteError
from rmd_operator.node_config_plan import (
    Node,
    NodeConfig,
    Problem,
    Template,
    internal_ips,
    node_config_of,
    plan,
    template_of,
    template_spec,
)
from rmd_operator.node_config_status import desired_status, problem_events, problem_keys, write_events
from rmd_operator.node_config_sync import Inputs, TemplateSync
from rmd_operator.status import EventText

NS = "wao-system"
SELECT = {"matchLabels": {"node.kubernetes.io/instance-type": "redfish-enabled"}}
REDFISH_LABELS = {"node.kubernetes.io/instance-type": "redfish-enabled"}
TERMS: dict[str, Any] = {
    "metricsCollector": {
        "inletTemp": {
            "type": "Redfish",
            "endpoint": "https://10.0.100.{{.IPv4.Octet4}}",
            "basicAuthSecret": {"name": "bmc-{{.Hostname}}"},
            "fetchInterval": "10s",
        },
        "deltaP": {"type": "DifferentialPressureAPI", "endpoint": "http://10.0.0.1:5000"},
    },
}


def template(
    name: str = "redfish", *, created: str = "2026-01-01T00:00:00Z", selector: Any = None, **spec: Any
) -> Template:
    body = {"nodeSelector": SELECT if selector is None else selector, "template": TERMS, **spec}
    return Template(NS, name, f"uid-{name}", created, 1, body)


def node(name: str, ip: str | None = "10.0.0.7", labels: Mapping[str, str] = REDFISH_LABELS) -> Node:
    return Node(name, {"kubernetes.io/hostname": name, **labels}, (ip,) if ip else ())


def rendered(node_name: str, ip_last: str) -> dict[str, Any]:
    return {
        "nodeName": node_name,
        "metricsCollector": {
            "inletTemp": {
                "type": "Redfish",
                "endpoint": f"https://10.0.100.{ip_last}",
                "basicAuthSecret": {"name": f"bmc-{node_name}"},
                "fetchInterval": "10s",
            },
            "deltaP": {"type": "DifferentialPressureAPI", "endpoint": "http://10.0.0.1:5000"},
        },
    }


def owned(
    t: Template, node_name: str, spec: Mapping[str, Any] | None = None, *, name: str = ""
) -> NodeConfig:
    return NodeConfig(
        NS,
        name or f"{t.name}-{node_name}",
        f"nc-{node_name}",
        node_name,
        t.uid,
        spec or {"nodeName": node_name},
    )


def by_handwriting(name: str, node_name: str) -> NodeConfig:
    return NodeConfig(NS, name, f"hand-{name}", node_name, None, {"nodeName": node_name})


# -- the objects ------------------------------------------------------------------------------------------


def test_views_of_the_api_objects() -> None:
    body = {
        "metadata": {
            "namespace": NS,
            "name": "redfish-w1",
            "uid": "u1",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "cm", "controller": False},
                {
                    "apiVersion": "wao.bitmedia.co.jp/v1beta1",
                    "kind": "NodeConfigTemplate",
                    "name": "redfish",
                    "uid": "t1",
                    "controller": True,
                },
            ],
        },
        "spec": {"nodeName": "w1"},
    }
    config = node_config_of(body)
    assert (config.name, config.node, config.template_uid) == ("redfish-w1", "w1", "t1")
    assert node_config_of({"metadata": {"name": "x"}, "spec": {}}).template_uid is None
    t = template_of(
        {"metadata": {"namespace": NS, "name": "a", "uid": "u", "generation": 3}, "spec": {"x": 1}}
    )
    assert (t.ref, t.generation, t.spec, t.status) == (f"{NS}/a", 3, {"x": 1}, {})
    addresses = [
        {"type": "Hostname", "address": "w1"},
        {"type": "InternalIP", "address": "fd00::1"},
        {"type": "ExternalIP", "address": "1.2.3.4"},
        {"type": "InternalIP", "address": "10.0.0.1"},
    ]
    assert internal_ips({"addresses": addresses}) == ("fd00::1", "10.0.0.1")
    assert internal_ips(None) == ()


def test_both_template_layouts_give_the_same_spec() -> None:
    """wao-core's spec.template (nodeName ignored) and the flat layout of the seed's example."""
    assert template_spec({"template": {"nodeName": "", **TERMS}, "nodeSelector": {}}) == TERMS
    assert template_spec({**TERMS, "nodeSelector": {}, "predictor": {}}) == {**TERMS, "predictor": {}}


# -- the plan ---------------------------------------------------------------------------------------------


def test_one_rendered_node_config_per_selected_node_owned_by_the_template() -> None:
    t = template()
    nodes = [node("w1", "10.0.0.11"), node("w2", "10.0.0.12"), node("other", labels={})]
    (p,) = plan([t], nodes, [])
    assert (p.matching, p.problems, p.updates, p.deletes) == (2, [], [], [])
    assert [c.node for c in p.creates] == ["w1", "w2"]
    body = p.creates[0].body
    assert body["apiVersion"] == "wao.bitmedia.co.jp/v1beta1" and body["kind"] == "NodeConfig"
    assert body["metadata"]["name"] == "redfish-w1" and body["metadata"]["namespace"] == NS
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "wao.bitmedia.co.jp/v1beta1",
            "kind": "NodeConfigTemplate",
            "name": "redfish",
            "uid": "uid-redfish",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert body["spec"] == rendered("w1", "11")


def test_nothing_to_do_when_every_node_config_is_as_the_template_says() -> None:
    t = template()
    (p,) = plan([t], [node("w1", "10.0.0.11")], [owned(t, "w1", rendered("w1", "11"))])
    assert (p.creates, p.updates, p.deletes, p.problems, p.in_sync) == ([], [], [], [], 1)


def test_template_or_node_change_updates_the_spec() -> None:
    t = template()
    stale = owned(t, "w1", rendered("w1", "99"))  # the node's address changed since
    (p,) = plan([t], [node("w1", "10.0.0.11")], [stale])
    assert [(u.name, u.uid, u.spec) for u in p.updates] == [("redfish-w1", "nc-w1", rendered("w1", "11"))]
    assert p.creates == [] and p.deletes == []


def test_a_node_leaving_the_selector_or_deleted_loses_its_node_config() -> None:
    """wao-core left them behind."""
    t = template()
    configs = [owned(t, "w1", rendered("w1", "11")), owned(t, "w2"), owned(t, "gone")]
    nodes = [node("w1", "10.0.0.11"), node("w2", labels={"node.kubernetes.io/instance-type": "plain"})]
    (p,) = plan([t], nodes, configs)
    assert [(d.name, d.uid, d.why) for d in p.deletes] == [
        ("redfish-gone", "nc-gone", "node gone is gone"),
        ("redfish-w2", "nc-w2", "node w2 no longer matches the nodeSelector"),
    ]
    assert p.in_sync == 1


def test_node_configs_of_others_are_left_alone() -> None:
    t, other = template(), template("other", selector={"matchLabels": {"x": "y"}})
    configs = [owned(other, "w9"), by_handwriting("mine", "w8")]
    plan_t, plan_other = plan([t, other], [node("w1")], configs)
    assert plan_t.deletes == []  # neither the other template's nor the hand-written one
    assert [d.name for d in plan_other.deletes] == ["other-w9"]  # its node is gone


def test_template_error_is_reported_and_the_existing_node_config_kept() -> None:
    t = template()
    existing = owned(t, "w1", rendered("w1", "11"))
    (p,) = plan([t], [node("w1", ip=None), node("w2", ip="fd00::2")], [existing])
    assert p.creates == [] and p.updates == [] and p.deletes == []
    assert [(x.node, x.reason) for x in p.problems] == [("w1", "TemplateError"), ("w2", "TemplateError")]
    assert "metricsCollector.inletTemp.endpoint: the node has no IPv4 InternalIP" in p.problems[0].message


def test_malformed_selector_changes_nothing() -> None:
    t = template(selector={"matchExpressions": [{"key": "a", "operator": "In"}]})
    (p,) = plan([t], [node("w1")], [owned(t, "w1")])
    assert p.selector_error is not None and "values must be non-empty" in p.selector_error
    assert (p.creates, p.updates, p.deletes, p.matching) == ([], [], [], 0)


def test_two_templates_on_one_node_the_oldest_keeps_it() -> None:
    old, new = template("a", created="2026-01-01T00:00:00Z"), template("b", created="2026-02-01T00:00:00Z")
    plan_a, plan_b = plan([new, old][::-1], [node("w1")], [])
    assert [c.node for c in plan_a.creates] == ["w1"] and plan_a.problems == []
    assert plan_b.creates == []
    (problem,) = plan_b.problems
    assert (problem.node, problem.reason) == ("w1", "Conflict")
    assert f"also selected by NodeConfigTemplate {NS}/a" in problem.message


def test_the_template_that_has_the_node_keeps_it_even_if_younger() -> None:
    """Adding an older-looking template (or relabelling) never takes a working node away."""
    old, young = template("a", created="2026-01-01T00:00:00Z"), template("b", created="2026-02-01T00:00:00Z")
    plan_a, plan_b = plan([old, young], [node("w1", "10.0.0.11")], [owned(young, "w1", rendered("w1", "11"))])
    assert plan_b.in_sync == 1 and plan_b.problems == [] and plan_b.deletes == []
    assert plan_a.creates == [] and [p.reason for p in plan_a.problems] == ["Conflict"]


def test_a_loser_deletes_its_own_node_config_there() -> None:
    """Both had one (e.g. created concurrently before this operator ran): the older keeps its one."""
    old, young = template("a", created="2026-01-01T00:00:00Z"), template("b", created="2026-02-01T00:00:00Z")
    configs = [owned(old, "w1", rendered("w1", "11")), owned(young, "w1", rendered("w1", "11"))]
    plan_a, plan_b = plan([old, young], [node("w1", "10.0.0.11")], configs)
    assert plan_a.in_sync == 1 and plan_a.deletes == []
    assert [(d.name, d.why) for d in plan_b.deletes] == [
        ("b-w1", "node w1 keeps another NodeConfig (Conflict)")
    ]
    assert [p.reason for p in plan_b.problems] == ["Conflict"]


def test_a_hand_written_node_config_wins_over_every_template() -> None:
    t = template()
    configs = [by_handwriting("w1-by-hand", "w1"), owned(t, "w1")]
    (p,) = plan([t], [node("w1")], configs)
    assert p.creates == [] and [d.name for d in p.deletes] == ["redfish-w1"]
    (problem,) = p.problems
    assert problem.reason == "Conflict" and f"already has NodeConfig {NS}/w1-by-hand" in problem.message


def test_same_resulting_name_for_two_nodes_is_a_conflict() -> None:
    """Template "a" on node "b-c" and template "a-b" on node "c" both give "a-b-c"."""
    a = template("a", selector={}, created="2026-01-01T00:00:00Z")
    ab = template("a-b", selector={}, created="2026-02-01T00:00:00Z")
    nodes = [node("b-c", labels={"pool": "1"}), node("c", labels={"pool": "2"})]
    a_sel = template("a", selector={"matchLabels": {"pool": "1"}}, created=a.created)
    ab_sel = template("a-b", selector={"matchLabels": {"pool": "2"}}, created=ab.created)
    plan_a, plan_ab = plan([a_sel, ab_sel], nodes, [])
    assert [c.body["metadata"]["name"] for c in plan_a.creates] == ["a-b-c"]
    assert plan_ab.creates == []
    (problem,) = plan_ab.problems
    assert problem == Problem(
        "c", "Conflict", f"NodeConfig name a-b-c is also what NodeConfigTemplate {NS}/a gives node b-c"
    )


def test_a_name_taken_by_hand_is_a_conflict() -> None:
    t = template()
    (p,) = plan([t], [node("w1"), node("w2")], [by_handwriting("redfish-w1", "w2")])
    # w2 has that hand-written NodeConfig (Conflict for w2); w1's name is taken (Conflict for w1).
    assert p.creates == []
    assert sorted((x.node, x.reason) for x in p.problems) == [("w1", "Conflict"), ("w2", "Conflict")]
    assert any("exists and is written by hand (for node w2)" in x.message for x in p.problems)


def test_overlong_name_is_invalid() -> None:
    t = template("t" * 200)
    (p,) = plan([t], [node("n" * 60)], [])
    assert p.creates == [] and [x.reason for x in p.problems] == ["Invalid"]


# -- status and Events ------------------------------------------------------------------------------------


def test_status_when_all_is_well_and_when_not() -> None:
    t = template()
    (good,) = plan([t], [node("w1", "10.0.0.11")], [owned(t, "w1", rendered("w1", "11"))])
    status = desired_status(good, [], 0, "2026-03-01T00:00:00Z")
    (ready,) = status["conditions"]
    assert (status["matchingNodes"], status["nodeConfigs"], status["problems"]) == (1, 1, [])
    assert (ready["status"], ready["reason"], ready["lastTransitionTime"]) == (
        "True",
        "Synced",
        "2026-03-01T00:00:00Z",
    )

    (bad,) = plan([t], [node("w1", "10.0.0.11"), node("w2", None)], [])
    failure = Problem("w1", "WriteFailed", "NodeConfig redfish-w1: 403 forbidden")
    status = desired_status(bad, [failure], 0, "2026-03-02T00:00:00Z")
    (ready,) = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "TemplateError")  # the more urgent of the two
    assert ready["message"].startswith("2 of 2 matching node(s) without their NodeConfig: w1 (WriteFailed)")
    assert [p["node"] for p in status["problems"]] == ["w1", "w2"]


def test_ready_keeps_its_transition_time_while_it_stays() -> None:
    t = template()
    before = {
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }
    t = Template(t.namespace, t.name, t.uid, t.created, 1, t.spec, before)
    (p,) = plan([t], [], [])
    (ready,) = desired_status(p, [], 0, "2026-05-05T00:00:00Z")["conditions"]
    assert (
        ready["lastTransitionTime"] == "2026-01-01T00:00:00Z"
        and ready["message"] == "no node matches the nodeSelector"
    )


def test_events_only_for_new_problems_and_done_writes() -> None:
    t = template()
    (p,) = plan([t], [node("w1", None), node("w2", None)], [])
    first = problem_events(frozenset(), problem_keys(p))
    assert [(e.type, e.reason) for e in first] == [("Warning", "TemplateError")]
    assert first[0].message.startswith("w1: metricsCollector.inletTemp.endpoint")
    assert problem_events(problem_keys(p), problem_keys(p)) == []  # no repeats
    assert write_events([("redfish-w1", "w1")], [], []) == [
        EventText("Normal", "NodeConfigCreated", "NodeConfig redfish-w1 for node w1")
    ]


# -- one pass against a fake API ------------------------------------------------------------------------


class FakeApi:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.fail: dict[str, WriteError] = {}  # name -> the error every write of it gets
        self.statuses: dict[str, Mapping[str, Any]] = {}

    def _check(self, name: str) -> None:
        if name in self.fail:
            raise self.fail[name]

    async def create_node_config(self, namespace: str, body: Mapping[str, Any]) -> None:
        self.calls.append(("create", body["metadata"]["name"]))
        self._check(body["metadata"]["name"])

    async def replace_spec(self, namespace: str, name: str, uid: str, spec: Mapping[str, Any]) -> None:
        self.calls.append(("replace", name, uid))
        self._check(name)

    async def delete_node_config(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(("delete", name, uid))
        self._check(name)

    async def patch_template_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.calls.append(("status", name))
        self.statuses[name] = status


def run_pass(api: FakeApi, inputs: Inputs) -> tuple[bool, list[EventText]]:
    events: list[EventText] = []

    async def go() -> bool:
        sync = TemplateSync(
            api,
            lambda _obj, e: events.append(e),
            retry_initial=1,
            retry_max=2,
            now=lambda: "2026-03-01T00:00:00Z",
        )
        return await sync.sync_once(inputs)

    return asyncio.run(go()), events


def test_a_pass_writes_what_differs_then_the_status_and_events() -> None:
    api = FakeApi()
    t = template()
    inputs = Inputs([t], [node("w1", "10.0.0.11"), node("w2", None)], [owned(t, "gone")])
    retry, events = run_pass(api, inputs)
    assert not retry
    assert api.calls == [
        ("create", "redfish-w1"),
        ("delete", "redfish-gone", "nc-gone"),
        ("status", "redfish"),
    ]
    status = api.statuses["redfish"]
    assert (status["matchingNodes"], status["nodeConfigs"]) == (2, 1)
    assert [e.reason for e in events] == ["NodeConfigCreated", "NodeConfigDeleted", "TemplateError"]


@pytest.mark.parametrize(
    ("error", "reason", "retry"),
    [
        (
            WriteError(422, 'NodeConfig "redfish-w1" is invalid: spec.x', invalid_fields=True),
            "Invalid",
            False,
        ),
        (WriteError(403, "forbidden"), "WriteFailed", True),
        (WriteError(0, "connection refused"), "WriteFailed", True),
        (WriteError(409, "already exists"), None, True),  # our own earlier create, not seen yet: no problem
        (
            WriteError(422, "the server rejected our request"),
            None,
            True,
        ),  # JSON-patch test: changed meanwhile
    ],
)
def test_refused_writes_become_problems_or_retries(
    error: WriteError, reason: str | None, retry: bool
) -> None:
    api = FakeApi()
    api.fail["redfish-w1"] = error
    again, events = run_pass(api, Inputs([template()], [node("w1", "10.0.0.11")], []))
    assert again is retry
    problems = api.statuses["redfish"]["problems"]
    assert [p["reason"] for p in problems] == ([reason] if reason else [])
    assert [e.reason for e in events] == ([reason] if reason else [])
    assert api.statuses["redfish"]["nodeConfigs"] == 0


def test_an_unchanged_status_is_not_written_again() -> None:
    api = FakeApi()
    t = template()
    inputs = Inputs([t], [node("w1", "10.0.0.11")], [owned(t, "w1", rendered("w1", "11"))])
    run_pass(api, inputs)
    written = api.statuses["redfish"]
    api.calls.clear()
    t2 = Template(t.namespace, t.name, t.uid, t.created, t.generation, t.spec, written)
    retry, events = run_pass(api, Inputs([t2], inputs.nodes, inputs.configs))
    assert (retry, api.calls, events) == (False, [], [])


def test_a_refused_spec_is_not_sent_again_until_it_changes() -> None:
    """Every Node update starts a pass; a rendering the CRD refuses would be POSTed on each."""
    api = FakeApi()
    api.fail["redfish-w1"] = WriteError(
        422, "spec.metricsCollector.deltaP.type: Unsupported value", invalid_fields=True
    )
    nodes = [node("w1", "10.0.0.11")]

    async def go() -> list[list[tuple[str, ...]]]:
        sync = TemplateSync(api, lambda _obj, _e: None, retry_initial=1, retry_max=2)
        calls = []
        for inputs in (Inputs([template()], nodes, []), Inputs([template()], nodes, [])):
            await sync.sync_once(inputs)
            calls.append([c for c in api.calls if c[0] == "create"])
            api.calls.clear()
        await sync.sync_once(Inputs([template()], [node("w1", "10.0.0.12")], []))  # the rendering changes
        calls.append([c for c in api.calls if c[0] == "create"])
        return calls

    assert asyncio.run(go()) == [[("create", "redfish-w1")], [], [("create", "redfish-w1")]]
    assert [p["reason"] for p in api.statuses["redfish"]["problems"]] == ["Invalid"]
