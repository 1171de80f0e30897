"""Which nodes a workload targets, and why the others cannot take it."""

from __future__ import annotations

from typing import Any

import pytest

from rmd_operator.spec import Requirements
from rmd_operator.targets import (
    FAILED,
    PENDING,
    Capability,
    NodeAgent,
    candidate_nodes,
    may_target,
    node_agent,
    plan_targets,
)

RDT = {"feature.node.kubernetes.io/cpu-rdt.RDTL3CA": "true"}
CACHE = Requirements(rdt_l3_cat=True, mba=False)
PSTATE_ONLY = Requirements(rdt_l3_cat=False, mba=False)
CACHE_MBA = Requirements(rdt_l3_cat=True, mba=True)


def agent(node: str, *, rdt: bool = True, mba: bool = True, **kwargs: Any) -> NodeAgent:
    caps = {"rdtL3Cat": Capability(rdt, "11 ways" if rdt else "no resctrl info/L3"), "mba": Capability(mba)}
    return NodeAgent(
        node=node, endpoint=kwargs.pop("endpoint", f"10.0.0.{node[-1]}:50051"), capabilities=caps, **kwargs
    )


def nodes(**labels: dict[str, str]) -> dict[str, dict[str, str]]:
    return {name.replace("_", "-"): value for name, value in labels.items()}


def test_node_selector_takes_precedence_over_nodes() -> None:
    labels = nodes(w_1={**RDT, "tier": "gold"}, w_2={**RDT}, w_3={"tier": "gold"})
    spec = {"nodes": ["w-2"], "nodeSelector": {"tier": "gold"}}
    assert candidate_nodes(spec, labels) == ["w-1", "w-3"]
    assert candidate_nodes({"nodes": ["w-2"]}, labels) == ["w-2"]


def test_selector_needs_every_label_with_its_value() -> None:
    labels = nodes(w_1={"a": "1", "b": "2"}, w_2={"a": "1"}, w_3={"a": "1", "b": "3"})
    assert candidate_nodes({"nodeSelector": {"a": "1", "b": "2"}}, labels) == ["w-1"]


def test_capable_nodes_are_targets_with_their_endpoints() -> None:
    plan = plan_targets(
        {"nodes": ["w-1", "w-2"]}, CACHE, nodes(w_1=RDT, w_2=RDT), {"w-1": agent("w-1"), "w-2": agent("w-2")}
    )
    assert plan.targets == {"w-1": "10.0.0.1:50051", "w-2": "10.0.0.2:50051"}
    assert plan.blocked == {}


def test_node_without_rdt_gets_a_reason_and_is_no_target() -> None:
    plan = plan_targets(
        {"nodes": ["w-1", "w-2"]},
        CACHE,
        nodes(w_1=RDT, w_2={}),
        {"w-1": agent("w-1"), "w-2": agent("w-2", rdt=False)},
    )
    assert list(plan.targets) == ["w-1"]
    blocked = plan.blocked["w-2"]
    assert blocked.status == FAILED
    assert blocked.reason == "Unsupported"
    assert "RDT L3 cache allocation" in blocked.message
    assert "no resctrl info/L3" in blocked.message  # the agent's own finding


def test_pstate_only_workload_may_target_nodes_without_rdt() -> None:
    plan = plan_targets({"nodes": ["w-2"]}, PSTATE_ONLY, nodes(w_2={}), {"w-2": agent("w-2", rdt=False)})
    assert list(plan.targets) == ["w-2"]


def test_mba_needs_mba_support() -> None:
    plan = plan_targets({"nodes": ["w-1"]}, CACHE_MBA, nodes(w_1=RDT), {"w-1": agent("w-1", mba=False)})
    assert plan.blocked["w-1"].status == FAILED
    assert "memory bandwidth allocation" in plan.blocked["w-1"].message


@pytest.mark.parametrize(
    ("labels", "agents", "reason"),
    [
        ({}, {}, "NodeNotFound"),
        ({"w-1": RDT}, {}, "NoAgent"),
        (
            {"w-1": RDT},
            {"w-1": agent("w-1", ready=False, ready_reason="ResctrlNotMounted", ready_message="mount it")},
            "AgentNotReady",
        ),
        ({"w-1": RDT}, {"w-1": agent("w-1", endpoint="")}, "NoEndpoint"),
        ({"w-1": RDT}, {"w-1": NodeAgent("w-1", "10.0.0.1:1")}, "CapabilitiesUnknown"),
    ],
)
def test_nodes_that_may_become_targets_later_are_pending_with_a_reason(
    labels: dict[str, dict[str, str]], agents: dict[str, NodeAgent], reason: str
) -> None:
    plan = plan_targets({"nodes": ["w-1"]}, CACHE, labels, agents)
    assert plan.targets == {}
    assert plan.blocked["w-1"].status == PENDING
    assert plan.blocked["w-1"].reason == reason
    assert plan.candidates == {"w-1"}


def test_not_ready_message_carries_the_agents_reason() -> None:
    a = agent("w-1", ready=False, ready_reason="ResctrlNotMounted", ready_message="mount it")
    plan = plan_targets({"nodes": ["w-1"]}, CACHE, nodes(w_1=RDT), {"w-1": a})
    assert "ResctrlNotMounted: mount it" in plan.blocked["w-1"].message


def test_ready_agent_without_condition_is_tried() -> None:
    a = agent("w-1", ready=None)
    assert plan_targets({"nodes": ["w-1"]}, CACHE, nodes(w_1=RDT), {"w-1": a}).targets == {"w-1": a.endpoint}


def test_node_state_is_parsed() -> None:
    body = {
        "metadata": {"name": "rmd-node-state-w-1", "namespace": "rmd"},
        "spec": {"node": "w-1"},
        "status": {
            "endpoint": "[fd00::1]:50051",
            "capabilities": {
                "rdtL3Cat": {"supported": True, "detail": "11 ways"},
                "mba": {"supported": False, "reason": "NoMba"},
            },
            "conditions": [
                {"type": "Other", "status": "False", "reason": "X", "message": ""},
                {"type": "Ready", "status": "True", "reason": "EngineReady", "message": "ok"},
            ],
            "workloads": {"w": {"ID": "1"}},
        },
    }
    parsed = node_agent(body)
    assert parsed == NodeAgent(
        node="w-1",
        endpoint="[fd00::1]:50051",
        capabilities={"rdtL3Cat": Capability(True, "11 ways"), "mba": Capability(False, "NoMba")},
        ready=True,
        ready_reason="EngineReady",
        ready_message="ok",
    )
    assert node_agent({"spec": {}}) is None
    bare = node_agent({"spec": {"node": "w-2"}})
    assert bare == NodeAgent("w-2")


def test_may_target() -> None:
    assert may_target({"nodeSelector": {"a": "b"}}, "any", [])
    assert may_target({"nodes": ["w-1"]}, "w-1", [])
    assert may_target({"nodes": ["w-1"]}, "w-2", ["w-2"])  # has an entry: must be re-examined
    assert not may_target({"nodes": ["w-1"]}, "w-2", [])
