from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkloadRef(_message.Message):
    __slots__ = ("namespace", "name", "uid")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    uid: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., uid: _Optional[str] = ...) -> None: ...

class CacheRequest(_message.Message):
    __slots__ = ("max", "min")
    MAX_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    max: int
    min: int
    def __init__(self, max: _Optional[int] = ..., min: _Optional[int] = ...) -> None: ...

class MbaRequest(_message.Message):
    __slots__ = ("percentage", "mbps")
    PERCENTAGE_FIELD_NUMBER: _ClassVar[int]
    MBPS_FIELD_NUMBER: _ClassVar[int]
    percentage: int
    mbps: int
    def __init__(self, percentage: _Optional[int] = ..., mbps: _Optional[int] = ...) -> None: ...

class PstateRequest(_message.Message):
    __slots__ = ("ratio", "monitoring")
    RATIO_FIELD_NUMBER: _ClassVar[int]
    MONITORING_FIELD_NUMBER: _ClassVar[int]
    ratio: float
    monitoring: bool
    def __init__(self, ratio: _Optional[float] = ..., monitoring: _Optional[bool] = ...) -> None: ...

class WorkloadSpec(_message.Message):
    __slots__ = ("core_ids", "all_cores", "reserved_core_ids", "policy", "cache", "mba", "pstate")
    CORE_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_CORES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_CORE_IDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    MBA_FIELD_NUMBER: _ClassVar[int]
    PSTATE_FIELD_NUMBER: _ClassVar[int]
    core_ids: _containers.RepeatedScalarFieldContainer[str]
    all_cores: bool
    reserved_core_ids: _containers.RepeatedScalarFieldContainer[str]
    policy: str
    cache: CacheRequest
    mba: MbaRequest
    pstate: PstateRequest
    def __init__(self, core_ids: _Optional[_Iterable[str]] = ..., all_cores: _Optional[bool] = ..., reserved_core_ids: _Optional[_Iterable[str]] = ..., policy: _Optional[str] = ..., cache: _Optional[_Union[CacheRequest, _Mapping]] = ..., mba: _Optional[_Union[MbaRequest, _Mapping]] = ..., pstate: _Optional[_Union[PstateRequest, _Mapping]] = ...) -> None: ...

class ApplyWorkloadRequest(_message.Message):
    __slots__ = ("ref", "spec")
    REF_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    ref: WorkloadRef
    spec: WorkloadSpec
    def __init__(self, ref: _Optional[_Union[WorkloadRef, _Mapping]] = ..., spec: _Optional[_Union[WorkloadSpec, _Mapping]] = ...) -> None: ...

class CacheAllocation(_message.Message):
    __slots__ = ("cache_id", "mask", "ways")
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    WAYS_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    mask: str
    ways: int
    def __init__(self, cache_id: _Optional[int] = ..., mask: _Optional[str] = ..., ways: _Optional[int] = ...) -> None: ...

