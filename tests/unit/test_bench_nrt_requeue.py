"""The pure parts of bench/nrt_requeue.py and bench/numa_scheduler.py (issue #14 item 3): how a write of the
NodeResourceTopology is told to be the requeue echo, when the node counts as idle, the target, and how the
scheduler-plugins sources are edited to build on the test control plane's Kubernetes release. The benchmark
itself needs a scheduler binary CI cannot build (tests/e2e/test_bench_nrt_requeue.py)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

from rmd_api.names import NRT_REQUEUE_ANNOTATION
from rmd_sim.control_plane import repo_root

sys.path.insert(0, str(repo_root() / "bench"))
import nrt_requeue  # bench/ is a directory of scripts, not a package
import numa_scheduler


def nrt(available: int, *, echo_at: str | None = None) -> dict[str, Any]:
    annotations = {NRT_REQUEUE_ANNOTATION: echo_at} if echo_at else {}
    return {
        "metadata": {"name": "n", "annotations": annotations},
        "attributes": [{"name": "nodeTopologyPodsFingerprint", "value": f"pfp{available}"}],
        "zones": [
            {
                "name": "node-0",
                "resources": [{"name": "cpu", "allocatable": "31", "available": str(available)}],
            },
            {"name": "node-1", "resources": [{"name": "cpu", "allocatable": "32", "available": "32"}]},
        ],
    }


def test_a_write_is_an_echo_when_only_the_requeue_annotation_changed() -> None:
    change = nrt(11)
    echo = copy.deepcopy(change)
    echo["metadata"]["annotations"][NRT_REQUEUE_ANNOTATION] = "2026-11-26T12:00:04Z"
    assert nrt_requeue.write_kind(change, echo) == "echo"
    assert nrt_requeue.write_kind(None, echo) == "change"  # the first object seen
    assert nrt_requeue.write_kind(nrt(31), change) == "change"  # zones and fingerprint changed
    assert nrt_requeue.write_kind(change, copy.deepcopy(change)) == "other"  # e.g. a repair of metadata
    moved = nrt(11, echo_at="2026-11-26T12:00:08Z")
    assert nrt_requeue.write_kind(nrt(31, echo_at="2026-11-26T12:00:04Z"), moved) == "change"
    fingerprint_only = copy.deepcopy(change)
    fingerprint_only["attributes"][0]["value"] = "pfp-other"
    assert nrt_requeue.write_kind(change, fingerprint_only) == "change"


def test_the_node_is_idle_only_when_every_zone_has_all_its_cpus_available() -> None:
    assert nrt_requeue.idle_object(nrt(31))
    assert not nrt_requeue.idle_object(nrt(11))
    assert not nrt_requeue.idle_object(None)
    assert not nrt_requeue.idle_object({"zones": []})


def test_a_pod_counts_as_rejected_on_its_pod_scheduled_false_condition() -> None:
    unschedulable = {"status": {"conditions": [{"type": "PodScheduled", "status": "False"}]}}
    assert nrt_requeue.rejected(unschedulable)
    assert not nrt_requeue.rejected({"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}})
    assert not nrt_requeue.rejected({})


def rounds(*bound: float | None, rejected: bool = True, ran: bool = True) -> list[nrt_requeue.Round]:
    return [
        nrt_requeue.Round(
            echo=True, rejected_s=0.01 if rejected else None, bound_s=b, running=ran and b is not None
        )
        for b in bound
    ]


@pytest.mark.parametrize(
    ("bound", "rejected", "ran", "met"),
    [
        ((4.3, 4.7, 4.9), True, True, True),
        ((4.3, 5.2), True, True, False),  # one round over 5 s misses
        ((4.3, None), True, True, False),  # never bound counts as the round's whole limit
        ((0.4, 0.5), False, True, False),  # never rejected: the case the echo is for did not happen
        ((3.3, 3.4), True, False, False),  # the kubelet refused B: the scheduler's view was wrong
    ],
)
def test_the_target_needs_every_round_rejected_first_bound_within_5_s_and_admitted(
    bound: tuple[float | None, ...], rejected: bool, ran: bool, met: bool
) -> None:
    summary = nrt_requeue.summarise(rounds(*bound, rejected=rejected, ran=ran), None, 330.0)
    assert [t["met"] for t in nrt_requeue.targets(summary)] == [met]


def test_failed_attempts_are_counted_from_the_schedulers_log_for_that_pod_only(tmp_path: Path) -> None:
    log = tmp_path / "scheduler.log"
    line = 'I1126 12:35:44.592292 schedule_one.go:1239] "Unable to schedule pod; no fit; waiting" pod="{}"'
    log.write_text(
        "\n".join(
            [
                line.format("bench-requeue/b-2"),
                line.format("bench-requeue/b-2"),
                line.format("bench-requeue/b-20"),
                line.format("other/b-2"),
                'I1126 12:35:49.252755 schedule_one.go:481] "Successfully bound pod" pod="bench-requeue/b-2"',
            ]
        )
    )
    assert nrt_requeue.failed_attempts(log, "b-2") == 2


def test_the_baseline_that_never_binds_counts_as_its_timeout() -> None:
    baseline = nrt_requeue.Round(echo=False, rejected_s=0.01, bound_s=None)
    summary = nrt_requeue.summarise(rounds(4.4), baseline, 330.0)
    assert (summary["baseline_s"], summary["baseline_bound"]) == (330.0, False)


def test_the_scheduler_builds_on_the_control_planes_release_with_every_staging_module() -> None:
    version = numa_scheduler.kubernetes_version()
    staging_version = "v0." + version.removeprefix("v1.")
    edits = numa_scheduler.module_edits(version, ["k8s.io/api", "k8s.io/cri-streaming"], Path("/src/np"))
    assert edits == [
        f"-replace=k8s.io/kubernetes=k8s.io/kubernetes@{version}",
        f"-replace=k8s.io/api=k8s.io/api@{staging_version}",
        f"-replace=k8s.io/cri-streaming=k8s.io/cri-streaming@{staging_version}",
        "-replace=github.com/k8stopologyawareschedwg/numaplacement=/src/np",
        f"-require=sigs.k8s.io/controller-runtime@{numa_scheduler.CONTROLLER_RUNTIME_FOR_MINOR[version.split('.')[1]]}",
    ]
    with pytest.raises(RuntimeError, match=r"no controller-runtime release known for Kubernetes 1\.99"):
        numa_scheduler.module_edits("v1.99.0", [], Path("/src/np"))


def test_dropped_plugins_lose_their_import_and_registration_and_nothing_else() -> None:
    main_go = (
        "import (\n"
        '\t"sigs.k8s.io/scheduler-plugins/pkg/capacityscheduling"\n'
        '\t"sigs.k8s.io/scheduler-plugins/pkg/noderesourcetopology"\n'
        ")\n"
        "\t\tapp.WithPlugin(capacityscheduling.Name, capacityscheduling.New),\n"
        "\t\tapp.WithPlugin(noderesourcetopology.Name, noderesourcetopology.New),\n"
    )
    assert numa_scheduler.without_plugins(main_go, ("capacityscheduling",)) == (
        "import (\n"
        '\t"sigs.k8s.io/scheduler-plugins/pkg/noderesourcetopology"\n'
        ")\n"
        "\t\tapp.WithPlugin(noderesourcetopology.Name, noderesourcetopology.New),\n"
    )
