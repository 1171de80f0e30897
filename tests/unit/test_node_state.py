"""The pure half of rmd_agent.node_state: the RmdNodeState the agent publishes, built from what the engine
says. rmd-operator's map format (reference §1.2, its UpdateNodeStatusWorkload): human keys, string values,
Core IDs comma-joined, P-State Ratio printed with Go's %f."""

from __future__ import annotations

import dataclasses
import logging
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from rmd_agent.engine_api import AppliedWorkload, PstateOutcome
from rmd_agent.errors import ConfigError
from rmd_agent.node_state import (
    MAX_CAPABILITIES,
    MAX_DETAIL,
    Readiness,
    capabilities_map,
    desired_object,
    desired_status,
    endpoint_from_settings,
    engine_readiness,
    format_endpoint,
    ready_condition,
    repair_change,
    repair_patch,
    status_change,
    stopped_readiness,
    workload_entry,
    workloads_map,
)
from rmd_agent.plan.mba import MbaApplied
from rmd_agent.plan.workload import Workload
from rmd_agent.settings import load_settings
from rmd_api.node_state import AGENT_READY, AGENT_STOPPED, ENGINE_NOT_READY, READY, node_state_name

ROOT = Path(__file__).resolve().parents[2]
ORIGINAL_KEYS = {
    "ID", "Core IDs", "Status", "Cos Name", "Cache Max", "Cache Min", "MBA Percentage", "MBA Mbps",
    "Origin", "Policy", "P-State Ratio", "P-State Monitoring",
}  # fmt: skip
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def applied(
    name: str = "wl",
    namespace: str = "default",
    *,
    cpus: tuple[int, ...] = (4, 5),
    wid: str = "1",
    cos: str = "",
    pool: str = "none",
    status: str = "Successful",
    **fields: Any,
) -> AppliedWorkload:
    w = Workload(namespace, name, uid=f"uid-{name}", core_ids=frozenset(cpus), resolved=True, **fields)
    return AppliedWorkload(w, id=wid, cos_name=cos, pool=pool, status=status)


# -- the workload map ----------------------------------------------------------------------------------------


def test_guaranteed_workload_in_the_original_format() -> None:
    entry = workload_entry(
        applied(
            "guaranteed", cpus=(4, 5, 6, 8), wid="7", cos="COS3", pool="guaranteed", cache_max=2, cache_min=2
        )
    )
    assert entry == {
        "Namespace": "default",
        "ID": "7",
        "Core IDs": "4-6,8",
        "Status": "Successful",
        "Cos Name": "COS3",
        "Cache Max": "2",
        "Cache Min": "2",
        "Origin": "gRPC",
    }


def test_besteffort_workload_carries_both_bounds() -> None:
    entry = workload_entry(applied(cos="COS4", pool="besteffort", cache_max=5, cache_min=2))
    assert (entry["Cache Max"], entry["Cache Min"], entry["Cos Name"]) == ("5", "2", "COS4")


def test_shared_workload_shows_zero_ways_as_rmd_operator_did() -> None:
    # rmd-operator always sent max and min (0 for a shared-pool request), so RMD always echoed both.
    entry = workload_entry(applied(pool="shared", cos="", cpus=(9,), status="Successful"))
    assert entry["Cache Max"] == entry["Cache Min"] == "0"
    assert entry["Core IDs"] == "9"
    assert "Cos Name" not in entry  # omitted when empty, as UpdateNodeStatusWorkload did


@pytest.mark.parametrize(
    ("fields", "present", "absent"),
    [
        ({"mba_percentage": 50}, {"MBA Percentage": "50"}, "MBA Mbps"),
        ({"mba_mbps": 4000}, {"MBA Mbps": "4000"}, "MBA Percentage"),
    ],
)
def test_mba_in_the_unit_given(fields: dict[str, Any], present: dict[str, str], absent: str) -> None:
    entry = workload_entry(applied(pool="guaranteed", cache_max=3, cache_min=3, cos="COS1", **fields))
    assert present.items() <= entry.items()
    assert absent not in entry


