"""The kubelet's CPU and memory manager checkpoint files: JSON layouts and checksum.

The kubelet keeps `cpu_manager_state` and `memory_manager_state` in its root directory as JSON with a
checksum. The checksum is FNV-1a 32 over what go-spew prints for the Go struct with `%#v`
(`k8s.io/utils/dump.ForHash`), with the checksum field set to zero. To verify a checksum in Python we
must print exactly what go-spew would. That output depends on Go-side facts the JSON does not carry: Go
type names, whether a map is nil or empty, and which fields the writing version's struct has. This package
reproduces those rules for the few structs involved. The agent uses it to read the files and the simulated
kubelet uses it to write them (facts: reference/numa-topology-podresources.md §2).

CPU manager formats (`format_version`):
  v1  entries keyed by container runtime ID (kubelets up to 1.17)
  v2  entries podUID -> container -> cpuset (1.18 to 1.35; still the common case)
  v3  v2 plus podEntries podUID -> {"cpuSet"} (1.36 with PodLevelResourceManagers)
  v4  a `data` JSON string with its own checksum, plus a top-level v3 copy with checksum 0 (1.37)
Memory manager formats: v1 (the classic layout), v2 (adds podEntries), v3 (`data` + `dataChecksum`).

Decoding follows Go's encoding/json: keys match struct fields exactly or case-insensitively, unknown keys
are ignored, and JSON null leaves a scalar unchanged but makes a map or slice nil. Decoding is stricter
than Go in two ways: a top-level value that is not an object is refused, and so are duplicate keys (Go
keeps the last one, which would let a file carry two values).

Modules: `gospew` (the dump), `checksum` (FNV-1a over it, and telling the format version), `gojson` (Go's
encoding/json, both ways), `go_cpuset` (k8s.io/utils/cpuset), `cpu_manager` and `memory_manager` (the two
files), `errors`.
"""

from rmd_api.kubelet.checkpoint.checksum import fnv1a_32
from rmd_api.kubelet.checkpoint.cpu_manager import (
    CpuManagerState,
    decode_cpu_manager_state,
    encode_cpu_manager_state_v2,
    encode_cpu_manager_state_v3,
    encode_cpu_manager_state_v4,
)
from rmd_api.kubelet.checkpoint.errors import CheckpointFormatError
from rmd_api.kubelet.checkpoint.go_cpuset import parse_kubelet_cpuset
from rmd_api.kubelet.checkpoint.gospew import GoPtr, GoStruct, GoValue, go_dump_for_hash
from rmd_api.kubelet.checkpoint.memory_manager import (
    MemoryBlock,
    MemoryManagerState,
    MemoryTable,
    NumaNodeMemoryState,
    decode_memory_manager_state,
    encode_memory_manager_state,
    encode_memory_manager_state_v3,
)

__all__ = [
    "CheckpointFormatError",
    "CpuManagerState",
    "GoPtr",
    "GoStruct",
    "GoValue",
    "MemoryBlock",
    "MemoryManagerState",
    "MemoryTable",
    "NumaNodeMemoryState",
    "decode_cpu_manager_state",
    "decode_memory_manager_state",
    "encode_cpu_manager_state_v2",
    "encode_cpu_manager_state_v3",
    "encode_cpu_manager_state_v4",
    "encode_memory_manager_state",
    "encode_memory_manager_state_v3",
    "fnv1a_32",
    "go_dump_for_hash",
    "parse_kubelet_cpuset",
]
