"""Paged attention on the CPU with the C++ decode kernel (services/engine/cpu_kernels).

Decoding sequences attend over the cache in place: no per-layer gather of K/V into padded
tensors, which was most of a CPU decode step (34% gather + 10% scatter at 16 sequences,
docs/benchmarks.md). Prefill chunks and the K/V store are the torch backend's, which is also
the reference these kernels are tested against (tests/engine/test_cpu_attention.py).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

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

    def _decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """q (b, Hq, D): one token of each decoding sequence of ctx, in batch order -> (b, Hq, D)."""
        tables, lens = self._decoding_tables(ctx)
        return self._kernels.paged_decode(q, k_cache, v_cache, tables, lens, self.scale)  # type: ignore[no-any-return]

    @staticmethod
    def _decoding_tables(ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Block tables (b, nb) and lengths (b,) of the decoding sequences, once per batch."""
        if "cpu_decode_tables" not in ctx.scratch:
            if ctx.is_decode_only:
                tables, lens = ctx.block_tables, ctx.seq_lens
            else:
                subset = ctx.scratch["decoding_seqs"]
                tables, lens = ctx.block_tables[subset], ctx.seq_lens[subset]
            ctx.scratch["cpu_decode_tables"] = (tables.contiguous(), lens.contiguous())
        return ctx.scratch["cpu_decode_tables"]  # type: ignore[no-any-return]