@pytest.mark.parametrize(
    ("fields", "held", "expected"),
    [
        (
            {"mba_percentage": 15},
            MbaApplied(requested=15, value=20, mbps=False, step=10),
            {
                "MBA Percentage": "15",
                "MBA Applied": "20",
                "MBA Rounded": "true",
                "MBA Message": "MBA 15% rounded up to 20%: the node's MBA step (bandwidth_gran) is 10%",
            },
        ),
        (
            {"mba_percentage": 40},
            MbaApplied(requested=40, value=40, mbps=False, step=10),
            {"MBA Percentage": "40", "MBA Applied": "40", "MBA Rounded": "false"},
        ),
        (
            {"mba_mbps": 2500},  # the kernel takes MBps as given
            MbaApplied(requested=2500, value=2500, mbps=True, step=0),
            {"MBA Mbps": "2500", "MBA Applied": "2500", "MBA Rounded": "false"},
        ),
    ],
)
def test_mba_the_node_holds_and_whether_it_was_rounded(
    fields: dict[str, Any], held: MbaApplied, expected: dict[str, str]
) -> None:
    """#13 item 5: beside the requested value, the value the group's schemata holds."""
    w = applied(pool="guaranteed", cache_max=3, cache_min=3, cos="COS1", **fields)
    entry = workload_entry(AppliedWorkload(w.workload, w.id, w.cos_name, w.pool, mba_applied=held))
    assert {k: v for k, v in entry.items() if k.startswith("MBA")} == expected


@pytest.mark.parametrize(("ratio", "text"), [(3.0, "3.000000"), (2.5, "2.500000"), (1.125, "1.125000")])
def test_pstate_ratio_printed_like_gos_percent_f(ratio: float, text: str) -> None:
    w = applied(pstate_ratio=ratio, pstate_monitoring="on")
    entry = workload_entry(
        AppliedWorkload(w.workload, w.id, w.cos_name, w.pool, pstate=PstateOutcome(True, "applied"))
    )
    assert entry["P-State Ratio"] == text
    assert entry["P-State Monitoring"] == "on"


def test_policy_and_its_resolved_values() -> None:
    entry = workload_entry(
        applied(
            policy="gold", cache_max=6, cache_min=6, pool="guaranteed", cos="COS2", pstate_monitoring="off"
        )
    )
    assert (entry["Policy"], entry["Cache Max"], entry["P-State Monitoring"]) == ("gold", "6", "off")
    assert "P-State Ratio" not in entry


def test_failed_status_is_shown() -> None:
    assert workload_entry(applied(status="Failed"))["Status"] == "Failed"


def test_only_original_keys_plus_namespace_and_the_mba_held_and_strings_only() -> None:
    everything = applied(
        cos="COS1", pool="guaranteed", cache_max=2, cache_min=2, mba_percentage=45, policy="gold",
        pstate_ratio=2.0, pstate_monitoring="on",
    )  # fmt: skip
    held = MbaApplied(requested=45, value=50, mbps=False, step=10)
    entry = workload_entry(dataclasses.replace(everything, mba_applied=held))
    additions = {"Namespace", "MBA Applied", "MBA Rounded", "MBA Message"}
    assert set(entry) == ORIGINAL_KEYS - {"MBA Mbps"} | additions
    assert all(isinstance(v, str) for v in entry.values())


def test_workloads_keyed_by_name_like_rmd_operator() -> None:
    result = workloads_map([applied("b", "ns1", wid="2"), applied("a", "ns2", wid="1")])
    assert set(result) == {"a", "b"}
    assert result["a"]["Namespace"] == "ns2"
    assert result["b"]["ID"] == "2"


def test_names_shared_by_namespaces_are_qualified() -> None:
    result = workloads_map([applied("db", "team-a", wid="1"), applied("db", "team-b", wid="2"), applied("x")])
    assert set(result) == {"team-a/db", "team-b/db", "x"}
    assert result["team-b/db"]["ID"] == "2"


def test_no_workloads_is_an_empty_map() -> None:
    assert workloads_map([]) == {}


# -- capabilities --------------------------------------------------------------------------------------------


def test_capabilities_mapping() -> None:
    caps = {"rdtL3Cat": (True, "11 ways"), "rapl": (False, "no powercap in sysfs")}
    assert capabilities_map(caps) == {
        "rdtL3Cat": {"supported": True, "detail": "11 ways"},
        "rapl": {"supported": False, "detail": "no powercap in sysfs"},
    }


def test_capabilities_bounded_like_the_crd() -> None:
    caps = {f"feature{i:03}": (i % 2 == 0, "x" * (MAX_DETAIL + 50)) for i in range(MAX_CAPABILITIES + 5)}
    result = capabilities_map(caps)
    assert len(result) == MAX_CAPABILITIES
    assert all(len(v["detail"]) == MAX_DETAIL for v in result.values())
    assert result["feature000"]["supported"] is True and result["feature001"]["supported"] is False


