"""The attention-backend interface: store new K/V in the paged cache, attend over it.

Implementations: `torch_backend.TorchAttentionBackend` (portable, CPU and CUDA,
the reference in tests) and `triton_backend.TritonAttentionBackend` (the kernels
of services/engine/kernels/, for CUDA; interpreted on CPU in tests).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from services.engine import huge_pages

if TYPE_CHECKING:
    from services.engine.attention.context import ForwardContext


class KVCache:
    """Preallocated paged K/V pools, one pair per layer: (num_blocks + 2, block_size, num_kv_heads, head_dim).

    block               owner            contents
    0 .. num_blocks-1   block manager    K/V of the requests
    num_blocks          nobody           zero, never written: read through `null_slot` by
                                         padding, instead of another request's stale
                                         (possibly NaN) K/V
    num_blocks + 1      nobody           scratch, written only and never read: the K/V of
                                         padded rows (a CUDA graph's unused rows) go to
                                         `scratch_slot`, so they cannot dirty the zero block
    """

    # Blocks past the block manager's: the zero block and the scratch block.
    NUM_EXTRA_BLOCKS: ClassVar[int] = 2

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_blocks + self.NUM_EXTRA_BLOCKS, block_size, num_kv_heads, head_dim)
        self.k = [_pool(shape, dtype, device) for _ in range(num_layers)]
        self.v = [_pool(shape, dtype, device) for _ in range(num_layers)]
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.null_block = num_blocks
        self.null_slot = num_blocks * block_size  # first slot of the zero block
        self.scratch_slot = (num_blocks + 1) * block_size  # first slot of the scratch block

    def copy_block(self, src: int, dst: int) -> None:
        """Copy block src's K/V into block dst in every layer (a forked beam's own copy of a partial block)."""
        for pool in (*self.k, *self.v):
            pool[dst].copy_(pool[src])

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        element = torch.tensor([], dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * element


def _pool(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One layer's zeroed K or V pool; on the CPU in huge pages (services/engine/huge_pages.py), since
    every decode step reads each sequence's blocks of every layer."""
    if device.type == "cpu":
        return huge_pages.zeros(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


class AttentionBackend(ABC):
    # True when a decode-only forward reads only tensors of its ForwardContext (never the host
    # lists query_lens_cpu / seq_lens_cpu or values derived from them) and launches the same
    # work for the same tensor shapes: it can then be captured in a CUDA graph and replayed
    # with new tensor contents.
    graph_safe_decode: ClassVar[bool] = False

    def __init__(self, kv_cache: KVCache, scale: float) -> None:
        self.kv_cache = kv_cache
        self.scale = scale

    def run_cpu_decoder(
        self, decoder: Any, hidden: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Every decoder layer of a forward in one call of cpu_kernels' CpuDecoder `decoder`, attending
        the way this backend does: (hidden, residual) after the last layer, or None where this backend
        cannot (the model then runs its layers one by one through forward())."""
        return None

    @abstractmethod
    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """Store k/v (T, Hkv, D) at ctx.slot_mapping in layer `layer`'s cache, then return
        causal attention of q (T, Hq, D) over each sequence's cached tokens: (T, Hq, D).
        Hq is a multiple of Hkv (grouped-query attention)."""
