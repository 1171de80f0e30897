"""The agents deployed by an RmdConfig on the real node (docs/install.md "Deployed by an RmdConfig").

The session's stack has the chart installed with agent.deployedBy=chart. This test upgrades the release to
agent.deployedBy=rmdconfig (the chart removes its DaemonSet and companions and hands their manifests to the
operator), applies the seed's RmdConfig with the locally built agent image, waits for the agent pod and its
RmdNodeState to be Ready, changes the RmdConfig and waits for the pod to be replaced, deletes the RmdConfig
and waits for what it made to go, and upgrades back, so the tests after it find the stack as it was.
"""

from __future__ import annotations

import contextlib
from typing import Any

import yaml

from rmd_sim.realnode.stack import RELEASE, RELEASE_NAMESPACE, RealStack, wait_for

NFD = "feature.node.kubernetes.io/cpu-rdt.RDTL3CA"
AGENT_PODS = "app.kubernetes.io/component=agent"


def _seed(image: str) -> dict[str, Any]:
    """The seed's manifest (rmd-operator's), with the image this stack built."""
    return {
        "apiVersion": "intel.com/v1alpha1",
        "kind": "RmdConfig",
        "metadata": {"name": "rmdconfig"},
        "spec": {"rmdImage": image, "rmdNodeSelector": {NFD: "true"}, "deployNodeAgent": False},
    }


def _upgrade(stack: RealStack, deployed_by: str) -> None:
    chart = str(stack.repo / "charts" / "rmd")
    stack.helm(
        "upgrade", RELEASE, chart, "-n", RELEASE_NAMESPACE, "--reuse-values",
        "--set", f"agent.deployedBy={deployed_by}", "--wait", "--timeout", "300s",
    )  # fmt: skip


def _condition(stack: RealStack, kind: str) -> tuple[str, str] | None:
    config = stack.get_json("rmdconfig", "rmdconfig") or {}
    for c in config.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return c["status"], c["reason"]
    return None


def _delete_and_wait_gone(stack: RealStack) -> None:
    stack.kubectl("delete", "rmdconfig", "rmdconfig", "--ignore-not-found", "--wait=true")
    for kind, name in (("daemonset", "rmd-agent"), ("serviceaccount", "rmd-agent"), ("service", "rmd-agent")):
        wait_for(
            f"{kind} {name} removed",
            lambda kind=kind, name=name: stack.get_json(kind, name, "-n", RELEASE_NAMESPACE) is None,
            timeout=120,
        )
    wait_for(
        "the agent pod gone",
        lambda: not stack.get_json("pods", "-n", RELEASE_NAMESPACE, "-l", AGENT_PODS)["items"],
        timeout=120,
    )


def test_the_seed_rmdconfig_runs_the_agent_on_the_real_node(stack: RealStack) -> None:
    node = stack.node.name
    manifest = stack.workdir / "rmdconfig.yaml"
    manifest.write_text(yaml.safe_dump(_seed(stack.image_tags["agent"])))
    stack.kubectl("label", "node", node, f"{NFD}=true", "--overwrite")
    try:
        _upgrade(stack, "rmdconfig")
        assert stack.get_json("daemonset", "rmd-agent", "-n", RELEASE_NAMESPACE) is None  # not the chart's
        stack.kubectl("apply", "-f", str(manifest))
        ds = wait_for(
            "the operator's DaemonSet",
            lambda: stack.get_json("daemonset", "rmd-agent", "-n", RELEASE_NAMESPACE),
        )
        assert ds["metadata"]["ownerReferences"][0]["kind"] == "RmdConfig"
        wait_for(
            "an agent pod", lambda: stack.get_json("pods", "-n", RELEASE_NAMESPACE, "-l", AGENT_PODS)["items"]
        )
        stack.kubectl(
            "wait",
            "pods",
            "-n",
            RELEASE_NAMESPACE,
            "-l",
            AGENT_PODS,
            "--for=condition=Ready",
            "--timeout=180s",
        )

        def node_state_ready() -> bool:
            state = stack.get_json("rmdnodestate", f"rmd-node-state-{node}", "-n", RELEASE_NAMESPACE) or {}
            return any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in state.get("status", {}).get("conditions", [])
            )

        wait_for("the RmdNodeState Ready", node_state_ready, timeout=120)
        wait_for(
            "the RmdConfig Ready", lambda: _condition(stack, "Ready") == ("True", "AgentsReady"), timeout=60
        )
        status = stack.get_json("rmdconfig", "rmdconfig")["status"]
        assert status["nodes"] == [
            {
                "name": node,
                "pod": status["nodes"][0]["pod"],
                "ready": True,
                "image": stack.image_tags["agent"],
            }
        ]
        assert status["unsupportedNodes"] == []  # the simulated host has RDT

        # A change rolls out: the DaemonSet replaces the agent pod with one that has it.
        (old,) = stack.get_json("pods", "-n", RELEASE_NAMESPACE, "-l", AGENT_PODS)["items"]
        stack.kubectl(
            "patch", "rmdconfig", "rmdconfig", "--type=merge",
            "-p", '{"spec": {"agentSettings": {"log_level": "debug"}}}',
        )  # fmt: skip

        def rolled() -> bool:
            pods = stack.get_json("pods", "-n", RELEASE_NAMESPACE, "-l", AGENT_PODS)["items"]
            return (
                [p["metadata"]["uid"] for p in pods] != [old["metadata"]["uid"]]
                and all(
                    {"name": "RMD_LOG_LEVEL", "value": "debug"} in p["spec"]["containers"][0].get("env", [])
                    and any(
                        c["type"] == "Ready" and c["status"] == "True"
                        for c in p["status"].get("conditions", [])
                    )
                    for p in pods
                )
                and len(pods) == 1
            )

        wait_for("the agent pod replaced by one with the change, Ready", rolled, timeout=180)
        wait_for("the RmdNodeState Ready again", node_state_ready, timeout=120)

        # Deleting the RmdConfig removes what it made, the agent pod too.
        _delete_and_wait_gone(stack)
    finally:
        with contextlib.suppress(Exception):
            _delete_and_wait_gone(stack)  # the chart takes its objects back only once these are gone
        _upgrade(stack, "chart")
        stack.kubectl("label", "node", node, f"{NFD}-", check=False)
        stack.wait_pods_ready()
        wait_for("the cache ways back", stack.node_cache_ways, timeout=60)
