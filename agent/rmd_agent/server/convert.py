"""Protobuf <-> engine types for the rmd.agent.v1 API. Pure: no grpc, no I/O.

A WorkloadSpec becomes a Workload field by field (`workload_from_message`, the inverse of `spec_message`); the
operator has already read the RmdWorkload's layout (rmd_api.workload_spec), so the agent never parses one.
The request is then checked like any workload (`check_request`), and its messages name spec.* fields as
the manifest does. Malformed requests raise WorkloadRejected (invalid) for workloads and InvalidRequest
otherwise; the service answers both with INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Iterable

from rmd_agent.engine_api import AppliedWorkload, ContainerCpus, CpuState, NodeSummary
from rmd_agent.errors import AgentError
from rmd_agent.plan.workload import RejectReason, Workload, WorkloadRejected, check_request
from rmd_api.agent.v1 import agent_pb2
from rmd_api.cpuset import CpuListError, format_cpu_list, parse_cpu_list_entries

_CPU_STATES = {
    CpuState.ALLOCATED: agent_pb2.GetContainerCpusResponse.ALLOCATED,
    CpuState.NOT_YET_ALLOCATED: agent_pb2.GetContainerCpusResponse.NOT_YET_ALLOCATED,
    CpuState.NOT_EXCLUSIVE: agent_pb2.GetContainerCpusResponse.NOT_EXCLUSIVE,
}


class InvalidRequest(AgentError):
    """A request that is not a workload and is malformed (e.g. GetContainerCpus without a pod name)."""


def _require(fields: dict[str, str], what: str) -> None:
    missing = [name for name, value in fields.items() if not value]
    if missing:
        raise InvalidRequest(f"{what}: {', '.join(missing)} must be set")


def _ref(ref: agent_pb2.WorkloadRef, what: str) -> tuple[str, str, str]:
    _require({"ref.namespace": ref.namespace, "ref.name": ref.name}, what)
    return ref.namespace, ref.name, ref.uid


# -- requests ------------------------------------------------------------------------------------------------


def _cpus(entries: Iterable[str], path: str) -> frozenset[int]:
    try:
        return parse_cpu_list_entries(list(entries), path)
    except CpuListError as exc:
        raise WorkloadRejected(RejectReason.INVALID, str(exc)) from None


def workload_from_message(namespace: str, name: str, uid: str, spec: agent_pb2.WorkloadSpec) -> Workload:
    """The workload a WorkloadSpec asks for, keeping "absent" (None) distinct from zero. Not checked yet."""
    mba = spec.mba.WhichOneof("value") if spec.HasField("mba") else None
    pstate = spec.pstate if spec.HasField("pstate") else None
    return Workload(
        namespace=namespace,
        name=name,
        uid=uid,
        core_ids=_cpus(spec.core_ids, "spec.coreIds"),
        all_cores=spec.all_cores,
        reserved_core_ids=_cpus(spec.reserved_core_ids, "spec.reservedCoreIds"),
        cache_max=spec.cache.max if spec.HasField("cache") else None,
        cache_min=spec.cache.min if spec.HasField("cache") else None,
        mba_percentage=spec.mba.percentage if mba == "percentage" else None,
        mba_mbps=spec.mba.mbps if mba == "mbps" else None,
        policy=spec.policy or None,
        # proto3 has no "unset" double: ratio 0 means no ratio (a zero ratio would be invalid anyway).
        pstate_ratio=(pstate.ratio or None) if pstate is not None else None,
        pstate_monitoring=_monitoring(pstate),
    )


def _monitoring(pstate: agent_pb2.PstateRequest | None) -> str | None:
    """ "on", "off", or None when the request leaves it unset (the engine then monitors, as RMD does)."""
    if pstate is None or not pstate.HasField("monitoring"):
        return None
    return "on" if pstate.monitoring else "off"


def workload_from_request(request: agent_pb2.ApplyWorkloadRequest) -> Workload:
    """The requested workload, not yet resolved for the node. WorkloadRejected (invalid) if malformed."""
    try:
        namespace, name, uid = _ref(request.ref, "ApplyWorkload")
    except InvalidRequest as exc:
        raise WorkloadRejected(RejectReason.INVALID, str(exc)) from None
    try:
        workload = workload_from_message(namespace, name, uid, request.spec)
        check_request(workload)
    except WorkloadRejected as exc:
        raise exc.for_workload(f"{namespace}/{name}") from None
    return workload


def remove_ref(request: agent_pb2.RemoveWorkloadRequest) -> tuple[str, str, str]:
    """(namespace, name, uid); uid may be empty ("whatever holds namespace/name")."""
    return _ref(request.ref, "RemoveWorkload")


def container_ref(request: agent_pb2.GetContainerCpusRequest) -> tuple[str, str, str, str]:
    """(pod namespace, pod name, pod uid, container); the uid may be empty (then it is not cross-checked)."""
    _require(
        {
            "pod_namespace": request.pod_namespace,
            "pod_name": request.pod_name,
            "container": request.container,
        },
        "GetContainerCpus",
    )
    return request.pod_namespace, request.pod_name, request.pod_uid, request.container


# -- responses -----------------------------------------------------------------------------------------------


def spec_message(w: Workload) -> agent_pb2.WorkloadSpec:
    spec = agent_pb2.WorkloadSpec(
        core_ids=[format_cpu_list(w.core_ids)] if w.core_ids else [],
        all_cores=w.all_cores,
        reserved_core_ids=[format_cpu_list(w.reserved_core_ids)] if w.reserved_core_ids else [],
        policy=w.policy or "",
    )
    if w.cache_max is not None or w.cache_min is not None:
        spec.cache.max = w.cache_max or 0
        spec.cache.min = w.cache_min or 0
    if w.mba_percentage is not None:
        spec.mba.percentage = w.mba_percentage
    elif w.mba_mbps is not None:
        spec.mba.mbps = w.mba_mbps
    if w.pstate_ratio is not None or w.pstate_monitoring is not None:
        spec.pstate.ratio = w.pstate_ratio or 0.0
        if w.pstate_monitoring is not None:
            spec.pstate.monitoring = w.pstate_monitoring == "on"
    return spec


def workload_message(applied: AppliedWorkload) -> agent_pb2.Workload:
    w = applied.workload
    message = agent_pb2.Workload(
        ref=agent_pb2.WorkloadRef(namespace=w.namespace, name=w.name, uid=w.uid),
        spec=spec_message(w),
        id=applied.id,
        cos_name=applied.cos_name,
        status=applied.status,
        cpus=sorted(w.core_ids),
        pool=applied.pool,
        cache=[
            agent_pb2.CacheAllocation(cache_id=cache_id, mask=f"{mask:x}", ways=mask.bit_count())
            for cache_id, mask in sorted(applied.cache.items())
        ],
        mba=applied.mba,
    )
    if applied.pstate is not None:
        message.pstate.supported = applied.pstate.supported
        message.pstate.detail = applied.pstate.detail
    held = applied.mba_applied
    if held is not None:
        message.mba_applied.CopyFrom(
            agent_pb2.MbaApplied(value=held.value, rounded=held.rounded, detail=held.detail)
        )
    return message


def node_message(node: NodeSummary) -> agent_pb2.GetNodeResponse:
    return agent_pb2.GetNodeResponse(
        node_name=node.node_name,
        capabilities={
            feature: agent_pb2.Capability(supported=supported, detail=detail)
            for feature, (supported, detail) in node.capabilities.items()
        },
        cpus=node.cpus,
        numa_nodes=node.numa_nodes,
        caches=[
            agent_pb2.CacheDomain(
                cache_id=c.cache_id, cpus=format_cpu_list(c.cpus), ways=c.ways, free_ways=c.free_ways
            )
            for c in sorted(node.caches, key=lambda c: c.cache_id)
        ],
        closids_total=node.closids_total,
        closids_used=node.closids_used,
        workloads=node.workloads,
    )


def container_cpus_message(result: ContainerCpus) -> agent_pb2.GetContainerCpusResponse:
    return agent_pb2.GetContainerCpusResponse(
        state=_CPU_STATES[result.state], cpus=sorted(result.cpus), detail=result.detail
    )