# -- the Ready condition -------------------------------------------------------------------------------------


def test_ready_condition_when_the_engine_is_ready() -> None:
    condition = ready_condition(engine_readiness(True, ""), [], T0)
    assert condition["type"] == READY and condition["status"] == "True"
    assert condition["reason"] == AGENT_READY
    assert condition["lastTransitionTime"] == "2024-05-01T12:00:00Z"


def test_not_ready_carries_the_engines_reason() -> None:
    why = "the CPU supports RDT but resctrl is not mounted at /sys/fs/resctrl"
    condition = ready_condition(engine_readiness(False, why), [], T0)
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False",
        ENGINE_NOT_READY,
        why,
    )
    assert engine_readiness(False, "").message  # never an empty explanation


def test_transition_time_moves_only_when_status_changes() -> None:
    first = ready_condition(engine_readiness(False, "starting"), [], T0)
    later = T0 + timedelta(minutes=5)
    same = ready_condition(engine_readiness(False, "still starting"), [first], later)
    assert same["lastTransitionTime"] == first["lastTransitionTime"]
    assert same["message"] == "still starting"
    flipped = ready_condition(engine_readiness(True, ""), [same], later)
    assert flipped["lastTransitionTime"] == "2024-05-01T12:05:00Z"


def test_stopped_is_not_ready_with_its_own_reason() -> None:
    condition = ready_condition(stopped_readiness(), [], T0)
    assert (condition["status"], condition["reason"]) == ("False", AGENT_STOPPED)
    assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", condition["reason"])


# -- the whole status ----------------------------------------------------------------------------------------


def status(**kwargs: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "endpoint": "10.0.0.5:50051",
        "readiness": Readiness(True, AGENT_READY, "ok"),
        "capabilities": {"mba": (True, "10% steps")},
        "workloads": [applied("wl")],
        "previous": {},
        "now": T0,
    }
    args.update(kwargs)
    return desired_status(**args)


def test_status_holds_endpoint_capabilities_ready_and_workloads() -> None:
    result = status()
    assert result["endpoint"] == "10.0.0.5:50051"
    assert result["capabilities"] == {"mba": {"supported": True, "detail": "10% steps"}}
    assert [c["type"] for c in result["conditions"]] == [READY]
    assert set(result["workloads"]) == {"wl"}


def test_same_inputs_give_an_identical_status() -> None:
    first = status()
    assert status(previous=first, now=T0 + timedelta(hours=1)) == first


def test_unknown_workloads_and_capabilities_keep_the_previous_ones() -> None:
    previous = status()
    result = status(
        workloads=None, capabilities=None, readiness=Readiness(False, "EngineUnavailable", "boom"),
        previous=previous,
    )  # fmt: skip
    assert result["workloads"] == previous["workloads"]
    assert result["capabilities"] == previous["capabilities"]
    assert result["conditions"][0]["status"] == "False"


def test_an_empty_list_really_empties_the_map() -> None:
    assert status(workloads=[], previous=status())["workloads"] == {}


def test_other_conditions_are_kept() -> None:
    foreign = {"type": "Degraded", "status": "False", "lastTransitionTime": "x", "reason": "R", "message": ""}
    previous = {**status(), "conditions": [foreign]}
    assert foreign in status(previous=previous)["conditions"]


def test_no_endpoint_means_no_endpoint_field() -> None:
    assert "endpoint" not in status(endpoint="")


# -- endpoint ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("advertise", "listen", "port", "expected"),
    [
        ("10.0.0.5", "0.0.0.0:50051", None, "10.0.0.5:50051"),
        ("fd00::5", "[::]:50051", None, "[fd00::5]:50051"),
        ("[fd00::5]", "[::]:50051", 7000, "[fd00::5]:7000"),
        ("", "192.168.1.9:50051", None, "192.168.1.9:50051"),
        ("", "0.0.0.0:50051", None, ""),  # a wildcard says nothing about where to dial
        ("", "[::]:50051", None, ""),
        ("", ":50051", None, ""),
        ("worker-1.example.com", "0.0.0.0:0", None, ""),  # port unknown until the server binds
        ("worker-1.example.com", "0.0.0.0:0", 41234, "worker-1.example.com:41234"),
    ],
)
def test_endpoint_from_settings(advertise: str, listen: str, port: int | None, expected: str) -> None:
    assert endpoint_from_settings(advertise, listen, port) == expected


