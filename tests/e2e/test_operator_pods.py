"""The pod flow end to end (acceptance case 11): pods asking for `intel.com/l3_cache_ways` on a simulated
cluster get their RmdWorkloads, enforced in the nodes' resctrl, and lose them with the pod.

One SimCluster for the module: a real control plane with the real kube-scheduler (pods are scheduled, not
bound by hand), garbage collector, namespace, Deployment and ReplicaSet controllers; three simulated nodes,
each with a simulated kubelet joined to the API server (static CPU manager, topology manager policy
single-numa-node, the agents' cache-ways device plugin) and a real `rmd-agent serve`; and the real
`rmd-operator run` process. Nothing is mocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rmd_api.agent.v1 import agent_pb2, agent_pb2_grpc
from rmd_api.cpuset import parse_cpu_list
from rmd_sim.cluster import SYSTEM_NAMESPACE, SimCluster
from rmd_sim.control_plane import BinariesNotFound, find_bin_dir, repo_root
from rmd_sim.node import SimNode

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

GROUP, VERSION, WORKLOADS = "intel.com", "v1alpha1", "rmdworkloads"
WAYS = "intel.com/l3_cache_ways"
WAIT = 60.0
FAST = {
    "drift_interval_seconds": 2,
    "retry_initial_seconds": 0.5,
    "retry_max_seconds": 2,
    "agent_call_timeout_seconds": 5,
    "watch_timeout_seconds": 30,
}
SAMPLE = repo_root().parent / "shared" / "samples" / "pod-guaranteed-cache.yaml"
# The same pod as rmd-operator's sample, for checkouts without the shared samples.
SAMPLE_FALLBACK = """
apiVersion: v1
kind: Pod
metadata:
  generateName: guaranteed-cache-pod-
  labels: {name: nginx}
  annotations: {nginx1_cache_min: "2"}
spec:
  containers:
  - name: nginx1
    image: nginx
    resources:
      requests: {memory: "64Mi", cpu: 3, intel.com/l3_cache_ways: 2}
      limits: {memory: "64Mi", cpu: 3, intel.com/l3_cache_ways: 2}
