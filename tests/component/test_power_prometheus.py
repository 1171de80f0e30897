"""A real Prometheus server scrapes agents' power metrics on simulated nodes under simulated load.

Three simulated nodes, each with its own sampler, collectors and /metrics endpoint on loopback:
  A  cgroup v2 / systemd, RAPL package+core+dram; socket 0's package counter wraps during the test;
     one pod ends mid-run (its final energy must reach Prometheus once), plus an RDT workload with
     resctrl monitoring.
  B  cgroup v1 / cgroupfs, CRI-O and docker pods.
  C  no RAPL at all: reported as a metric with the reason, nothing else breaks.
Debian's prometheus (installed by ./dev) runs with a throw-away config and data directory. PromQL over pod
energy must match the simulated load's exact figures within 1%, and every dashboard query must answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rmd_agent.engine_api import AppliedWorkload
from rmd_agent.hostfs import HostFS
from rmd_agent.metrics.power_collector import PowerCollector
from rmd_agent.metrics.rdt_collector import RdtCollector
from rmd_agent.plan.workload import Workload
from rmd_agent.power.sampler import PowerSampler
from rmd_agent.server.http_endpoints import HealthHttpServer
from rmd_operator.telemetry import catalog as operator_catalog
from rmd_sim.hosttree import MAX_ENERGY_RANGE_UJ, write_host_tree
from rmd_sim.load import SimLoad
from rmd_sim.spec import NodeSpec

PROMETHEUS = "/usr/bin/prometheus"
DASHBOARD = Path(__file__).resolve().parents[2] / "charts/rmd/dashboards/rmd.json"
SIM_STEP = 1.0  # simulated seconds per load step
REAL_STEP = 0.04  # real seconds between load steps (25x faster than real time)
STEPS = 150
SAMPLE_INTERVAL = 0.1  # real seconds between samples
GOLD_WAYS = 0b1111 << 7  # 4 ways

pytestmark = pytest.mark.timeout(180)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class SimNode:
    name: str
    root: Path
    load: SimLoad
    sampler: PowerSampler
    registry: CollectorRegistry
    rdt: RdtCollector | None = None
    port: int = 0
    pods: dict[str, str] = field(default_factory=dict)  # pod name -> uid

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.port}"


def make_node(name: str, root: Path, spec: NodeSpec, start_energy: dict[str, int] | None = None) -> SimNode:
    write_host_tree(spec, root)
    load = SimLoad(root, start_energy_uj=start_energy)
    sampler = PowerSampler(
        HostFS(root), interval=SAMPLE_INTERVAL, clock=lambda: load.now, meta_grace_seconds=0
    )
    registry = CollectorRegistry()
    registry.register(PowerCollector(sampler))
    return SimNode(name, root, load, sampler, registry)


@pytest.fixture
def tmp_root() -> Iterator[Path]:
    parent = "/dev/shm" if Path("/dev/shm").is_dir() else None
    root = Path(tempfile.mkdtemp(prefix="rmd-prom-", dir=parent))
    yield root
    shutil.rmtree(root, ignore_errors=True)


class Prometheus:
    def __init__(self, workdir: Path, targets: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "rmd-agent", "static_configs": [{"targets": targets}]}],
        }
        (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.log = (workdir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read()) if path.startswith("/api/") else response.read()

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}; see {self.log.name}")
            with contextlib.suppress(OSError):
                self.get("/-/ready")
                return
            time.sleep(0.2)
        raise TimeoutError("prometheus did not become ready")

    def query(self, promql: str) -> list[dict[str, Any]]:
        answer = self.get("/api/v1/query", query=promql)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def value(self, promql: str) -> float:
        result = self.query(promql)
        assert len(result) == 1, (promql, result)
        return float(result[0]["value"][1])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture
def prometheus_binary() -> str:
    if not os.path.exists(PROMETHEUS):
        if os.environ.get("CI"):
            pytest.fail(f"{PROMETHEUS} is missing; ./dev installs Debian's prometheus package")
        pytest.skip(f"{PROMETHEUS} is not installed (./dev setup installs it)")
    return PROMETHEUS


@contextlib.asynccontextmanager
async def serving(nodes: list[SimNode]) -> AsyncIterator[None]:
    """Each node's registry on its own loopback port, served by the agent's /metrics endpoint (so
    Prometheus parses the text the agent writes); samplers (and RDT refreshers) running as tasks."""

    async def ready() -> tuple[bool, str]:
        return True, ""

    servers: list[HealthHttpServer] = []
    stop = asyncio.Event()
    tasks = []
    try:
        for node in nodes:
            server = HealthHttpServer(node.registry, ready)
            servers.append(server)
            node.port = await server.start("127.0.0.1:0")
            tasks.append(asyncio.create_task(node.sampler.run(stop)))
            if node.rdt is not None:
                tasks.append(asyncio.create_task(node.rdt.run(SAMPLE_INTERVAL, stop)))
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        for server in servers:
            await server.close()


async def wait_for_sample(node: SimNode, limit: float = 10.0) -> None:
    """Until the node's sampler has taken a sample after this point (the load is not advancing)."""
    seq = node.sampler.snapshot().seq
    for _ in range(int(limit / 0.01)):
        if node.sampler.snapshot().seq > seq:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"no power sample on {node.name} within {limit}s")


