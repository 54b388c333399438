"""Random paged caches for the attention kernel tests.

Every slot of the managed blocks holds NaN except the positions of the batch's sequences, so a
kernel that reads a slot it should not (past a length, a block-table pad, another sequence's
block) returns NaN; the last block is the cache's zero block, as in KVCache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tests.engine.kernels.kernel_device import DEVICE


@dataclass(frozen=True)
class PagedBatch:
    k_cache: torch.Tensor  # (N + 1, bs, Hkv, D)
    v_cache: torch.Tensor  # (N + 1, bs, Hkv, D)
    block_tables: torch.Tensor  # (B, W) int64, padded with 0 (a poisoned block unless a sequence owns it)
    seq_lens: torch.Tensor  # (B,) int64

    @property
    def null_block(self) -> int:
        return self.k_cache.shape[0] - 1


def random_paged_batch(
    seq_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    generator: torch.Generator,
    *,
    extra_width: int = 0,
    device: torch.device | str = DEVICE,
) -> PagedBatch:
    """Sequences of `seq_lens` cached tokens on random, non-contiguous blocks; the block table is
    `extra_width` blocks wider than the longest needs."""
    needed = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(needed) + 3  # a few blocks nobody owns
    shape = (num_blocks + 1, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    k_cache[num_blocks] = 0
    v_cache[num_blocks] = 0
    free = torch.randperm(num_blocks, generator=generator).tolist()
    width = max(needed) + extra_width
    tables = []
    for seq_len, count in zip(seq_lens, needed, strict=True):
        blocks = [free.pop() for _ in range(count)]
        tables.append(blocks + [0] * (width - count))
        positions = torch.arange(seq_len)
        slots = torch.tensor(blocks, dtype=torch.int64)[positions // block_size] * block_size + positions % block_size
        for cache in (k_cache, v_cache):
            values = torch.randn(seq_len, num_kv_heads, head_dim, generator=generator)  # (L, Hkv, D)
            cache.view(-1, num_kv_heads, head_dim)[slots] = values.to(dtype)
    return PagedBatch(
        k_cache.to(device),
        v_cache.to(device),
        torch.tensor(tables, dtype=torch.int64, device=device),
        torch.tensor(seq_lens, dtype=torch.int64, device=device),
    )