@pytest.mark.parametrize(("host", "port"), [("bad host", 1), ("-x", 1), ("h", 70000), ("a_b", 5)])
def test_invalid_endpoints_are_config_errors(host: str, port: int) -> None:
    with pytest.raises(ConfigError, match="not a valid endpoint"):
        format_endpoint(host, port)


def test_endpoint_pattern_is_the_crds() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "rmdnodestates.intel.com.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    pattern = schema["properties"]["status"]["properties"]["endpoint"]["pattern"]
    for host, port in [("10.1.2.3", 1), ("[fd00::1]", 65535), ("node-a.example", 50051)]:
        assert re.fullmatch(pattern, format_endpoint(host, port))


# -- the object and its repairs ------------------------------------------------------------------------------


def test_object_named_after_the_node_and_owned_by_it() -> None:
    obj = desired_object("worker-1", "rmd", "uid-1")
    assert obj["apiVersion"] == "intel.com/v1alpha1" and obj["kind"] == "RmdNodeState"
    assert obj["metadata"]["name"] == node_state_name("worker-1") == "rmd-node-state-worker-1"
    assert obj["metadata"]["namespace"] == "rmd"
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "worker-1", "uid": "uid-1"}
    ]
    assert obj["spec"] == {"node": "worker-1", "nodeUid": "uid-1"}
    assert "status" not in obj  # ignored on create: written through the status subresource


def test_no_repair_for_a_correct_object() -> None:
    assert repair_patch(desired_object("n", "ns", "u1"), "n", "u1") == {}


def test_repair_adds_a_missing_owner_and_uid() -> None:
    current = desired_object("n", "ns", "u1")
    del current["metadata"]["ownerReferences"]
    del current["spec"]["nodeUid"]
    patch = repair_patch(current, "n", "u1")
    assert patch["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u1"}
    ]
    assert patch["spec"] == {"nodeUid": "u1"}


def test_repair_replaces_a_stale_node_owner_and_keeps_others() -> None:
    current = desired_object("n", "ns", "old")
    other = {"apiVersion": "intel.com/v1alpha1", "kind": "RmdConfig", "name": "rmdconfig", "uid": "c"}
    current["metadata"]["ownerReferences"].append(other)
    refs = repair_patch(current, "n", "new")["metadata"]["ownerReferences"]
    assert other in refs
    assert [r["uid"] for r in refs if r["kind"] == "Node"] == ["new"]


def test_repair_change_only_for_a_known_node_and_a_wrong_object() -> None:
    current = desired_object("n", "ns", "old")
    assert repair_change(current, "n", None) is None  # the Node is unknown: nothing to set
    assert repair_change(current, "n", "old") is None
    change = repair_change(current, "n", "new")
    assert change is not None and change.verb == "patch"
    assert change.body == repair_patch(current, "n", "new")
    assert change.message == "RmdNodeState rmd-node-state-n: owner and spec.nodeUid set to Node uid new"


def test_status_change_is_a_merge_patch_of_what_differs() -> None:
    current = {**desired_object("n", "ns", "u"), "status": status()}
    assert status_change(current, status()) is None
    change = status_change(current, status(workloads=[]))
    assert change is not None and change.verb == "patch_status"
    assert change.body == {"status": {"workloads": {"wl": None}}}
    assert change.level == logging.DEBUG  # Ready did not move


def test_status_change_reports_a_ready_transition() -> None:
    current = {**desired_object("n", "ns", "u"), "status": status()}
    change = status_change(current, status(readiness=engine_readiness(False, "resctrl not mounted")))
    assert change is not None and change.level == logging.INFO
    assert change.message == "RmdNodeState rmd-node-state-n: Ready False (EngineNotReady)"


# -- settings ------------------------------------------------------------------------------------------------


def test_namespace_and_address_from_the_downward_api() -> None:
    settings = load_settings(environ={"POD_NAMESPACE": "rmd-system", "POD_IP": "10.0.0.7"})
    assert (settings.node_state_namespace, settings.advertise_address) == ("rmd-system", "10.0.0.7")


def test_rmd_variables_win_over_the_downward_api() -> None:
    env = {"POD_NAMESPACE": "a", "RMD_NODE_STATE_NAMESPACE": "b", "POD_IP": "1.1.1.1"}
    settings = load_settings({"advertise_address": "node-1.example"}, env)
    assert (settings.node_state_namespace, settings.advertise_address) == ("b", "node-1.example")


def test_namespace_defaults_to_default_like_rmd_operator() -> None:
    assert load_settings().node_state_namespace == "default"