async def wait_until_scraped(prom: Prometheus, node: SimNode, deadline: float = 30.0) -> None:
    """Until Prometheus holds a scrape of a snapshot whose whole interval lies after the load stopped: the
    first sample after the stop may have begun reading before the last advance (its power is the load's; a
    CI run failed on that), the second cannot."""
    await wait_for_sample(node)
    await wait_for_sample(node)
    wanted = node.sampler.snapshot().seq
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        result = await asyncio.to_thread(
            prom.query, f'rmd_agent_power_samples_total{{instance="{node.instance}"}}'
        )
        if result and float(result[0]["value"][1]) >= wanted:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"prometheus did not scrape {node.name} after the load stopped")


async def wait_until_up(prom: Prometheus, targets: int, limit: float = 30.0) -> None:
    """Until Prometheus has scraped every target once, so the load runs under watch from its start."""
    for _ in range(int(limit / 0.2)):
        if len(await asyncio.to_thread(prom.query, "up == 1")) == targets:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("prometheus did not scrape every agent")


def dashboard_queries() -> list[str]:
    """The dashboard's queries of the agents' metrics (the node-telemetry row queries the operator's, which no
    agent here exports: tests/e2e/test_node_telemetry.py scrapes those)."""
    dashboard = json.loads(DASHBOARD.read_text())
    operators = {m.name for m in operator_catalog.METRICS}
    exprs = [
        t["expr"]
        for p in dashboard["panels"]
        for t in p.get("targets", [])
        if not operators & set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", t["expr"]))
    ]
    values = {
        "$__rate_interval": "15s",
        "$__range": "5m",
        "$instance": ".*",
        "$namespace": ".*",
        "$zone": "package",
    }
    for name, value in values.items():
        exprs = [e.replace(name, value) for e in exprs]
    return exprs


async def test_prometheus_scrapes_pod_energy_within_one_percent(
    prometheus_binary: str, tmp_root: Path
) -> None:
    small = {"cores_per_socket": 8}  # 32 CPUs keep the trees small
    # A: the package counter of socket 0 is 5 kJ below its wrap; it passes it around step 90
    node_a = make_node(
        "a",
        tmp_root / "a",
        NodeSpec(rapl_zones=("package", "core", "dram"), **small),  # type: ignore[arg-type]
        start_energy={"intel-rapl:0": MAX_ENERGY_RANGE_UJ - 5_000_000_000},
    )
    node_b = make_node(
        "b",
        tmp_root / "b",
        NodeSpec(cgroup_version=1, cgroup_driver="cgroupfs", **small),  # type: ignore[arg-type]
    )
    node_c = make_node("c", tmp_root / "c", NodeSpec(rapl_zones=(), **small))  # type: ignore[arg-type]
    for node, pods in (
        (node_a, [("shop", "web", {"app": 3.0, "proxy": 0.5}, "burstable", "containerd"),
                  ("shop", "db", {"postgres": 6.0}, "guaranteed", "containerd"),
                  ("jobs", "gone", {"work": 2.0}, "besteffort", "containerd")]),
        (node_b, [("shop", "cache", {"redis": 2.5}, "burstable", "crio"),
                  ("jobs", "batch", {"work": 4.0}, "besteffort", "docker")]),
        (node_c, [("shop", "api", {"app": 1.0}, "burstable", "containerd")]),
    ):  # fmt: skip
        for namespace, name, containers, qos, runtime in pods:
            uid = str(uuid.uuid4())
            node.load.add_pod(namespace, name, uid, containers, qos=qos, runtime=runtime)
            node.pods[name] = uid
    # an RDT workload on A whose resctrl group has monitoring data
    gold = AppliedWorkload(Workload("shop", "gold", core_ids=frozenset({2, 3})), "w1", "gold", "guaranteed",
                           cache={0: GOLD_WAYS, 1: GOLD_WAYS})  # fmt: skip
    node_a.load.monitor_group("gold", llc_occupancy=3 * 1024 * 1024, mbm_total_bps=2e9, mbm_local_bps=1.5e9)

    async def workloads() -> list[AppliedWorkload]:
        return [gold]

    node_a.rdt = RdtCollector(HostFS(node_a.root), workloads)
    node_a.registry.register(node_a.rdt)
    nodes = [node_a, node_b, node_c]

    async with serving(nodes):
        prom = Prometheus(tmp_root, [n.instance for n in nodes])
        try:
            await asyncio.to_thread(prom.wait_ready)
            await wait_until_up(prom, len(nodes))
            gone_final = web_watts = 0.0
            for step in range(STEPS):
                if step == STEPS // 2:
                    # end "gone" right after a sample: no CPU time falls between its last sample and its end
                    await wait_for_sample(node_a)
                    gone_final = node_a.load.expected_pod_joules(node_a.pods["gone"], "package")
                    web_watts = package_watts(node_a) * 3.5 / node_a.load.spec.cpus
                    node_a.load.remove_pod(node_a.pods["gone"])
                for node in nodes:
                    node.load.advance(SIM_STEP)
                await asyncio.sleep(REAL_STEP)
            for node in nodes:
                await wait_until_scraped(prom, node)
            await asyncio.to_thread(
                functools.partial(check_results, gone_final=gone_final, web_watts=web_watts),
                prom,
                (node_a, node_b, node_c),
            )
        finally:
            prom.stop()


