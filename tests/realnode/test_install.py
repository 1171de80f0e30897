"""The chart installed by helm on a real node: its own pods run, read the real kubelet, talk to each other."""

from __future__ import annotations

from rmd_api.cpuset import parse_cpu_list
from rmd_sim.realnode.stack import RELEASE_NAMESPACE, RealStack, wait_for

RESOURCE = "intel.com/l3_cache_ways"


def test_the_charts_pods_run_ready_on_the_real_node(stack: RealStack) -> None:
    pods = stack.get_json("pods", "-n", RELEASE_NAMESPACE)["items"]
    by_component = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in pods}
    assert set(by_component) == {"agent", "operator"}
    for component, pod in by_component.items():
        assert pod["spec"]["nodeName"] == stack.node.name
        assert pod["status"]["phase"] == "Running", component
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["restartCount"] == 0, (component, status)
        assert status["image"] == stack.image_tags[component]

    # Their logs, read through the real kubelet: the operator signed the agent's own certificate, the agent
    # registered its device plugin and published its node's objects.
    def logs(component: str) -> str:
        name = by_component[component]["metadata"]["name"]
        # wait_for: a kubelet restarted by an earlier test may not serve logs for a moment
        return wait_for(
            f"the {component}'s log", lambda: stack.kubectl("logs", "-n", RELEASE_NAMESPACE, name).stdout
        )

    operator_log, agent_log = logs("operator"), logs("agent")
    assert f"signed CertificateSigningRequest rmd-agent-{stack.node.name}" in operator_log
    assert "advertising" in agent_log and f"NodeResourceTopology {stack.node.name}" in agent_log
    assert "Traceback" not in agent_log + operator_log
    # Its heartbeat goes through the chart's RBAC and own-node policy, held by this pod.
    assert "heartbeat Lease" not in agent_log
    lease = stack.get_json("lease", f"rmd-agent-{stack.node.name}", "-n", RELEASE_NAMESPACE)
    assert lease is not None and lease["spec"]["holderIdentity"].startswith(
        by_component["agent"]["metadata"]["name"]
    )


def test_the_agent_reads_the_real_kubelet(stack: RealStack) -> None:
    """The device plugin is registered with the real device manager, and the node's objects describe the real
    kubelet: its CPU manager, its reserved CPU, the ways the plugin advertises."""
    node = stack.node

    def ways() -> str | None:
        found: str | None = stack.get_json("node", node.name)["status"]["allocatable"].get(RESOURCE)
        return found if found and int(found) > 0 else None

    capacity = wait_for("the Node to show the cache ways", ways, timeout=30)
    assert (
        0 < int(capacity) < stack.host.spec.l3_ways
    )  # the guaranteed pool: the ways the OS group keeps are not offered
    state = stack.get_json("rmdnodestate", "-n", RELEASE_NAMESPACE, f"rmd-node-state-{node.name}")
    assert state is not None
    nrt = stack.get_json("noderesourcetopology", node.name)
    attributes = {a["name"]: a["value"] for a in nrt["attributes"]}
    assert attributes["topologyManagerPolicy"] == "single-numa-node"
    (zone,) = nrt["zones"]  # this machine has one NUMA node
    resources = {r["name"]: r for r in zone["resources"]}
    reserved = parse_cpu_list(node.reserved_cpus)
    assert int(resources["cpu"]["allocatable"]) == stack.host.spec.cpus - len(reserved)
    assert resources[RESOURCE]["allocatable"] == capacity
