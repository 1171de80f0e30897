"""A pod asking for cache ways on a real node: the real CPU manager pins it, the real device manager hands it
ways from the agent's device plugin, the operator writes its RmdWorkload with the kubelet's CPU, the agent
enforces it; the node's NodeResourceTopology follows the real allocation; deleting the pod undoes it all."""

from __future__ import annotations

import json
from typing import Any

from rmd_api.cpuset import parse_cpu_list
from rmd_sim.realnode.stack import RealStack, wait_for
from rmd_sim.resctrl.checker import check_resctrl_tree

RESOURCE = "intel.com/l3_cache_ways"
NAMESPACE = "default"


def running(stack: RealStack, name: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        pod: dict[str, Any] | None = stack.get_json("pod", "-n", NAMESPACE, name)
        return pod if pod and pod["status"].get("phase") == "Running" else None

    try:
        return wait_for(f"pod {name} Running", probe, timeout=60)
    except AssertionError as exc:
        described = stack.kubectl("describe", "pod", "-n", NAMESPACE, name, check=False).stdout
        raise AssertionError(f"{exc}\n{described}") from None


def kubelet_cpus(stack: RealStack, uid: str, container: str) -> set[int]:
    """What the real CPU manager gave the container (its checkpoint file)."""
    state = json.loads((stack.node.kubelet_dir / "cpu_manager_state").read_text())
    return parse_cpu_list(state["entries"][uid][container])


def zone_resource(stack: RealStack, resource: str) -> dict[str, str]:
    nrt = stack.get_json("noderesourcetopology", stack.node.name)
    (zone,) = nrt["zones"]
    found: dict[str, str] = next(r for r in zone["resources"] if r["name"] == resource)
    return found


def test_a_cache_pod_is_pinned_given_ways_and_enforced_then_cleaned_up(stack: RealStack) -> None:
    stack.wait_nothing_held()  # the baseline: what earlier tests held is released and published
    free_before = int(zone_resource(stack, "cpu")["available"])
    ways_before = int(zone_resource(stack, RESOURCE)["available"])
    try:
        check_cache_pod_flow(stack, free_before, ways_before)
    finally:  # the node has one exclusive CPU: a pod left behind would fail the tests after this one
        stack.kubectl("delete", "pod", "-n", NAMESPACE, "cache-pod", "--ignore-not-found", "--wait=true")


def check_cache_pod_flow(stack: RealStack, free_before: int, ways_before: int) -> None:
    stack.create(stack.cache_pod("cache-pod", NAMESPACE))
    pod = running(stack, "cache-pod")
    uid = pod["metadata"]["uid"]

    cpus = kubelet_cpus(stack, uid, "app")
    assert len(cpus) == 1 and not cpus & parse_cpu_list(stack.node.reserved_cpus)
    # The real device manager allocated two ways of the agent's plugin (PodResources, read by the agent).
    entry = stack.wait_applied(NAMESPACE, "cache-pod-rmd-workload-app")
    workload = stack.get_json("rmdworkload", "-n", NAMESPACE, "cache-pod-rmd-workload-app")
    assert parse_cpu_list(",".join(workload["spec"]["coreIds"])) == cpus
    assert workload["spec"]["nodes"] == [stack.node.name]
    assert workload["spec"]["rdt"]["cache"] == {"max": 2, "min": 2}
    cos_name = entry["cosName"]
    resctrl = stack.host.root / "sys/fs/resctrl"
    assert parse_cpu_list((resctrl / cos_name / "cpus_list").read_text()) == cpus
    assert stack.host.resctrl is not None
    assert check_resctrl_tree(stack.host.resctrl.backing_root) == []  # the kernel's rules hold

    # The node's topology follows the real allocation: one exclusive CPU and two ways fewer.
    wait_for(
        "NRT available cpu and ways to drop",
        lambda: (
            int(zone_resource(stack, "cpu")["available"]) == free_before - 1
            and int(zone_resource(stack, RESOURCE)["available"]) == ways_before - 2
        ),
        timeout=30,
    )

    stack.kubectl("delete", "pod", "-n", NAMESPACE, "cache-pod", "--wait=true")
    wait_for(
        "the RmdWorkload to go with its pod",
        lambda: stack.get_json("rmdworkload", "-n", NAMESPACE, "cache-pod-rmd-workload-app") is None,
        timeout=60,
    )
    wait_for("the resctrl group to go", lambda: not (resctrl / cos_name).exists(), timeout=30)
    wait_for(
        "NRT available cpu and ways to come back",
        lambda: (
            int(zone_resource(stack, "cpu")["available"]) == free_before
            and int(zone_resource(stack, RESOURCE)["available"]) == ways_before
        ),
        timeout=30,
    )
