"""Single-node acceptance cases (reference rmd-operator-and-rmd.md §7.4: 1, 2, 5, 7, 8, 9, 10, 13, 14) against
a real `rmd-agent serve` process on a simulated node, through real gRPC over mTLS, with the simulated kernel's
resctrl rules checked after every step; plus restart and foreign-group behaviour."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rmd_api.agent.v1 import agent_pb2, agent_pb2_grpc
from rmd_sim.node import ClusterPki, SimNode
from rmd_sim.spec import NodeSpec

DEADLINE = 10.0


@pytest.fixture
async def node(short_tmp: Path) -> AsyncIterator[SimNode]:
    async with SimNode("worker-node-1", short_tmp / "n1", ClusterPki(short_tmp / "pki")) as sim:
        yield sim


@pytest.fixture
async def agent(node: SimNode) -> AsyncIterator[Any]:
    async with node.channel() as channel:
        yield agent_pb2_grpc.AgentStub(channel)


def request(name: str, **spec: Any) -> agent_pb2.ApplyWorkloadRequest:
    return agent_pb2.ApplyWorkloadRequest(
        ref=agent_pb2.WorkloadRef(namespace="default", name=name, uid=f"uid-{name}"),
        spec=agent_pb2.WorkloadSpec(**spec),
    )


def cache(max_ways: int, min_ways: int) -> agent_pb2.CacheRequest:
    return agent_pb2.CacheRequest(max=max_ways, min=min_ways)


async def apply(agent: Any, node: SimNode, name: str, **spec: Any) -> agent_pb2.Workload:
    response = await agent.ApplyWorkload(request(name, **spec), timeout=DEADLINE)
    assert node.check_resctrl() == []
    return response.workload


async def refused(agent: Any, node: SimNode, name: str, **spec: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await agent.ApplyWorkload(request(name, **spec), timeout=DEADLINE)
    assert node.check_resctrl() == []
    return info.value


def group(node: SimNode, name: str) -> Path:
    return node.mount.backing_root / "sys/fs/resctrl" / name


def l3_masks(node: SimNode, name: str) -> dict[int, int]:
    line = next(
        ln for ln in (group(node, name) / "schemata").read_text().splitlines() if ln.strip().startswith("L3")
    )
    return {int(d): int(m, 16) for d, m in (item.split("=") for item in line.split(":", 1)[1].split(";"))}


def contiguous(mask: int) -> bool:
    run = mask >> ((mask & -mask).bit_length() - 1)  # shift out the trailing zeros
    return mask != 0 and run & (run + 1) == 0


async def test_guaranteed_cache_on_explicit_cores(agent: Any, node: SimNode) -> None:  # case 1 (and 13)
    w = await apply(agent, node, "gold", core_ids=["2-3"], cache=cache(2, 2))
    assert (w.status, w.pool, list(w.cpus)) == ("Successful", "guaranteed", [2, 3])
    assert (group(node, w.cos_name) / "cpus_list").read_text().strip() == "2-3"
    masks = l3_masks(node, w.cos_name)
    assert masks[0].bit_count() == 2 and contiguous(masks[0])  # CPUs 2-3 sit on cache id 0
    root = l3_masks(node, "")
    assert root[0] & masks[0] == 0  # case 13: the OS group never overlaps guaranteed ways
    again = await agent.ApplyWorkload(request("gold", core_ids=["2-3"], cache=cache(2, 2)), timeout=DEADLINE)
    assert again.changed is False


async def test_overlapping_cores_conflict_and_leave_the_first_alone(agent: Any, node: SimNode) -> None:  # 2
    first = await apply(agent, node, "a", core_ids=["4-5"], cache=cache(2, 2))
    before = (group(node, first.cos_name) / "schemata").read_text()
    error = await refused(agent, node, "b", core_ids=["5-6"], cache=cache(1, 1))
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "CPU 5 is already assigned to workload default/a" in (error.details() or "")
    assert (group(node, first.cos_name) / "schemata").read_text() == before


async def test_a_conflict_with_another_namespace_names_the_holder_in_the_log_only(
    agent: Any, node: SimNode
) -> None:
    """The caller's message ends up in team-b's RmdWorkload status and Events, readable by whoever may read
    that workload; the holder in another namespace is named in the agent's log only."""
    await apply(agent, node, "overlap-a", core_ids=["4-5"], cache=cache(2, 2))
    team_b = request("b", core_ids=["5-6"], cache=cache(1, 1))
    team_b.ref.namespace = "team-b"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await agent.ApplyWorkload(team_b, timeout=DEADLINE)
    details = info.value.details() or ""
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert details.startswith("CPU 5 is already assigned to a workload in another namespace")
    assert "default" not in details and "overlap-a" not in details
    logged = [line for line in node.log_path.read_text().splitlines() if "team-b/b" in line]
    assert any("CPU 5 is already assigned to workload default/overlap-a" in line for line in logged)
    assert node.check_resctrl() == []


async def test_all_cores_minus_reserved(agent: Any, node: SimNode) -> None:  # 5
    w = await apply(
        agent, node, "all", all_cores=True, reserved_core_ids=["0-11", "32-63"], cache=cache(0, 0)
    )
    assert set(w.cpus) == set(range(12, 32))
    assert w.pool == "shared"


@pytest.mark.parametrize(
    ("ways", "pool"), [((3, 3), "guaranteed"), ((3, 1), "besteffort"), ((0, 0), "shared")]
)
async def test_pool_from_max_and_min(
    agent: Any, node: SimNode, ways: tuple[int, int], pool: str
) -> None:  # 7
    assert (await apply(agent, node, "w", core_ids=["6"], cache=cache(*ways))).pool == pool


