"""`rmd-agent probe` against simulated nodes (with a live simulated kubelet) and against this machine."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from rmd_agent.kubelet.pod_lookup import PodLookup
from rmd_agent.kubelet.podresources import PodResourcesClient
from rmd_agent.probe import format_table, probe_async
from rmd_agent.settings import AgentSettings
from rmd_sim.hosttree import write_host_tree
from rmd_sim.kubelet import ContainerSpec, SimKubelet
from rmd_sim.spec import NodeSpec

ALL_FEATURES = {
    "resctrlMounted",
    "rdtL3Cat",
    "mba",
    "numa",
    "l3Cache",
    "rapl",
    "cpufreq",
    "cgroup",
    "cpuManagerPolicy",
    "topologyManagerPolicy",
    "podResources",
    "podResourcesGet",
}


async def probe_tree(root: Path) -> dict[str, dict[str, object]]:
    report = await probe_async(AgentSettings(host_root=root, node_name="n1", kubelet_timeout_seconds=2.0))
    return report.as_dict()["features"]  # type: ignore[return-value]


@pytest.mark.parametrize("spec", [NodeSpec.default(), NodeSpec.large()], ids=["default", "large"])
async def test_simulated_node_supports_everything(short_tmp: Path, spec: NodeSpec) -> None:
    write_host_tree(spec, short_tmp)
    async with SimKubelet.from_host_tree(short_tmp):
        features = await probe_tree(short_tmp)
    assert set(features) == ALL_FEATURES
    unsupported = {name: f["detail"] for name, f in features.items() if not f["supported"]}
    assert unsupported == {}
    assert f"{spec.l3_ways} ways" in str(features["rdtL3Cat"]["detail"])
    assert f"{spec.numa_nodes} NUMA node(s), {spec.cpus} CPUs" == features["numa"]["detail"]
    assert features["podResourcesGet"]["detail"] == "pod lookups use Get"


# --- which PodResources API pod lookups use ---


async def test_kubelet_with_get_disabled_is_reported_with_its_answer(short_tmp: Path) -> None:
    write_host_tree(NodeSpec.default(), short_tmp)
    sim = SimKubelet.from_host_tree(short_tmp, get_enabled=False)
    async with sim:
        sim.add_pod("ns", "web", "uid-web", [ContainerSpec("app")])  # Get is asked for a listed pod
        features = await probe_tree(short_tmp)
        report = await probe_async(AgentSettings(host_root=short_tmp, node_name="n1"))
    assert features["podResources"]["supported"] is True
    assert features["podResourcesGet"]["supported"] is False
    detail = str(features["podResourcesGet"]["detail"])
    assert detail.startswith("pod lookups use List (Get disabled: PodResources API Get method disabled): ")
    assert "KubeletPodResourcesGet" in detail
    (row,) = [line for line in format_table(report).splitlines() if "podResourcesGet" in line]
    assert row.split()[:6] == ["podResourcesGet", "NO", "pod", "lookups", "use", "List"]


async def test_get_is_checked_with_a_missing_pod_when_none_is_listed(short_tmp: Path) -> None:
    # An empty kubelet: Get is asked for a pod that does not exist, "not found" shows it works.
    write_host_tree(NodeSpec.default(), short_tmp)
    for code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNKNOWN):
        async with SimKubelet.from_host_tree(short_tmp, not_found_code=code):
            features = await probe_tree(short_tmp)
        assert features["podResourcesGet"] == {"supported": True, "detail": "pod lookups use Get"}


async def test_the_agents_lookup_is_reported_without_asking_again(short_tmp: Path) -> None:
    write_host_tree(NodeSpec.default(), short_tmp)
    settings = AgentSettings(host_root=short_tmp, node_name="n1")
    sim = SimKubelet.from_host_tree(short_tmp, get_enabled=False)
    async with sim, PodResourcesClient(sim.socket_path) as client:
        lookup = PodLookup(client)
        first = (await probe_async(settings, lookup=lookup)).as_dict()["features"]
        assert first["podResourcesGet"]["supported"] is False  # type: ignore[index]
        assert lookup.api.describe() == "List (Get disabled: PodResources API Get method disabled)"
        # The kubelet gains Get: the probe repeats what the lookup knows (it only learns it by a lookup).
        sim.get_enabled = True
        again = (await probe_async(settings, lookup=lookup)).as_dict()["features"]
        assert again["podResourcesGet"] == first["podResourcesGet"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("changes", "feature", "reason"),
    [
        ({"resctrl_mounted": False}, "rdtL3Cat", "supports RDT but resctrl is not mounted"),
        ({"rdt": False, "resctrl_mounted": False}, "resctrlMounted", "no RDT allocation"),
        ({"mba": False}, "mba", "info/MB is absent"),
        ({"rapl_zones": ()}, "rapl", "no powercap in sysfs"),
        ({"cpufreq": False}, "cpufreq", "no cpufreq for CPU 0"),
        ({"cpu_manager_policy": "none"}, "cpuManagerPolicy", "pods get no exclusive CPUs"),
    ],
)
async def test_each_missing_feature_has_its_reason(
    short_tmp: Path, changes: dict[str, object], feature: str, reason: str
) -> None:
    write_host_tree(dataclasses.replace(NodeSpec.default(), **changes), short_tmp)
    features = await probe_tree(short_tmp)
    assert features[feature]["supported"] is False
    assert reason in str(features[feature]["detail"])
    # Everything that does not depend on the change is still found.
    assert features["numa"]["supported"] is True


async def test_kubelet_socket_without_server_is_reported(short_tmp: Path) -> None:
    write_host_tree(NodeSpec.default(), short_tmp)
    socket = short_tmp / "var/lib/kubelet/pod-resources/kubelet.sock"
    socket.touch()  # a stale socket file left by a kubelet that is gone
    features = await probe_tree(short_tmp)
    assert features["podResources"]["supported"] is False
    assert str(socket) in str(features["podResources"]["detail"])
    assert str(features["podResourcesGet"]["detail"]).startswith("not checked: ")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rmd_agent", *args], check=False, capture_output=True, text=True, timeout=60
    )


def test_cli_json_on_a_tree_without_kubelet(short_tmp: Path) -> None:
    write_host_tree(NodeSpec.default(), short_tmp)
    result = run_cli("probe", "--host-root", str(short_tmp), "--node-name", "worker-node-1", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["nodeName"] == "worker-node-1"
    assert set(document["features"]) == ALL_FEATURES
    assert document["features"]["rdtL3Cat"]["supported"] is True
    missing = (
        f"{short_tmp}/var/lib/kubelet/pod-resources/kubelet.sock does not exist "
        "(no kubelet on this node, or its pod-resources directory is not mounted)"
    )
    assert document["features"]["podResources"] == {"supported": False, "detail": missing}
    get = document["features"]["podResourcesGet"]
    assert get == {"supported": False, "detail": f"not checked: {missing}"}


def test_cli_on_this_machine_exits_zero_and_explains_every_gap() -> None:
    result = run_cli("probe")
    assert result.returncode == 0, result.stderr
    rows = [line.split(None, 2) for line in result.stdout.splitlines()[1:]]
    assert {row[0] for row in rows} == ALL_FEATURES
    for name, verdict, detail in rows:
        assert verdict in ("yes", "NO"), name
        assert detail.strip(), f"{name} has no detail"


def test_cli_bad_settings_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("no_such_setting: 1\n")
    result = run_cli("probe", "--config", str(config))
    assert result.returncode == 2
    assert "unknown setting(s): no_such_setting" in result.stderr
