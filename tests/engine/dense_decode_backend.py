"""A graph-safe attention backend in plain torch, for tests of CUDA graphs that need no kernel backend.

Its decode path attends every row over all W blocks of its block-table row, masked by the seq_lens
tensor: it reads only ctx tensors and its work depends only on their shapes, so a CUDA graph can
capture it. Prefill (never captured) is the torch backend's. Slower than the torch backend's length
groups, and checked against it in test_cuda_graphs.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from services.engine.attention.torch_backend import TorchAttentionBackend

if TYPE_CHECKING:
    from services.engine.attention.context import ForwardContext


class DenseDecodeBackend(TorchAttentionBackend):
    graph_safe_decode = True

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        if not ctx.is_decode_only:
            return super().forward(layer, q, k, v, ctx)
        k_cache, v_cache = self.kv_cache.k[layer], self.kv_cache.v[layer]  # (N, bs, Hkv, D)
        self._store(k_cache, v_cache, k, v, ctx.slot_mapping)
        batch, num_heads, head_dim = q.shape
        block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
        positions = torch.arange(ctx.block_tables.shape[1] * block_size, device=q.device)  # (L,)
        slots = ctx.block_tables[:, positions // block_size] * block_size + positions % block_size  # (B, L)
        valid = positions[None, :] < ctx.seq_lens[:, None]  # (B, L)
        slots = torch.where(valid, slots, self.kv_cache.null_slot)
        keys = k_cache.view(-1, num_kv_heads, head_dim)[slots]  # (B, L, Hkv, D)
        values = v_cache.view(-1, num_kv_heads, head_dim)[slots]  # (B, L, Hkv, D)
        queries = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)  # (B, Hkv, G, D)
        out = F.scaled_dot_product_attention(
            queries,
            keys.transpose(1, 2),  # (B, Hkv, L, D)
            values.transpose(1, 2),  # (B, Hkv, L, D)
            attn_mask=valid[:, None, None, :],  # (B, 1, 1, L)
            scale=self.scale,
        )  # (B, Hkv, G, D)
        return out.reshape(batch, num_heads, head_dim)
