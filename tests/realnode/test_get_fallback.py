"""A real kubelet without PodResources Get (v1.33, feature gate KubeletPodResourcesGet off, what clusters
before 1.34 run; a 1.36 kubelet has the gate locked on): the pod flow still works because the agent looks pods
up with List, and `rmd-agent probe` and the RmdNodeState say which API is in use."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rmd_sim.realnode.stack import RELEASE_NAMESPACE, RealStack, wait_for

WAYS = "intel.com/l3_cache_ways"
NAMESPACE = "get-fallback"
LEGACY_KUBELET = "kubelet-1.33"


def cache_pod(stack: RealStack) -> dict[str, Any]:
    resources = {"cpu": "1", "memory": "64Mi", WAYS: "2"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "listed", "namespace": NAMESPACE, "annotations": {"app_cache_min": "2"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "app",
                    "image": stack.image_tags["busybox"],
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
        },
    }


def lookup_capability(stack: RealStack) -> dict[str, Any]:
    state = stack.get_json("rmdnodestate", "-n", RELEASE_NAMESPACE, f"rmd-node-state-{stack.node.name}")
    found: dict[str, Any] = state["status"]["capabilities"].get("podResourcesGet") or {}
    return found


def test_without_get_the_pod_flow_falls_back_to_list(stack: RealStack) -> None:
    if not (stack.control_plane.bin_dir / LEGACY_KUBELET).exists():
        pytest.fail(f"{LEGACY_KUBELET} is not built (tools/build-binaries.sh builds it)")
    stack.node.restart_kubelet(binary=LEGACY_KUBELET, feature_gates={"KubeletPodResourcesGet": False})
    try:
        version = stack.get_json("node", stack.node.name)["status"]["nodeInfo"]["kubeletVersion"]
        assert version.startswith("v1.33."), version
        stack.kubectl("create", "namespace", NAMESPACE)
        stack.create(cache_pod(stack))

        def applied() -> dict[str, Any] | None:
            workload = stack.get_json("rmdworkload", "-n", NAMESPACE, "listed-rmd-workload-app") or {}
            states = (workload.get("status") or {}).get("workloadStates") or {}
            entry: dict[str, Any] = states.get(stack.node.name) or {}
            return workload if entry.get("status") == "Successful" else None

        workload = wait_for("the workload Successful through List", applied, timeout=90)
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
        stack.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=60s", check=False)
        stack.node.restart_kubelet(binary="kubelet", feature_gates={})