"""
Obj = dict[str, Any]


# -- the cluster ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    parent = "/dev/shm" if Path("/dev/shm").is_dir() else None  # short paths for unix sockets
    root = Path(tempfile.mkdtemp(prefix="rmd-pods-", dir=parent))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(workdir: Path) -> AsyncIterator[SimCluster]:
    try:
        find_bin_dir()
    except BinariesNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so the e2e control plane is required: {exc}", pytrace=False)
        pytest.skip(f"e2e control plane unavailable: {exc}")
    async with SimCluster(workdir, operator_settings=FAST) as sim:
        yield sim


@pytest.fixture
def api(cluster: SimCluster) -> Iterator[Any]:
    with cluster.api_client() as api_client:
        yield api_client


@pytest.fixture
def new_namespace(api: Any) -> Iterator[Callable[[], str]]:
    """Make fresh namespaces (their default ServiceAccount in place); all deleted after the test."""
    core: Any = client.CoreV1Api(api)  # the client's own annotations are partial
    made: list[str] = []

    def make() -> str:
        created = core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(generate_name="pods-"))
        )
        name = str(created.metadata.name)
        made.append(name)
        deadline = time.monotonic() + 30
        while True:  # pods are refused until the ServiceAccount controller made "default"
            try:
                core.read_namespaced_service_account("default", name)
                return name
            except ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    yield make
    for name in made:
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


# -- helpers -------------------------------------------------------------------------------------------------


async def eventually(cluster: SimCluster, probe: Callable[[], Any], what: str, within: float = WAIT) -> Any:
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await asyncio.to_thread(probe)
        except ApiException as exc:
            if exc.status != 404:
                raise
            last = None
        if last:
            return last
        await asyncio.sleep(0.25)
    pytest.fail(
        f"timed out waiting for {what}; last seen: {last!r}\noperator log:\n{cluster.operator_log_tail()}"
    )


def guaranteed_container(name: str, cpus: int, ways: int) -> Obj:
    limits = {"cpu": str(cpus), "memory": "64Mi", WAYS: str(ways)}
    return {"name": name, "image": "nginx", "resources": {"requests": limits, "limits": limits}}


def pod_body(name: str, *containers: Obj, annotations: dict[str, str] | None = None, node: str = "") -> Obj:
    spec: Obj = {"containers": list(containers)}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}  # still placed by the scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }


def core_api(api: Any) -> Any:
    return client.CoreV1Api(api)  # Any: the client's own annotations are partial


def objects_api(api: Any) -> Any:
    return client.CustomObjectsApi(api)


def create_pod(api: Any, namespace: str, body: Obj) -> str:
    created = core_api(api).create_namespaced_pod(namespace, body)
    return str(created.metadata.name)


def read_pod(api: Any, namespace: str, name: str) -> Obj:
    response = core_api(api).read_namespaced_pod(name, namespace, _preload_content=False)
    return dict(yaml.safe_load(response.data))


def read_workload(api: Any, namespace: str, name: str) -> Obj:
    obj: Obj = objects_api(api).get_namespaced_custom_object(GROUP, VERSION, namespace, WORKLOADS, name)
    return obj


def list_workloads(api: Any, namespace: str) -> list[Obj]:
    listed = objects_api(api).list_namespaced_custom_object(GROUP, VERSION, namespace, WORKLOADS)
    return list(listed["items"])


def events_of(api: Any, namespace: str, name: str) -> list[Any]:
    listed = core_api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return list(listed.items)


def event_with(api: Any, namespace: str, name: str, reason: str) -> Any:
    return next((e for e in events_of(api, namespace, name) if e.reason == reason), None)


async def running(cluster: SimCluster, api: Any, namespace: str, name: str) -> Obj:
    pod: Obj = await eventually(
        cluster,
        lambda: (p := read_pod(api, namespace, name)).get("status", {}).get("phase") == "Running" and p,
        f"pod {namespace}/{name} Running",
    )
    return pod


def node_entry(workload: Obj, node: str) -> Obj | None:
    status = workload.get("status") or {}
    if status.get("observedGeneration") != workload["metadata"].get("generation"):
        return None
    entry: Obj | None = (status.get("workloadStates") or {}).get(node)
    return entry


async def successful(cluster: SimCluster, api: Any, namespace: str, name: str, node: str) -> Obj:
    def probe() -> Obj | None:
        workload = read_workload(api, namespace, name)
        entry = node_entry(workload, node)
        return workload if entry is not None and entry["status"] == "Successful" else None

    workload: Obj = await eventually(cluster, probe, f"RmdWorkload {namespace}/{name} Successful on {node}")
    return workload


def kubelet_cpus(node: SimNode, namespace: str, pod: str, container: str) -> set[int]:
    assert node.kubelet is not None
    found = node.kubelet.find_pod(namespace, pod)
    assert found is not None, f"the kubelet of {node.name} has no pod {namespace}/{pod}"
    return set(found.cpus[container])


def core_ids(workload: Obj) -> set[int]:
    return set().union(*(parse_cpu_list(item) for item in workload["spec"]["coreIds"]))


async def agent_holds(node: SimNode, namespace: str, name: str) -> bool:
    async with node.channel() as channel:
        stub: Any = agent_pb2_grpc.AgentStub(channel)  # type: ignore[no-untyped-call]  # generated, untyped
        listed = await stub.ListWorkloads(agent_pb2.ListWorkloadsRequest(), timeout=10)
    return any((w.ref.namespace, w.ref.name) == (namespace, name) for w in listed.workloads)


def resctrl_group(node: SimNode, cos_name: str) -> Path:
    return node.mount.backing_root / "sys/fs/resctrl" / cos_name


def l3_masks(node: SimNode, cos_name: str) -> dict[int, int]:
    lines = (resctrl_group(node, cos_name) / "schemata").read_text().splitlines()
    line = next(ln for ln in lines if ln.strip().startswith("L3"))
    return {int(d): int(m, 16) for d, m in (item.split("=") for item in line.split(":", 1)[1].split(";"))}


def assert_enforced(cluster: SimCluster, node: SimNode, workload: Obj, cpus: set[int], ways: int) -> None:
    """The node's resctrl has the workload's group on exactly `cpus`, with `ways` ways of its own on the
    caches of those cpus, and follows the kernel's rules."""
    cos_name = node_entry(workload, node.name)["cosName"]  # type: ignore[index]
    assert parse_cpu_list((resctrl_group(node, cos_name) / "cpus_list").read_text()) == cpus
    masks, root = l3_masks(node, cos_name), l3_masks(node, "")
    for cache_id in {cluster.spec.cpu_location(cpu)[0] for cpu in cpus}:
        assert masks[cache_id].bit_count() == ways, (cache_id, hex(masks[cache_id]))
        assert masks[cache_id] & root[cache_id] == 0  # guaranteed: the OS group does not share them
    assert node.check_resctrl() == []


