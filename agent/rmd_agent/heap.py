"""Give the C heap's free pages back to the kernel once the agent's start-up is over.

The first refreshes (the PodResources List of every pod, the NodeResourceTopology, the power collector's
cgroup scan) allocate and free megabytes in the C heap. glibc keeps freed chunks below the heap's top mapped,
so they would count in the agent's RSS, and against its memory limit, for as long as it runs. `malloc_trim(0)`
returns every free page of every arena to the kernel; once is enough, as steady state reuses what it keeps.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

START_UP_SECONDS = 15.0  # after serving started: the first NRT, RmdNodeState and power refreshes are done


def release_freed_heap() -> bool:
    """malloc_trim(0); False where the C library has none (musl, macOS) or nothing was released."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    released = bool(trim(0))
    log.debug("malloc_trim after start-up: %s", "memory released" if released else "nothing to release")
    return released
