"""A real kubelet without PodResources Get (v1.33, feature gate KubeletPodResourcesGet off, what clusters
before 1.34 run; a 1.36 kubelet has the gate locked on): the pod flow still works because the agent looks pods
up with List, and `rmd-agent probe` and the RmdNodeState say which API is in use."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rmd_sim.realnode.stack import RELEASE_NAMESPACE, RealStack, wait_for

NAMESPACE = "get-fallback"
LEGACY_KUBELET = "kubelet-1.33"


def admit_after_restart(stack: RealStack, pod: dict[str, Any]) -> None:
    """Create the pod; again if the kubelet refused it. A kubelet that has just started keeps the device
    allocations of pods deleted before the restart until its pod sources are synced (seen: ways of deleted
    pods still held, the pod refused with TopologyAffinityError a second after the start); a controller would
    create the pod again in the same way."""
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    for _ in range(3):
        stack.create(pod)

        def settled() -> str | None:
            phase: str | None = (
                (stack.get_json("pod", "-n", namespace, name) or {}).get("status", {}).get("phase")
            )
            return phase if phase in ("Running", "Failed") else None

        if wait_for(f"pod {name} admitted or refused", settled, timeout=60) == "Running":
            return
        stack.kubectl("delete", "pod", "-n", namespace, name, "--wait=true")
        time.sleep(3)
    raise AssertionError(f"the kubelet refused pod {namespace}/{name} three times")


def lookup_capability(stack: RealStack) -> dict[str, Any]:
    state = stack.get_json("rmdnodestate", "-n", RELEASE_NAMESPACE, f"rmd-node-state-{stack.node.name}")
    found: dict[str, Any] = state["status"]["capabilities"].get("podResourcesGet") or {}
    return found


def test_without_get_the_pod_flow_falls_back_to_list(stack: RealStack) -> None:
    if not (stack.control_plane.bin_dir / LEGACY_KUBELET).exists():
        pytest.fail(f"{LEGACY_KUBELET} is not built (tools/build-binaries.sh builds it)")

    stack.wait_nothing_held()  # the pod below needs the node's exclusive CPU and two ways
    stack.node.restart_kubelet(binary=LEGACY_KUBELET, feature_gates={"KubeletPodResourcesGet": False})
    try:
        version = stack.get_json("node", stack.node.name)["status"]["nodeInfo"]["kubeletVersion"]
        assert version.startswith("v1.33."), version
        stack.create_namespace(NAMESPACE)
        admit_after_restart(stack, stack.cache_pod("listed", NAMESPACE))
        stack.wait_applied(NAMESPACE, "listed-rmd-workload-app")
        workload = stack.get_json("rmdworkload", "-n", NAMESPACE, "listed-rmd-workload-app")
        uid = stack.get_json("pod", "-n", NAMESPACE, "listed")["metadata"]["uid"]
        entries = json.loads((stack.node.kubelet_dir / "cpu_manager_state").read_text())["entries"]
        assert workload["spec"]["coreIds"] == [entries[uid]["app"]]

        capability = wait_for(
            "the RmdNodeState to say List",
            lambda: (c := lookup_capability(stack)).get("detail") and c,
            timeout=30,
        )
        assert capability["supported"] is False
        assert "List" in capability["detail"] and "Get method disabled" in capability["detail"]
        agent = stack.get_json("pods", "-n", RELEASE_NAMESPACE, "-l", "app.kubernetes.io/component=agent")
        probe = stack.kubectl(
            "exec", "-n", RELEASE_NAMESPACE, agent["items"][0]["metadata"]["name"], "--",
            "rmd-agent", "probe", "--host-root", "/host", "--json",
        )  # fmt: skip
        found = json.loads(probe.stdout)["features"]["podResourcesGet"]
        assert found["supported"] is False and "List" in found["detail"]
    finally:
        stack.delete_namespace(NAMESPACE)
        stack.node.restart_kubelet(binary="kubelet", feature_gates={})