# -- the cases -----------------------------------------------------------------------------------------------


async def test_sample_pod_gets_its_workload_and_loses_it_with_the_pod(
    cluster: SimCluster, api: Any, new_namespace: Callable[[], str]
) -> None:
    namespace = new_namespace()
    manifest = SAMPLE if SAMPLE.exists() else cluster.workdir / "sample-pod.yaml"
    if not SAMPLE.exists():
        manifest.write_text(SAMPLE_FALLBACK)
    created = await asyncio.to_thread(
        cluster.kubectl, "create", "-n", namespace, "-f", str(manifest), "-o", "name"
    )
    pod_name = created.stdout.strip().removeprefix("pod/")
    pod = await running(cluster, api, namespace, pod_name)
    node = cluster.nodes[pod["spec"]["nodeName"]]
    name = f"{pod_name}-rmd-workload-nginx1"

    workload = await successful(cluster, api, namespace, name, node.name)
    assert workload["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod_name,
            "uid": pod["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    cpus = kubelet_cpus(node, namespace, pod_name, "nginx1")
    assert len(cpus) == 3 and core_ids(workload) == cpus
    assert workload["spec"]["nodes"] == [node.name]
    assert workload["spec"]["rdt"]["cache"] == {"max": 2, "min": 2}
    assert node_entry(workload, node.name)["coreIds"] == [",".join(workload["spec"]["coreIds"])]  # type: ignore[index]
    assert_enforced(cluster, node, workload, cpus, 2)
    applied = await eventually(
        cluster, lambda: event_with(api, namespace, pod_name, "CacheWaysApplied"), "the pod's Applied Event"
    )
    assert name in applied.message and applied.type == "Normal"

    cos_name = node_entry(workload, node.name)["cosName"]  # type: ignore[index]
    core_api(api).delete_namespaced_pod(pod_name, namespace)
    await eventually(
        cluster,
        lambda: not any(w["metadata"]["name"] == name for w in list_workloads(api, namespace)),
        "the garbage collector to delete the RmdWorkload",
    )
    assert not await agent_holds(node, namespace, name)
    assert not resctrl_group(node, cos_name).exists()
    assert node.check_resctrl() == []


async def test_two_containers_with_their_own_annotations(
    cluster: SimCluster, api: Any, new_namespace: Callable[[], str]
) -> None:
    namespace = new_namespace()
    body = pod_body(
        "multi",
        guaranteed_container("c1", cpus=2, ways=2),
        guaranteed_container("c10", cpus=1, ways=3),
        {"name": "sidecar", "image": "busybox", "resources": {"limits": {"cpu": "1", "memory": "32Mi"}}},
        annotations={
            "c1_mba_percentage": "50",
            "c10_cache_min": "1",
            "c10_pstate_ratio": "1.5",
            "c10_pstate_monitoring": "on",
        },
    )
    pod_name = create_pod(api, namespace, body)
    pod = await running(cluster, api, namespace, pod_name)
    node = cluster.nodes[pod["spec"]["nodeName"]]

    c1 = await successful(cluster, api, namespace, "multi-rmd-workload-c1", node.name)
    c10 = await successful(cluster, api, namespace, "multi-rmd-workload-c10", node.name)
    # Each container's annotations and nothing of the other's (c1 is a prefix of c10).
    assert c1["spec"]["rdt"] == {"cache": {"max": 2, "min": 2}, "mba": {"percentage": 50}}
    assert "plugins" not in c1["spec"]
    assert c10["spec"]["rdt"] == {"cache": {"max": 3, "min": 1}}
    assert c10["spec"]["plugins"] == {"pstate": {"ratio": "1.5", "monitoring": "on"}}
    assert core_ids(c1) == kubelet_cpus(node, namespace, "multi", "c1")
    assert core_ids(c10) == kubelet_cpus(node, namespace, "multi", "c10")
    assert not core_ids(c1) & core_ids(c10)
    assert_enforced(cluster, node, c1, core_ids(c1), 2)
    names = {w["metadata"]["name"] for w in list_workloads(api, namespace)}
    assert names == {"multi-rmd-workload-c1", "multi-rmd-workload-c10"}  # no workload for the sidecar


async def test_same_pod_name_in_two_namespaces_stays_apart(
    cluster: SimCluster, api: Any, new_namespace: Callable[[], str]
) -> None:
    first, second = new_namespace(), new_namespace()
    node = cluster.nodes["worker-node-1"]
    for namespace in (first, second):
        create_pod(
            api, namespace, pod_body("twin", guaranteed_container("app", cpus=2, ways=1), node=node.name)
        )
    pods = {ns: await running(cluster, api, ns, "twin") for ns in (first, second)}
    workloads = {
        ns: await successful(cluster, api, ns, "twin-rmd-workload-app", node.name) for ns in (first, second)
    }
    for ns in (first, second):
        assert core_ids(workloads[ns]) == kubelet_cpus(node, ns, "twin", "app")
        assert workloads[ns]["metadata"]["ownerReferences"][0]["uid"] == pods[ns]["metadata"]["uid"]
        assert_enforced(cluster, node, workloads[ns], core_ids(workloads[ns]), 1)
    assert not core_ids(workloads[first]) & core_ids(workloads[second])
    groups = {node_entry(workloads[ns], node.name)["cosName"] for ns in (first, second)}  # type: ignore[index]
    assert len(groups) == 2


LONG = ("very-long-container-name-" * 3)[:63]  # the longest container name: a DNS label


async def test_every_annotation_problem_in_one_event_and_a_key_form_for_any_container_name(
    cluster: SimCluster, api: Any, new_namespace: Callable[[], str]
) -> None:
    """The API server refuses `<container>_<setting>` for a 63-character container (an annotation key's name
    part is at most 63 characters) and takes `<container>.rmd.intel.com/<setting>`, which the operator
    applies. Every problem of the other container's annotations is in one Warning, none in a second."""
    namespace = new_namespace()
    seed = pod_body(
        "seed", guaranteed_container(LONG, cpus=1, ways=1), annotations={f"{LONG}_mba_percentage": "50"}
    )
    with pytest.raises(ApiException) as refused:
        await asyncio.to_thread(core_api(api).create_namespaced_pod, namespace, seed, dry_run="All")
    assert refused.value.status == 422
    assert f"{LONG}_mba_percentage" in refused.value.body
    assert "name part must be no more than 63" in refused.value.body  # characters, or bytes (newer)

    body = pod_body(
        "annotated",
        guaranteed_container(LONG, cpus=1, ways=1),
        guaranteed_container("app", cpus=1, ways=1),
        annotations={
            f"{LONG}.rmd.intel.com/mba_percentage": "50",
            "app_mba_percentage": "abc",
            "app_pstate_ratio": "fast",
            "app_pstate_monitoring": "on",
            "app.rmd.intel.com/pstate_monitoring": "off",
            "app_polcy": "gold",
        },
    )
    pod_name = await asyncio.to_thread(create_pod, api, namespace, body)
    pod = await running(cluster, api, namespace, pod_name)
    node = cluster.nodes[pod["spec"]["nodeName"]]
    workload = await successful(cluster, api, namespace, f"annotated-rmd-workload-{LONG}", node.name)
    assert workload["spec"]["rdt"] == {"cache": {"max": 1, "min": 1}, "mba": {"percentage": 50}}
    assert core_ids(workload) == kubelet_cpus(node, namespace, pod_name, LONG)

    warning = await eventually(
        cluster, lambda: event_with(api, namespace, pod_name, "InvalidCacheRequest"), "the pod's Warning"
    )
    assert warning.type == "Warning" and warning.source.component == "rmd-operator"
    for fragment in (
        "container app: ",
        "annotations app.rmd.intel.com/pstate_monitoring='off' and app_pstate_monitoring='on' disagree",
        "annotation app_mba_percentage='abc' must be a whole number from 1 to 100",
        "annotation app_pstate_ratio='fast' must be a decimal number greater than 0 and less than 100",
        "; no RmdWorkload is created. annotations ignored: app_polcy: unknown setting 'polcy'",
    ):
        assert fragment in warning.message
    await eventually(
        cluster, lambda: event_with(api, namespace, pod_name, "CacheWaysApplied"), "the pod's Applied Event"
    )
    await asyncio.sleep(3)  # pod updates, drift intervals: no second Warning
    events = await asyncio.to_thread(events_of, api, namespace, pod_name)
    ours = sorted(e.reason for e in events if e.source.component == "rmd-operator")
    assert ours == ["CacheWaysApplied", "InvalidCacheRequest"]
    names = {w["metadata"]["name"] for w in list_workloads(api, namespace)}
    assert names == {f"annotated-rmd-workload-{LONG}"}  # none for app
    await asyncio.to_thread(core_api(api).delete_namespaced_pod, pod_name, namespace)


def _app(requests: Obj, limits: Obj) -> Obj:
    return {"name": "app", "image": "nginx", "resources": {"requests": requests, "limits": limits}}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            (
                _app({"cpu": "1", "memory": "64Mi", WAYS: "2"}, {"cpu": "2", "memory": "64Mi", WAYS: "2"}),
                "CacheWaysNotGuaranteed",
                "QoS class is Burstable",
            ),
            id="burstable",
        ),
        pytest.param(
            (
                _app(
                    {"cpu": "1500m", "memory": "64Mi", WAYS: "2"},
                    {"cpu": "1500m", "memory": "64Mi", WAYS: "2"},
                ),
                "CacheWaysFractionalCpus",
                "requests 1.5 CPUs",
            ),
            id="fractional",
        ),
    ],
)
async def test_pods_that_cannot_have_cache_ways_get_an_event_and_nothing_else(
    cluster: SimCluster, api: Any, new_namespace: Callable[[], str], case: tuple[Obj, str, str]
) -> None:
    container, reason, fragment = case
    namespace = new_namespace()
    pod_name = create_pod(api, namespace, pod_body("plain", container))
    await running(cluster, api, namespace, pod_name)  # the kubelet runs it; only the cache is refused
    event = await eventually(
        cluster, lambda: event_with(api, namespace, pod_name, reason), f"a {reason} Event"
    )
    assert event.type == "Warning" and fragment in event.message
    assert list_workloads(api, namespace) == []


