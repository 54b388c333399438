"""Paged attention on the CPU with the C++ kernel of services/engine/cpu_kernels.

Every new token attends over the cache in place: no per-layer gather of K/V into padded
tensors, which was most of a CPU decode step (34% gather + 10% scatter at 16 sequences,
docs/benchmarks.md). Decode-only steps use paged_decode (one query token per sequence); a step
with prompt chunks uses paged_prefill, which tiles each sequence's new tokens 16 query vectors
at a time (2-2.3x paged_decode treating each token as its own query, docs/benchmarks.md).
The K/V store is the torch backend's, which is also the reference these kernels are tested
against (tests/engine/test_cpu_attention.py).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from services.engine.attention.backend import KVCache
from services.engine.attention.torch_backend import TorchAttentionBackend

if TYPE_CHECKING:
    from services.engine.attention.context import ForwardContext

DTYPES = (torch.float32, torch.bfloat16)


class CpuAttentionBackend(TorchAttentionBackend):
    def __init__(self, kv_cache: KVCache, scale: float, kernels: ModuleType) -> None:
        super().__init__(kv_cache, scale)
        self._kernels = kernels

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """Every new token, decoding or in a prefill chunk, attends from the cache once this
        step's K/V are stored there: token t of sequence b sees positions 0 .. positions[t] of
        b, which is causal attention over its cached prefix and its own chunk."""
        k_cache = self.kv_cache.k[layer]  # (N, bs, Hkv, D)
        v_cache = self.kv_cache.v[layer]
        self._store(k_cache, v_cache, k, v, ctx.slot_mapping)
        if ctx.is_decode_only:
            return self._kernels.paged_decode(q, k_cache, v_cache, ctx.block_tables, ctx.seq_lens, self.scale)  # type: ignore[no-any-return]
        return self._kernels.paged_prefill(  # type: ignore[no-any-return]
            q, k_cache, v_cache, ctx.block_tables, ctx.seq_lens, ctx.query_start_loc, self.scale
        )

    def run_cpu_decoder(
        self, decoder: Any, hidden: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The decoder calls the same store and attention kernel as forward() (a query start per
        sequence tells it to use paged_prefill)."""
        starts = None if ctx.is_decode_only else ctx.query_start_loc
        return decoder.forward(  # type: ignore[no-any-return]
            hidden, self.kv_cache.k, self.kv_cache.v, *cos_sin, ctx.slot_mapping, ctx.block_tables, ctx.seq_lens, starts
        )
