"""Paged attention on the CPU with the C++ kernel of services/engine/cpu_kernels.

Every new token attends over the cache in place: no per-layer gather of K/V into padded
tensors, which was most of a CPU decode step (34% gather + 10% scatter at 16 sequences,
docs/benchmarks.md). A prefill chunk's tokens are rows of the same kernel, each with its own
causal length, which measured faster than SDPA over the gathered prefix (docs/benchmarks.md).
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
        tables, lens = self._row_tables(ctx)
        return self._kernels.paged_decode(q, k_cache, v_cache, tables, lens, self.scale)  # type: ignore[no-any-return]

    def run_cpu_decoder(
        self, decoder: Any, hidden: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The decoder calls the same store and paged_decode as forward(), with the same row tables."""
        tables, lens = self._row_tables(ctx)
        return decoder.forward(hidden, self.kv_cache.k, self.kv_cache.v, *cos_sin, ctx.slot_mapping, tables, lens)  # type: ignore[no-any-return]

    @staticmethod
    def _row_tables(ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Each new token's block table (T, nb) and the positions it sees (T,), once per batch."""
        if "cpu_row_tables" not in ctx.scratch:
            if ctx.is_decode_only:
                tables, lens = ctx.block_tables, ctx.seq_lens
            else:
                counts = torch.tensor(ctx.query_lens_cpu, device=ctx.block_tables.device)
                tables = ctx.block_tables.repeat_interleave(counts, dim=0)  # (T, nb)
                lens = ctx.positions + 1  # (T,)
            ctx.scratch["cpu_row_tables"] = (tables.contiguous(), lens.contiguous())
        return ctx.scratch["cpu_row_tables"]  # type: ignore[no-any-return]