async def test_a_deployment_asking_more_ways_than_one_cache_holds_is_refused_once_not_recreated(
    cluster: SimCluster, api: Any, new_namespace: Callable[[], str]
) -> None:
    """6 ways: the node's capacity has them (two L3 caches' guaranteed pools of 5: what the scheduler checks),
    but one cache's pool holds only 5. On a kubelet without a topology manager policy the pod is admitted with
    ways of both caches and its workload fails; deleting the pod would only make the ReplicaSet create it
    again, the scheduler place it here again, and so on. It is refused once and kept."""
    namespace = new_namespace()
    node = cluster.nodes[sorted(cluster.nodes)[0]]
    assert node.kubelet is not None
    node.kubelet.topology_manager_policy = "none"  # admitted without alignment (the kubelet's default)
    labels = {"app": "greedy"}
    pod_spec = pod_body("greedy", guaranteed_container("app", cpus=2, ways=6), node=node.name)["spec"]
    template = {"metadata": {"labels": labels}, "spec": pod_spec}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "greedy"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template},
    }
    apps: Any = client.AppsV1Api(api)  # Any: the client's own annotations are partial
    seen: set[str] = set()  # uids of every pod of the Deployment

    def pods_of_deployment() -> list[Obj]:
        listed = core_api(api).list_namespaced_pod(
            namespace, label_selector="app=greedy", _preload_content=False
        )
        items: list[Obj] = yaml.safe_load(listed.data)["items"]
        seen.update(p["metadata"]["uid"] for p in items)
        return items

    try:
        await asyncio.to_thread(apps.create_namespaced_deployment, namespace, deployment)
        (first,) = await eventually(cluster, pods_of_deployment, "the Deployment's pod")
        pod_name = first["metadata"]["name"]
        event = await eventually(
            cluster, lambda: event_with(api, namespace, pod_name, "CacheWorkloadFailed"), "the failure Event"
        )
        assert event.type == "Warning" and f"{pod_name}-rmd-workload-app" in event.message
        assert (
            "exceeds this node's guaranteed pool of 5 ways per L3 cache" in event.message
        )  # the agent's why
        assert "ask for at most 5" in event.message and "the pod is not deleted" in event.message
        workload = read_workload(api, namespace, f"{pod_name}-rmd-workload-app")
        assert node_entry(workload, node.name) == {
            "status": "Failed",
            "reason": "Unsatisfiable",
            "response": node_entry(workload, node.name)["response"],  # type: ignore[index]
        }
        deadline = time.monotonic() + 20  # a loop would have deleted and re-created it several times by now
        while time.monotonic() < deadline:
            current = await asyncio.to_thread(pods_of_deployment)
            assert [p["metadata"]["uid"] for p in current] == [first["metadata"]["uid"]]
            assert current[0]["metadata"].get("deletionTimestamp") is None
            await asyncio.sleep(0.5)
        assert seen == {first["metadata"]["uid"]}  # exactly one pod over the whole time
        events = await asyncio.to_thread(events_of, api, namespace, pod_name)
        failures = [e for e in events if e.reason == "CacheWorkloadFailed"]
        assert len(failures) == 1 and (failures[0].count or 1) == 1
    finally:
        node.kubelet.topology_manager_policy = "single-numa-node"
        with contextlib.suppress(ApiException):
            await asyncio.to_thread(client.AppsV1Api(api).delete_namespaced_deployment, "greedy", namespace)


