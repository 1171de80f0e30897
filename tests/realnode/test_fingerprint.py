"""The pod fingerprint the agent publishes equals the one the NUMA-aware scheduler computes from the pods
bound to the real node (rmd_sim.scheduler_view restates its rule), for a mix of pods the real kubelet runs.
A fractional Guaranteed pod is the measured case: the fingerprints differed, the scheduler never resynced."""

from __future__ import annotations

from typing import Any

from rmd_agent.nrt.fingerprint import ATTRIBUTE
from rmd_sim.realnode.stack import RealStack, wait_for
from rmd_sim.scheduler_view import scheduler_counts, scheduler_fingerprint

NAMESPACE = "fingerprint"
WAYS = "intel.com/l3_cache_ways"


def pod(
    stack: RealStack,
    name: str,
    requests: dict[str, str],
    limits: dict[str, str],
    init: tuple[dict[str, Any], ...] = (),
) -> dict[str, Any]:
    return stack.pod(name, NAMESPACE, stack.container("app", requests, limits), init=init)


def published_and_expected(stack: RealStack) -> tuple[str, str]:
    nrt = stack.get_json("noderesourcetopology", stack.node.name)
    published = {a["name"]: a["value"] for a in nrt["attributes"]}[ATTRIBUTE]
    listed = {r["name"] for zone in nrt["zones"] for r in zone["resources"]}
    pods = stack.get_json("pods", "-A", f"--field-selector=spec.nodeName={stack.node.name}")["items"]
    return published, scheduler_fingerprint(pods, listed)


def test_the_published_fingerprint_is_the_schedulers(stack: RealStack) -> None:
    stack.create_namespace(NAMESPACE)
    fraction = {"cpu": "500m", "memory": "256Mi"}
    whole = {"cpu": "1", "memory": "64Mi", WAYS: "1"}
    sidecar = {**stack.container("sidecar", {WAYS: "1"}), "restartPolicy": "Always"}
    plain_init = {**stack.container("setup", {WAYS: "1"}), "command": ["true"]}
    mix = {
        "fractional-guaranteed": pod(stack, "fractional-guaranteed", fraction, fraction),
        "integer-guaranteed": pod(stack, "integer-guaranteed", whole, whole),
        "burstable": pod(stack, "burstable", {"cpu": "100m", "memory": "32Mi"}, {"memory": "64Mi"}),
        "besteffort": pod(stack, "besteffort", {}, {}),
        "device-only": pod(stack, "device-only", {"cpu": "50m", WAYS: "1"}, {WAYS: "1"}),
        "sidecar-device": pod(stack, "sidecar-device", {"cpu": "50m"}, {}, init=(sidecar,)),
        "init-device": pod(stack, "init-device", {}, {}, init=(plain_init,)),
    }
    try:
        for manifest in mix.values():
            stack.create(manifest)
        wait_for(
            "the pods to run",
            lambda: all(
                (stack.get_json("pod", "-n", NAMESPACE, name) or {}).get("status", {}).get("phase")
                == "Running"
                for name in mix
            ),
            timeout=60,
        )
        listed = {WAYS, "cpu", "memory"}
        counted = {name for name, manifest in mix.items() if scheduler_counts(manifest, listed)}
        # the scheduler's rule, as restated: a plain init container's device does not count, a sidecar's does
        assert counted == {"fractional-guaranteed", "integer-guaranteed", "device-only", "sidecar-device"}
        published, expected = wait_for(
            "the published fingerprint to equal the scheduler's",
            lambda: (pair := published_and_expected(stack))[0] == pair[1] and pair,
            timeout=30,
        )
        assert published == expected
    finally:
        stack.delete_namespace(NAMESPACE)
    wait_for(
        "the fingerprint to drop the deleted pods",
        lambda: (pair := published_and_expected(stack))[0] == pair[1],
        timeout=30,
    )
