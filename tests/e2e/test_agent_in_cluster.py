"""A real agent process on a simulated node, connected to the real API server: it publishes its
RmdNodeState and NodeResourceTopology, reflects applied workloads in them, serves power and cache metrics,
and marks itself not ready when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from rmd_api.agent.v1 import agent_pb2, agent_pb2_grpc
from rmd_sim.control_plane import ControlPlane
from rmd_sim.node import ClusterPki, SimNode

NODE = "worker-node-1"


async def eventually(probe: Callable[[], Any], what: str, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await asyncio.to_thread(probe)
            if last:
                return last
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        await asyncio.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}; last seen: {last!r}")


@pytest.fixture
async def node(control_plane: ControlPlane, namespace: str, short_tmp: Path) -> AsyncIterator[SimNode]:
    """A simulated node joined to the API server: its kubelet registers the Node, its agent publishes."""
    try:
        async with SimNode(
            NODE,
            short_tmp / "n1",
            ClusterPki(short_tmp / "pki"),
            kubeconfig=control_plane.kubeconfig,
            node_state_namespace=namespace,
            agent_settings={"power_interval_seconds": 0.5},
        ) as sim:
            yield sim
    finally:
        with control_plane.api_client() as api, contextlib.suppress(client.ApiException):
            client.CoreV1Api(api).delete_node(NODE)


async def test_agent_publishes_its_node_and_serves_metrics(
    control_plane: ControlPlane, namespace: str, node: SimNode
) -> None:
    with control_plane.api_client() as api:
        objects = client.CustomObjectsApi(api)

        def node_state() -> dict[str, Any]:
            obj: dict[str, Any] = objects.get_namespaced_custom_object(
                "intel.com", "v1alpha1", namespace, "rmdnodestates", f"rmd-node-state-{NODE}"
            )
            return obj

        def ready(obj: dict[str, Any]) -> str:
            return next(
                (c["status"] for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Ready"), ""
            )

        state = await eventually(
            lambda: (s := node_state()) and ready(s) == "True" and s, "a ready RmdNodeState"
        )
        assert state["status"]["endpoint"] == node.endpoint
        assert state["status"]["capabilities"]["rdtL3Cat"]["supported"] is True
        assert state["metadata"]["ownerReferences"][0]["kind"] == "Node"

        nrt = await eventually(
            lambda: objects.get_cluster_custom_object(
                "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies", NODE
            ),
            "the NodeResourceTopology",
        )
        assert [z["name"] for z in nrt["zones"]] == ["node-0", "node-1"]

        async with node.channel() as channel:
            await agent_pb2_grpc.AgentStub(channel).ApplyWorkload(
                agent_pb2.ApplyWorkloadRequest(
                    ref=agent_pb2.WorkloadRef(namespace=namespace, name="w1", uid="u1"),
                    spec=agent_pb2.WorkloadSpec(core_ids=["4-5"], cache=agent_pb2.CacheRequest(max=2, min=2)),
                ),
                timeout=10,
            )
        applied = time.monotonic()
        entry = await eventually(
            lambda: node_state().get("status", {}).get("workloads", {}).get("w1"),
            "the workload in RmdNodeState",
        )
        # Told by the engine, not found by a poll: well within the 5 s the writer used to poll at.
        assert time.monotonic() - applied < 2.0
        assert (entry["Core IDs"], entry["Cache Max"], entry["Status"]) == ("4-5", "2", "Successful")

        url = f"http://127.0.0.1:{node.http_port}/metrics"

        def sampled_metrics() -> str:  # empty until the first power sample is in
            text: str = urllib.request.urlopen(url, timeout=5).read().decode()
            return text if "rmd_node_energy_joules_total{" in text else ""

        metrics = await eventually(sampled_metrics, "power metrics")
        for name in (
            "rmd_node_energy_joules_total",
            "rmd_workload_cache_ways",
            "rmd_agent_grpc_server_handled_total",
        ):
            assert name in metrics, name

        await node.stop_agent(signal.SIGTERM)
        stopped = node_state()
        assert ready(stopped) == "False"
        assert "w1" in stopped["status"]["workloads"]  # kept for the operator's cleanup
