"""rmd_agent.heap: the start-up burst's freed C heap goes back to the kernel (checked on this machine's libc,
in a fresh interpreter so that the test process's own heap does not blur the figures)."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, sys
from rmd_agent.heap import release_freed_heap

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

# 64 MiB of 16 KiB buffers, under glibc's mmap threshold, so in the heap; all but the last one freed, which
# pins the heap's top so that free() alone cannot shrink it.
buffers = [bytearray(16 * 1024) for _ in range(4096)]
keep = buffers[-1]
del buffers
before = rss_kib()
released = release_freed_heap()
print(json.dumps({"before": before, "after": rss_kib(), "released": released}))
"""


def test_freed_heap_pages_leave_the_rss() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["released"] is True  # glibc, as in the agent's image
    assert result["before"] - result["after"] > 32 * 1024, result  # most of the 64 MiB went back
