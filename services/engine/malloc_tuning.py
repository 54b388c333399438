"""glibc malloc settings for a CPU engine: a step's temporaries reuse memory instead of faulting it in.

Every CPU step allocates and frees the same large temporaries (a 64-row step's logits are 12.6 MB
in float32, a 2,048-token prefill chunk's MLP activations 12.6 MB in bfloat16). glibc serves an
allocation above its mmap threshold (128 KB, raised on the fly to at most 32 MB) with a fresh
mapping and unmaps it on free, and it hands the top of its heap back to the OS once more than
the trim threshold is free, so the next step touches new pages again: the kernel zeroes and
maps every 4 KB of them (157,000-874,000 page faults in one `make bench-engine` throughput run
of 8,192 tokens). With the mmap threshold fixed at its 32 MB maximum and a 512 MB trim
threshold, the same run took 7,000-13,600 faults and went 503-509 -> 524-559 tokens/s
(alternating runs, same machine; docs/benchmarks.md). The price: up to 512 MB of freed heap
stays with the process instead of going back to the OS.

Process-wide and glibc-only: elsewhere (musl, macOS) `tune()` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger(__name__)

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest on 64-bit: allocations below come from the heap
TRIM_THRESHOLD_BYTES = 512 << 20  # freed heap kept for the next step's temporaries


@functools.cache
def tune() -> bool:
    """Apply the settings once per process; True where glibc took them."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
        gnu_libc = getattr(libc, "gnu_get_libc_version", None)
    except OSError:
        mallopt = gnu_libc = None
    if mallopt is None or gnu_libc is None:
        log.info("malloc left as it is: not glibc")
        return False
    # mallopt returns 1 on success, 0 on error.
    applied = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    applied = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and applied
    if not applied:
        log.warning("glibc refused the malloc settings; step temporaries keep faulting pages in")
    return applied