class MbaApplied(_message.Message):
    __slots__ = ("value", "rounded", "detail")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ROUNDED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    value: int
    rounded: bool
    detail: str
    def __init__(self, value: _Optional[int] = ..., rounded: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class PstateStatus(_message.Message):
    __slots__ = ("supported", "detail")
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    supported: bool
    detail: str
    def __init__(self, supported: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class Workload(_message.Message):
    __slots__ = ("ref", "spec", "id", "cos_name", "status", "cpus", "pool", "cache", "mba", "pstate", "mba_applied")
    class MbaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    REF_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    COS_NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    MBA_FIELD_NUMBER: _ClassVar[int]
    PSTATE_FIELD_NUMBER: _ClassVar[int]
    MBA_APPLIED_FIELD_NUMBER: _ClassVar[int]
    ref: WorkloadRef
    spec: WorkloadSpec
    id: str
    cos_name: str
    status: str
    cpus: _containers.RepeatedScalarFieldContainer[int]
    pool: str
    cache: _containers.RepeatedCompositeFieldContainer[CacheAllocation]
    mba: _containers.ScalarMap[int, int]
    pstate: PstateStatus
    mba_applied: MbaApplied
    def __init__(self, ref: _Optional[_Union[WorkloadRef, _Mapping]] = ..., spec: _Optional[_Union[WorkloadSpec, _Mapping]] = ..., id: _Optional[str] = ..., cos_name: _Optional[str] = ..., status: _Optional[str] = ..., cpus: _Optional[_Iterable[int]] = ..., pool: _Optional[str] = ..., cache: _Optional[_Iterable[_Union[CacheAllocation, _Mapping]]] = ..., mba: _Optional[_Mapping[int, int]] = ..., pstate: _Optional[_Union[PstateStatus, _Mapping]] = ..., mba_applied: _Optional[_Union[MbaApplied, _Mapping]] = ...) -> None: ...

class ApplyWorkloadResponse(_message.Message):
    __slots__ = ("workload", "changed")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    workload: Workload
    changed: bool
    def __init__(self, workload: _Optional[_Union[Workload, _Mapping]] = ..., changed: _Optional[bool] = ...) -> None: ...

class RemoveWorkloadRequest(_message.Message):
    __slots__ = ("ref",)
    REF_FIELD_NUMBER: _ClassVar[int]
    ref: WorkloadRef
    def __init__(self, ref: _Optional[_Union[WorkloadRef, _Mapping]] = ...) -> None: ...

class RemoveWorkloadResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class ListWorkloadsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkloadsResponse(_message.Message):
    __slots__ = ("workloads",)
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    workloads: _containers.RepeatedCompositeFieldContainer[Workload]
    def __init__(self, workloads: _Optional[_Iterable[_Union[Workload, _Mapping]]] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Capability(_message.Message):
    __slots__ = ("supported", "detail")
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    supported: bool
    detail: str
    def __init__(self, supported: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class CacheDomain(_message.Message):
    __slots__ = ("cache_id", "cpus", "ways", "free_ways")
    class FreeWaysEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    WAYS_FIELD_NUMBER: _ClassVar[int]
    FREE_WAYS_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    cpus: str
    ways: int
    free_ways: _containers.ScalarMap[str, int]
    def __init__(self, cache_id: _Optional[int] = ..., cpus: _Optional[str] = ..., ways: _Optional[int] = ..., free_ways: _Optional[_Mapping[str, int]] = ...) -> None: ...

class GetNodeResponse(_message.Message):
    __slots__ = ("node_name", "capabilities", "cpus", "numa_nodes", "caches", "closids_total", "closids_used", "workloads")
    class CapabilitiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Capability
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Capability, _Mapping]] = ...) -> None: ...
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODES_FIELD_NUMBER: _ClassVar[int]
    CACHES_FIELD_NUMBER: _ClassVar[int]
    CLOSIDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CLOSIDS_USED_FIELD_NUMBER: _ClassVar[int]
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    capabilities: _containers.MessageMap[str, Capability]
    cpus: int
    numa_nodes: int
    caches: _containers.RepeatedCompositeFieldContainer[CacheDomain]
    closids_total: int
    closids_used: int
    workloads: int
    def __init__(self, node_name: _Optional[str] = ..., capabilities: _Optional[_Mapping[str, Capability]] = ..., cpus: _Optional[int] = ..., numa_nodes: _Optional[int] = ..., caches: _Optional[_Iterable[_Union[CacheDomain, _Mapping]]] = ..., closids_total: _Optional[int] = ..., closids_used: _Optional[int] = ..., workloads: _Optional[int] = ...) -> None: ...

class GetContainerCpusRequest(_message.Message):
    __slots__ = ("pod_namespace", "pod_name", "pod_uid", "container")
    POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    pod_namespace: str
    pod_name: str
    pod_uid: str
    container: str
    def __init__(self, pod_namespace: _Optional[str] = ..., pod_name: _Optional[str] = ..., pod_uid: _Optional[str] = ..., container: _Optional[str] = ...) -> None: ...

class GetContainerCpusResponse(_message.Message):
    __slots__ = ("state", "cpus", "detail")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[GetContainerCpusResponse.State]
        ALLOCATED: _ClassVar[GetContainerCpusResponse.State]
        NOT_YET_ALLOCATED: _ClassVar[GetContainerCpusResponse.State]
        NOT_EXCLUSIVE: _ClassVar[GetContainerCpusResponse.State]
    STATE_UNSPECIFIED: GetContainerCpusResponse.State
    ALLOCATED: GetContainerCpusResponse.State
    NOT_YET_ALLOCATED: GetContainerCpusResponse.State
    NOT_EXCLUSIVE: GetContainerCpusResponse.State
    STATE_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    state: GetContainerCpusResponse.State
    cpus: _containers.RepeatedScalarFieldContainer[int]
    detail: str
    def __init__(self, state: _Optional[_Union[GetContainerCpusResponse.State, str]] = ..., cpus: _Optional[_Iterable[int]] = ..., detail: _Optional[str] = ...) -> None: ...