def package_watts(node: SimNode) -> float:
    """The node's package power (both sockets) at the load's current rates."""
    sockets = node.load.spec.sockets
    return node.load.model.zone_watts("package", node.load.busy_cpus / sockets) * sockets


def check_results(
    prom: Prometheus, nodes: tuple[SimNode, SimNode, SimNode], *, gone_final: float, web_watts: float
) -> None:
    a, b, c = nodes
    assert a.load.wraps["intel-rapl:0"] == 1, "the test is meant to cross a RAPL wraparound"
    # pod energy per pod, against the load's exact figures
    for node in (a, b):
        for name, uid in node.pods.items():
            if name == "gone":
                continue
            for zone in ("package", "dram"):
                sel = f'instance="{node.instance}", uid="{uid}", zone="{zone}"'
                got = prom.value(f"sum(rmd_pod_energy_joules_total{{{sel}}})")
                expected = node.load.expected_pod_joules(uid, zone)
                assert got == pytest.approx(expected, rel=0.01), (node.name, name, zone)
    # names come from the kubelet's log layout; a namespace total is the sum of its pods
    shop = prom.value(
        f'sum(rmd_pod_energy_joules_total{{instance="{a.instance}", namespace="shop", zone="package"}})'
    )
    expected_shop = sum(a.load.expected_pod_joules(a.pods[n], "package") for n in ("web", "db"))
    assert shop == pytest.approx(expected_shop, rel=0.01)
    proxy = prom.value('rmd_container_energy_joules_total{pod="web", container="proxy", zone="package"}')
    assert proxy == pytest.approx(
        a.load.expected_container_joules(a.pods["web"], "proxy", "package"), rel=0.01
    )
    # the ended pod: its final energy reached Prometheus once, and its series is gone now
    last = prom.value('last_over_time(rmd_pod_energy_joules_total{pod="gone", zone="package"}[10m])')
    assert last == pytest.approx(gone_final, rel=0.01)
    assert prom.query('rmd_pod_energy_joules_total{pod="gone"}') == []
    # node energy through the wrap, and conservation in PromQL: pods + system = active
    node_pkg = prom.value(f'sum(rmd_node_energy_joules_total{{instance="{a.instance}", zone="package"}})')
    assert node_pkg == pytest.approx(a.load.zone_joules("package"), rel=0.01)
    for node in (a, b):
        sel = f'instance="{node.instance}", zone="package"'
        parts = prom.value(
            f"sum(rmd_pod_energy_joules_total{{{sel}}}) + sum(rmd_system_energy_joules_total{{{sel}}})"
        )
        active = prom.value(f"sum(rmd_node_active_energy_joules_total{{{sel}}})")
        # "gone" left the pod series but its energy stays in the node's active energy
        gone = gone_final if node is a else 0.0
        assert parts + gone == pytest.approx(active, rel=1e-6)
    # power gauges, in simulated watts: pod = zone power * pod CPUs / node CPUs. The highest value is from
    # an interval before "gone" ended (more load, more power); the load has stopped now, so power is 0.
    peak = prom.value(f'max_over_time(rmd_pod_power_watts{{uid="{a.pods["web"]}", zone="package"}}[10m])')
    assert peak == pytest.approx(web_watts, rel=0.01)
    assert prom.value(f'rmd_pod_power_watts{{uid="{a.pods["web"]}", zone="package"}}') == 0.0
    # the node without RAPL says why, and exports no energy
    rapl = prom.query(f'rmd_rapl_available{{instance="{c.instance}"}}')
    assert len(rapl) == 1 and rapl[0]["value"][1] == "0"
    assert re.search("no powercap", rapl[0]["metric"]["reason"])
    assert prom.query(f'rmd_pod_energy_joules_total{{instance="{c.instance}"}}') == []
    assert prom.value(f'rmd_rapl_available{{instance="{a.instance}"}}') == 1.0
    # RDT figures of the workload
    assert prom.value('sum(rmd_workload_cache_ways{workload="gold"})') == 8.0
    assert prom.value('max(rmd_workload_llc_occupancy_bytes{workload="gold"})') == 3 * 1024 * 1024
    # every dashboard query answers with data from these agents
    for expr in dashboard_queries():
        assert prom.query(expr), f"dashboard query returned nothing: {expr}"
