"""RmdWorkload spec -> the request the operator sends to agents, and what a node must support for it. Pure.

The spec layouts (v0.1 and v0.3) are read by rmd_api.workload_spec, shared with the agent's side of the
contract; here its errors become the operator's SpecError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rmd_api.agent.v1 import agent_pb2
from rmd_api.workload_spec import InvalidSpec, parse_spec
from rmd_operator.errors import SpecError


@dataclass(frozen=True)
class Requirements:
    """What a node must support for the workload to mean anything there."""

    rdt_l3_cat: bool  # cache ways (max > 0) or a policy: needs L3 cache allocation
    mba: bool  # memory bandwidth allocation


def workload_spec(spec: Mapping[str, Any]) -> agent_pb2.WorkloadSpec:
    """The normalised request for an RmdWorkload's spec (either layout). SpecError if malformed."""
    try:
        return parse_spec(spec)
    except InvalidSpec as exc:
        raise SpecError(str(exc)) from None


def requirements(spec: agent_pb2.WorkloadSpec) -> Requirements:
    """What the request needs from a node. A request for no cache ways and no policy (a P-state only, or an
    explicit max=0 shared-pool request) restricts nothing in resctrl, so it does not need RDT: the agent
    accepts it on a node without cache allocation and says in its answer whether it could set the P-state."""
    wants_ways = spec.HasField("cache") and spec.cache.max > 0
    return Requirements(
        rdt_l3_cat=wants_ways or bool(spec.policy),
        mba=spec.HasField("mba") and spec.mba.WhichOneof("value") is not None,
    )


def workload_ref(namespace: str, name: str, uid: str) -> agent_pb2.WorkloadRef:
    """How agents know the workload: namespace/name plus the object's uid, so a re-created object of the same
    name is a different workload (rmd-operator matched by name only)."""
    return agent_pb2.WorkloadRef(namespace=namespace, name=name, uid=uid)