async def test_a_pod_its_kubelet_refuses_at_admission_gets_nothing_but_one_warning(
    cluster: SimCluster, api: Any, new_namespace: Callable[[], str]
) -> None:
    """The same 6 ways on a kubelet whose topology manager policy is single-numa-node: no NUMA node has 6 ways
    (5 per L3 cache), so the kubelet refuses the pod (Failed, TopologyAffinityError). The operator creates
    nothing for it and says why, once."""
    namespace = new_namespace()
    node = cluster.nodes[sorted(cluster.nodes)[1]]
    assert node.kubelet is not None and node.kubelet.topology_manager_policy == "single-numa-node"
    body = pod_body("unaligned", guaranteed_container("app", cpus=2, ways=6), node=node.name)
    pod_name = await asyncio.to_thread(create_pod, api, namespace, body)
    pod = await eventually(
        cluster,
        lambda: (p := read_pod(api, namespace, pod_name)).get("status", {}).get("phase") == "Failed" and p,
        "the kubelet to refuse the pod",
    )
    assert pod["status"]["reason"] == "TopologyAffinityError"
    assert (
        pod["status"]["message"] == "Pod was rejected: Resources cannot be allocated with Topology locality"
    )
    warning = await eventually(
        cluster,
        lambda: event_with(api, namespace, pod_name, "CacheWaysPodRejected"),
        "the operator's Warning",
    )
    assert warning.type == "Warning" and warning.source.component == "rmd-operator"
    assert (
        f"the kubelet of node {node.name} rejected the pod at admission (TopologyAffinityError: Pod was "
        "rejected: Resources cannot be allocated with Topology locality)" in warning.message
    )
    assert "lower the container's cache ways" in warning.message
    await asyncio.sleep(5)  # pod updates, RmdWorkload watch events, drift intervals: nothing more
    events = await asyncio.to_thread(events_of, api, namespace, pod_name)
    assert [e.reason for e in events if e.source.component == "rmd-operator"] == ["CacheWaysPodRejected"]
    assert list_workloads(api, namespace) == []
    assert node.kubelet.find_pod(namespace, pod_name) is None  # nothing allocated on the node


