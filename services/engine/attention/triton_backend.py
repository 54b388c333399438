"""Paged attention with the Triton kernels of services/engine/kernels/: the CUDA path.

Every forward stores the new K/V first (kv_store), then attends over the cache only:
- a decode-only batch goes to the split-K paged decode kernel, which reads nothing but ctx
  tensors (slot_mapping, block_tables, seq_lens) and sizes its grid from their shapes, so the
  whole forward can be captured in a CUDA graph (`graph_safe_decode`);
- any other batch (prefill chunks, prefix-cache hits, decodes mixed in) goes row for row to the
  extend kernel.
On CPU the kernels run only in Triton's interpreter (tests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from services.engine.attention.backend import AttentionBackend, KVCache
from services.engine.kernels import interpreting, triton_runs_on
from services.engine.kernels.extend_attention import extend_attention
from services.engine.kernels.kv_store import kv_store
from services.engine.kernels.paged_decode import PARTITION_SIZE, paged_decode
from services.engine.kernels.tiling import MIN_DOT_SIZE, kv_tile_size, query_tile_rows

if TYPE_CHECKING:
    from services.engine.attention.context import ForwardContext


def unsupported_reason(head_dim: int, dtype: torch.dtype, device: torch.device) -> str | None:
    """Why the kernels cannot serve a cache of this head size, dtype and device; None if they can."""
    if not triton_runs_on(device):
        return f"the triton attention backend needs a CUDA device, or TRITON_INTERPRET=1 on CPU (device: {device})"
    if head_dim < MIN_DOT_SIZE or head_dim & (head_dim - 1):
        return f"the triton attention backend needs a head_dim that is a power of two >= 16, got {head_dim}"
    if dtype == torch.bfloat16 and interpreting():
        return "Triton's interpreter multiplies bfloat16 matrices wrongly: use float32 or float16 on CPU"
    return None


class TritonAttentionBackend(AttentionBackend):
    graph_safe_decode = True

    def __init__(
        self,
        kv_cache: KVCache,
        scale: float,
        *,
        decode_partition_size: int = PARTITION_SIZE,
        block_n: int | None = None,
        block_rows: int | None = None,
    ) -> None:
        """`decode_partition_size` tokens per split-K partition of the decode kernel; `block_n`
        cached positions per K/V tile (default: tiling.kv_tile_size) and `block_rows` query rows per
        extend program (default: tiling.query_tile_rows), powers of two >= 16 (tests shrink them to
        cross tiles on short sequences)."""
        pool = kv_cache.k[0]  # (N + 1, bs, Hkv, D)
        reason = unsupported_reason(pool.shape[-1], pool.dtype, pool.device)
        if reason is not None:
            raise ValueError(reason)
        tile = block_n or kv_tile_size(pool.dtype)
        for name, size in (("block_n", tile), ("block_rows", block_rows or query_tile_rows(pool.dtype))):
            if size < MIN_DOT_SIZE or size & (size - 1):
                raise ValueError(f"{name} must be a power of two >= {MIN_DOT_SIZE}, got {size}")
        if decode_partition_size % tile:
            raise ValueError(f"decode partition size {decode_partition_size} is not a multiple of the tile {tile}")
        super().__init__(kv_cache, scale)
        self.decode_partition_size = decode_partition_size
        self.block_n = block_n
        self.block_rows = block_rows

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        k_cache = self.kv_cache.k[layer]  # (N + 1, bs, Hkv, D)
        v_cache = self.kv_cache.v[layer]  # (N + 1, bs, Hkv, D)
        kv_store(k, v, k_cache, v_cache, ctx.slot_mapping, self.kv_cache.null_slot)
        if ctx.is_decode_only:
            return paged_decode(
                q,
                k_cache,
                v_cache,
                ctx.block_tables,
                ctx.seq_lens,
                self.scale,
                partition_size=self.decode_partition_size,
                block_n=self.block_n,
            )  # (B, Hq, D)
        return extend_attention(
            q,
            k_cache,
            v_cache,
            ctx.block_tables,
            ctx.query_start_loc,
            ctx.seq_lens,
            self.scale,
            block_rows=self.block_rows,
            block_n=self.block_n,
        )  # (T, Hq, D)
