"""Tile sizes and constants shared by the attention kernels."""

from __future__ import annotations

import torch

# Rows and columns of a tl.dot operand must number at least 16 on NVIDIA GPUs.
MIN_DOT_SIZE = 16
# Softmax in base 2: scores are scaled by log2(e) once, then exp2 replaces exp.
LOG2E = 1.4426950408889634


def kv_tile_size(dtype: torch.dtype) -> int:
    """Cached positions per K/V tile: 64 for 16-bit caches; 32 for float32 ones, whose tiles (and
    the fp32 dot operands staged in shared memory) would otherwise not fit consumer GPUs."""
    return 64 if dtype.itemsize <= 2 else 32


def query_tile_rows(dtype: torch.dtype) -> int:
    """Query rows ((token, head) pairs) per extend-attention program: 64 for 16-bit caches; 32 for
    float32 ones, whose exact (IEEE) dots run on FMA units from registers, not on tensor cores."""
    return 64 if dtype.itemsize <= 2 else 32


def attention_warps(dtype: torch.dtype) -> int:
    """Warps per attention program: 4 for 16-bit caches; 8 for float32 ones. In 4 warps the float32
    tiles spill registers inside the K/V loop on sm_80-sm_100 (`make kernel-report`)."""
    return 4 if dtype.itemsize <= 2 else 8