async def test_with_delete_failed_pods_false_the_pod_stays(
    cluster: SimCluster, api: Any, new_namespace: Callable[[], str]
) -> None:
    cluster.operator_settings["delete_failed_pods"] = False
    await cluster.stop_operator()
    await cluster.start_operator()
    try:
        namespace = new_namespace()
        # MBps on a node whose resctrl counts in percent: valid for the API server, refused by the agent.
        body = pod_body(
            "kept", guaranteed_container("app", cpus=1, ways=1), annotations={"app_mba_mbps": "1000"}
        )
        pod_name = create_pod(api, namespace, body)
        pod = await running(cluster, api, namespace, pod_name)
        node = pod["spec"]["nodeName"]
        event = await eventually(
            cluster, lambda: event_with(api, namespace, pod_name, "CacheWorkloadFailed"), "the failure Event"
        )
        assert "keeps running" in event.message
        workload = read_workload(api, namespace, "kept-rmd-workload-app")
        assert node_entry(workload, node)["status"] == "Failed"  # type: ignore[index]
        await asyncio.sleep(3)  # a few drift intervals: retried, still refused, and the pod stays
        assert read_pod(api, namespace, pod_name)["metadata"]["uid"] == pod["metadata"]["uid"]
        assert read_pod(api, namespace, pod_name)["metadata"].get("deletionTimestamp") is None
        failures = [e for e in events_of(api, namespace, pod_name) if e.reason == "CacheWorkloadFailed"]
        assert len(failures) == 1 and (failures[0].count or 1) == 1  # reported once, not at every retry
    finally:
        cluster.operator_settings.pop("delete_failed_pods", None)
        await cluster.stop_operator()
        await cluster.start_operator()


