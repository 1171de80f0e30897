"""#13 item 5, end to end on a simulated node: an MBA request the kernel rounds is reported as the value the
group's schemata holds, with the request and a note that it was rounded, in the RmdWorkload status entry
(agent engine -> gRPC -> the operator's client and status) and in the RmdNodeState entry.

The node is the simulator's default: info/MB min_bandwidth 10, bandwidth_gran 10, a FUSE-mounted resctrl
whose kernel model rounds percentages up by itself."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rmd_agent.engine import NodeEngine
from rmd_agent.node_state import workloads_map
from rmd_agent.server.app import AgentServer
from rmd_agent.settings import AgentSettings
from rmd_api.agent.v1 import agent_pb2
from rmd_api.workload_spec import parse_spec
from rmd_operator import status as st
from rmd_operator.agent_client import AgentClients
from rmd_operator.settings import OperatorSettings
from rmd_sim.hosttree import write_host_tree
from rmd_sim.resctrl import parse_schemata_text
from rmd_sim.resctrl_fuse import ResctrlMount
from rmd_sim.spec import NodeSpec

SPEC = NodeSpec.default()
SOCKET1 = sorted(SPEC.cpus_of_socket(1))  # L3 (and MB) domain 1
NODE = "node-1"
ROUNDED = "MBA 15% rounded up to 20%: the node's MBA step (bandwidth_gran) is 10%"


@dataclasses.dataclass
class Agent:
    """A real engine on a simulated node behind a real gRPC server, and the operator's client of it."""

    mount: ResctrlMount
    engine: NodeEngine
    server: AgentServer
    clients: AgentClients

    async def apply(self, name: str, cpu: int, rdt: dict[str, Any]) -> agent_pb2.Workload:
        spec = parse_spec({"coreIds": [str(cpu)], "rdt": rdt, "nodes": [NODE]})
        ref = agent_pb2.WorkloadRef(namespace="default", name=name, uid=f"uid-{name}")
        workload, _ = await self.clients.apply(NODE, f"127.0.0.1:{self.server.grpc_port}", ref, spec)
        return workload

    def held(self, group: str) -> dict[int, int]:
        """The MB line of `group` as the (simulated) kernel holds it."""
        schemata = parse_schemata_text(self.mount.sim.read(f"{group}/schemata"))
        return {d: int(v) for d, v in schemata["MB"].items()}


@pytest.fixture
def mounts(short_tmp: Path, fuse_ok: None) -> Iterator[Callable[[NodeSpec], tuple[Path, ResctrlMount]]]:
    numbers = itertools.count()
    with contextlib.ExitStack() as stack:

        def mount(spec: NodeSpec) -> tuple[Path, ResctrlMount]:
            host = short_tmp / f"h{next(numbers)}"
            write_host_tree(spec, host)
            return host, stack.enter_context(ResctrlMount(host))

        yield mount


@pytest.fixture
async def start_agent(
    mounts: Callable[[NodeSpec], tuple[Path, ResctrlMount]],
) -> AsyncIterator[Callable[[NodeSpec], Any]]:
    """Starts agents and stops them (engine included) before the mounts go."""
    started: list[Agent] = []

    async def start(spec: NodeSpec) -> Agent:
        host, mount = mounts(spec)
        settings = AgentSettings(
            node_name=NODE,
            host_root=host,
            pstate_counters="files",
            insecure=True,
            grpc_listen="127.0.0.1:0",
            http_listen="127.0.0.1:0",
            shutdown_grace_seconds=1.0,
        )
        engine = NodeEngine(settings)
        server = AgentServer(settings, engine)
        await server.start()
        clients = AgentClients(OperatorSettings(insecure_agents=True), None)
        started.append(Agent(mount, engine, server, clients))
        return started[-1]

    yield start
    for agent in started:
        await agent.clients.close()
        await agent.server.stop()


async def test_a_percentage_the_kernel_rounds_is_reported_as_applied_and_rounded(start_agent: Any) -> None:
    agent = await start_agent(SPEC)
    assert (SPEC.mba_min_bandwidth, SPEC.mba_bandwidth_gran) == (10, 10)
    workload = await agent.apply("w", SOCKET1[2], {"cache": {"max": 2, "min": 2}, "mba": {"percentage": 15}})

    assert agent.held(workload.cos_name) == {0: 100, 1: 20}  # what the kernel holds: MB:0=100;1=20
    entry = st.entry(st.applied(workload))
    assert entry["status"] == "Successful"
    assert entry["rdt"]["mba"] == {"percentage": 15, "applied": 20, "rounded": True, "message": ROUNDED}
    event = st.mba_rounded_event(NODE, workload)
    assert event is not None and event.message == f"node {NODE}: {ROUNDED}"

    node_state = workloads_map(await agent.engine.list())["w"]
    assert {k: v for k, v in node_state.items() if k.startswith("MBA")} == {
        "MBA Percentage": "15",
        "MBA Applied": "20",
        "MBA Rounded": "true",
        "MBA Message": ROUNDED,
    }

    # A value on a step is reported as applied unrounded, and ListWorkloads says the same as ApplyWorkload.
    exact = await agent.apply("x", SOCKET1[3], {"cache": {"max": 2, "min": 2}, "mba": {"percentage": 40}})
    assert agent.held(exact.cos_name)[1] == 40
    assert st.entry(st.applied(exact))["rdt"]["mba"] == {"percentage": 40, "applied": 40, "rounded": False}
    endpoint = f"127.0.0.1:{agent.server.grpc_port}"
    listed = {w.ref.name: w for w in await agent.clients.list_workloads(NODE, endpoint)}
    assert listed["w"].mba_applied == workload.mba_applied and listed["x"].mba_applied == exact.mba_applied


async def test_mbps_are_never_rounded(start_agent: Any) -> None:
    """With resctrl mounted -o mba_MBps the kernel takes the value as given: reported as not rounded."""
    agent = await start_agent(dataclasses.replace(SPEC, mba_mbps=True))
    workload = await agent.apply("w", SOCKET1[2], {"cache": {"max": 2, "min": 2}, "mba": {"mbps": 2505}})
    assert agent.held(workload.cos_name)[1] == 2505
    assert st.entry(st.applied(workload))["rdt"]["mba"] == {"mbps": 2505, "applied": 2505, "rounded": False}
    assert st.mba_rounded_event(NODE, workload) is None
    node_state = workloads_map(await agent.engine.list())["w"]
    assert {k: v for k, v in node_state.items() if k.startswith("MBA")} == {
        "MBA Mbps": "2505",
        "MBA Applied": "2505",
        "MBA Rounded": "false",
    }
