"""CPU tensors backed by 2 MB pages: the memory a CPU decode step streams through.

A decode step reads every packed weight and every layer's K/V once (~480 MB for the default
model at 64 sequences of ~190 positions, ~270 MB at batch 1), spread over thousands of 4 KB
pages, so the CPU keeps walking page tables and its prefetchers stop at every 4 KB boundary.
Linux backs memory with transparent huge pages where a mapping asks for them
(`/sys/kernel/mm/transparent_hugepage/enabled` = madvise, the common default) or always; torch's
allocator asks only when `THP_MEM_ALLOC_ENABLE=1` is set before its first allocation, which an
engine inside another program cannot count on. So the engine's large, long-lived CPU tensors
(the KV cache, the packed weights) come from their own anonymous mappings, advised before the
first write. On this project's 2-core machine that made a batch-1 bfloat16 decode step 10-15%
faster (docs/benchmarks.md). Where THP is off (`never`) or madvise is refused, the mapping is
plain 4 KB pages: the same memory, the same results.
"""

from __future__ import annotations

import contextlib
import math
import mmap

import torch


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor of `shape` in its own mapping, advised for huge pages, its pages faulted in.

    The tensor holds the mapping alive (torch.frombuffer keeps a reference to it) and returns it
    to the OS when the tensor goes: nothing to free by hand."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # zero-filled
    advice = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only
    if advice is not None:
        with contextlib.suppress(OSError):  # THP compiled out of the kernel: plain pages
            region.madvise(advice)
    tensor = torch.frombuffer(region, dtype=dtype, count=math.prod(shape)).view(shape)
    # Fault every page in now, as torch.zeros does: left to the first steps, the kernel's zeroing of
    # each new 2 MB page landed inside them (a fresh engine's first 8,192-token run went 516 tok/s
    # against 556-594 for runs after it).
    tensor.zero_()
    return tensor


def copy_of(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s contents in a huge-page mapping (a contiguous copy)."""
    out = zeros(tuple(tensor.shape), tensor.dtype)
    out.copy_(tensor)
    return out