# -- the kubelet's PodResources API ------------------------------------------------------------------------


def pod_lookup_capability(api: Any, node: str) -> Obj | None:
    """What the node's RmdNodeState says pod lookups use (capability podResourcesGet)."""
    state = objects_api(api).get_namespaced_custom_object(
        GROUP, VERSION, SYSTEM_NAMESPACE, "rmdnodestates", f"rmd-node-state-{node}"
    )
    entry: Obj | None = ((state.get("status") or {}).get("capabilities") or {}).get("podResourcesGet")
    return entry


async def test_a_kubelet_without_podresources_get_still_gives_pods_their_workloads(
    cluster: SimCluster, api: Any, new_namespace: Callable[[], str]
) -> None:
    """A kubelet whose KubeletPodResourcesGet gate is off (the default before 1.34) answers Get with
    UNKNOWN "PodResources API Get method disabled": the agent looks the pod up with List instead."""
    namespace = new_namespace()
    node = cluster.nodes[sorted(cluster.nodes)[0]]
    assert node.kubelet is not None
    node.kubelet.get_enabled = False  # as if restarted with the gate off
    try:
        body = pod_body("no-get", guaranteed_container("app", cpus=1, ways=1), node=node.name)
        name = await asyncio.to_thread(create_pod, api, namespace, body)
        workload = await successful(cluster, api, namespace, f"{name}-rmd-workload-app", node.name)
        assert core_ids(workload) == kubelet_cpus(node, namespace, name, "app")
        entry = await eventually(
            cluster,
            lambda: (e := pod_lookup_capability(api, node.name)) and e["supported"] is False and e,
            f"RmdNodeState of {node.name} to say pod lookups use List",
        )
        assert entry["detail"].startswith(
            "pod lookups use List (Get disabled: PodResources API Get method disabled)"
        )
        assert event_with(api, namespace, name, "CacheWaysCpusUnknown") is None  # nothing went wrong
    finally:
        node.kubelet.get_enabled = True
    await asyncio.to_thread(core_api(api).delete_namespaced_pod, name, namespace)


async def test_a_pod_whose_cpus_cannot_be_had_gets_one_warning_then_its_workload(
    cluster: SimCluster, api: Any, new_namespace: Callable[[], str]
) -> None:
    """The node's kubelet does not answer PodResources: the agent answers UNAVAILABLE, the operator posts one
    Warning on the pod saying why (however often it retries), and goes on once the kubelet answers."""
    namespace = new_namespace()
    node = cluster.nodes[sorted(cluster.nodes)[-1]]
    assert node.kubelet is not None
    node.kubelet.stall()
    try:
        body = pod_body("stalled", guaranteed_container("app", cpus=1, ways=1), node=node.name)
        name = await asyncio.to_thread(create_pod, api, namespace, body)
        warning = await eventually(
            cluster,
            lambda: event_with(api, namespace, name, "CacheWaysCpusUnknown"),
            "the pod's Warning that its CPUs cannot be had",
        )
        assert warning.type == "Warning" and warning.source.component == "rmd-operator"
        assert f"from the rmd agent of node {node.name}" in warning.message
        assert "cannot ask the kubelet's PodResources API" in warning.message
        assert "no answer within" in warning.message and warning.message.endswith("; retrying")
        await asyncio.sleep(6)  # several retries (FAST: 0.5 s doubling to 2 s)
        reasons = [e.reason for e in await asyncio.to_thread(events_of, api, namespace, name)]
        assert reasons.count("CacheWaysCpusUnknown") == 1, reasons
    finally:
        node.kubelet.resume()
    await successful(cluster, api, namespace, f"{name}-rmd-workload-app", node.name)
    found = await eventually(
        cluster, lambda: event_with(api, namespace, name, "CacheWaysCpusFound"), "the pod's CpusFound Event"
    )
    assert found.type == "Normal"
    await asyncio.to_thread(core_api(api).delete_namespaced_pod, name, namespace)