async def test_max_without_min_is_invalid(agent: Any, node: SimNode) -> None:  # 7
    error = await refused(agent, node, "w", core_ids=["6"], cache=cache(2, 0))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "max=2 with min=0" in (error.details() or "")


async def test_mba_only_with_guaranteed_cache(agent: Any, node: SimNode) -> None:  # 8
    ok = await apply(
        agent, node, "m", core_ids=["7"], cache=cache(1, 1), mba=agent_pb2.MbaRequest(percentage=50)
    )
    assert dict(ok.mba)[0] == 50
    error = await refused(
        agent, node, "be", core_ids=["8"], cache=cache(2, 1), mba=agent_pb2.MbaRequest(percentage=50)
    )
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    mbps = await refused(
        agent, node, "mbps", core_ids=["9"], cache=cache(1, 1), mba=agent_pb2.MbaRequest(mbps=100)
    )
    assert "MBps" in (mbps.details() or "") or "percent" in (mbps.details() or "").lower()


async def test_policies_and_unknown_policy(agent: Any, node: SimNode) -> None:  # 9
    gold = await apply(agent, node, "g", core_ids=["10"], policy="gold")
    assert gold.pool == "guaranteed"
    error = await refused(agent, node, "x", core_ids=["11"], policy="platinum")
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "platinum" in (error.details() or "")


async def test_guaranteed_exhaustion_then_freeing_lets_the_next_in(agent: Any, node: SimNode) -> None:  # 10
    placed = []
    for i in range(20):  # far more than the guaranteed pool of cache id 0 holds
        try:
            placed.append(await apply(agent, node, f"g{i}", core_ids=[str(12 + i)], cache=cache(2, 2)))
        except grpc.aio.AioRpcError as error:
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "not enough guaranteed cache on cache id 0" in (error.details() or "")
            break
    else:
        pytest.fail("the guaranteed pool never ran out")
    assert placed
    last = len(placed)
    await agent.RemoveWorkload(agent_pb2.RemoveWorkloadRequest(ref=placed[0].ref), timeout=DEADLINE)
    assert node.check_resctrl() == []
    await apply(agent, node, f"g{last}", core_ids=[str(12 + last)], cache=cache(2, 2))


async def test_min_cbm_bits_is_honoured(short_tmp: Path) -> None:  # 14
    spec = NodeSpec(min_cbm_bits=2)
    async with (
        SimNode("n2", short_tmp / "n2", ClusterPki(short_tmp / "pki2"), spec=spec) as node,
        node.channel() as channel,
    ):
        stub = agent_pb2_grpc.AgentStub(channel)
        error = await refused(stub, node, "one-way", core_ids=["3"], cache=cache(1, 1))
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "min_cbm_bits" in (error.details() or "") or "at least 2" in (error.details() or "")
        w = await apply(stub, node, "two-ways", core_ids=["3"], cache=cache(2, 2))
        assert all(m.bit_count() >= 2 for m in l3_masks(node, w.cos_name).values())


async def test_crash_and_restart_keep_the_node_as_it_was(
    agent: Any, node: SimNode
) -> None:  # 12, single node
    w = await apply(agent, node, "keep", core_ids=["20-21"], cache=cache(2, 2))
    foreign = group(node, "") / "someone-else"
    (node.root / "sys/fs/resctrl/someone-else").mkdir()  # another tool's group, through the "kernel"
    foreign_before = (foreign / "schemata").read_text(), (foreign / "cpus_list").read_text()
    schemata_before = (group(node, w.cos_name) / "schemata").read_text()
    await node.stop_agent(signal.SIGKILL)
    await node.start_agent()
    async with node.channel() as channel:
        listed = await agent_pb2_grpc.AgentStub(channel).ListWorkloads(
            agent_pb2.ListWorkloadsRequest(), timeout=DEADLINE
        )
    assert [(x.ref.name, x.status, x.cos_name) for x in listed.workloads] == [
        ("keep", "Successful", w.cos_name)
    ]
    assert (group(node, w.cos_name) / "schemata").read_text() == schemata_before
    assert ((foreign / "schemata").read_text(), (foreign / "cpus_list").read_text()) == foreign_before
    assert node.check_resctrl() == []


async def test_get_node_and_container_cpus(agent: Any, node: SimNode) -> None:
    info = await agent.GetNode(agent_pb2.GetNodeRequest(), timeout=DEADLINE)
    assert (info.node_name, info.cpus, info.numa_nodes) == ("worker-node-1", 64, 2)
    assert info.capabilities["rdtL3Cat"].supported
    assert node.kubelet is not None
    node.kubelet.add_pod("default", "p", "pod-uid", [("app", "2", "2", "1Gi")])
    cpus = await agent.GetContainerCpus(
        agent_pb2.GetContainerCpusRequest(
            pod_namespace="default", pod_name="p", pod_uid="pod-uid", container="app"
        ),
        timeout=DEADLINE,
    )
    assert cpus.state == agent_pb2.GetContainerCpusResponse.ALLOCATED and len(cpus.cpus) == 2
    missing = await agent.GetContainerCpus(
        agent_pb2.GetContainerCpusRequest(pod_namespace="other", pod_name="p", pod_uid="x", container="app"),
        timeout=DEADLINE,
    )
    assert missing.state == agent_pb2.GetContainerCpusResponse.NOT_YET_ALLOCATED
