"""One adapted projection's LoRA weights for every adapter slot, and the grouped matmul that applies them.

A fused projection (qkv_proj: q, k, v; gate_up_proj: gate, up) holds one checkpoint projection per
row slice of its output (MergedLinear.shard_rows). Its LoRA is stored as one A and one B per slot,
with the shards side by side along the rank:

    a[slot]   (in, n_shards * R)    columns j*R .. j*R+r-1: shard j's A.T (r <= R = --max-lora-rank),
                                    the rest zero
    b[slot]   (n_shards * R, out)   rows j*R .. j*R+r-1: scaling * shard j's B.T, placed in shard j's
                                    output columns only (block diagonal), the rest zero

so every adapter of every slot is one x @ a[slot] @ b[slot] whatever its rank and targets: a projection
an adapter does not adapt, or a free slot, is all zeros. The zero padding of the rank costs arithmetic
(R / r times the least, a small share of the base matmul at serving ranks) and buys one uniform pass.
"""

from __future__ import annotations

import torch

from services.engine.kernels import triton_runs_on
from services.engine.lora.batch import LoraBatch

# Where the stacked ranks of all slots (S * W) are at most this wide, the torch path multiplies every
# token by every slot's A and B at once and masks (see _dense): on a CPU the per-adapter loop's small
# matmuls, gathers and scatters cost more than the extra columns, which at serving ranks are a small
# share of the base matmul. Wider, the per-adapter loop (grouped_matmul_reference) serves.
DENSE_MAX_WIDTH = 512


class LoraWeights:
    def __init__(
        self,
        in_features: int,
        shard_sizes: tuple[int, ...],
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.shard_sizes = shard_sizes
        self.max_rank = max_rank
        width = len(shard_sizes) * max_rank
        self.num_slots, self.width = num_slots, width
        # a is a (S, in, W) view of one (in, S * W) matrix, and b one (S * W, out) matrix viewed
        # (S, W, out): the dense pass below multiplies every slot at once without a copy.
        self._a_all = torch.zeros(in_features, num_slots * width, dtype=dtype, device=device)
        self.a = self._a_all.view(in_features, num_slots, width).permute(1, 0, 2)  # (S, in, W)
        self.b = torch.zeros(num_slots, width, sum(shard_sizes), dtype=dtype, device=device)
        self._b_all = self.b.view(num_slots * width, -1)  # (S * W, out)
        # Where CUDA runs Triton, the grouped kernel (kernels/lora_matmul.py); the torch loop elsewhere.
        self.use_kernel = device.type == "cuda" and triton_runs_on(device)

    def write(self, slot: int, shards: list[tuple[torch.Tensor, torch.Tensor] | None], scaling: float) -> None:
        """Fill `slot` with one (A (r, in), B (out_j, r)) per shard, None for a shard left unadapted."""
        a = torch.zeros_like(self.a[slot])  # (in, n_shards * R)
        b = torch.zeros_like(self.b[slot])  # (n_shards * R, out)
        row = 0
        for j, (size, pair) in enumerate(zip(self.shard_sizes, shards, strict=True)):
            if pair is not None:
                lora_a, lora_b = pair
                rank, col = lora_a.shape[0], j * self.max_rank
                a[:, col : col + rank] = lora_a.T.to(a.dtype)
                # Scaled in float32 before the one rounding to the model dtype, as PEFT's merge does.
                b[col : col + rank, row : row + size] = (lora_b.float() * scaling).T.to(b.dtype)
            row += size
        self.a[slot].copy_(a)
        self.b[slot].copy_(b)

    def clear(self, slot: int) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()

    def add_to(self, y: torch.Tensor, x: torch.Tensor, batch: LoraBatch) -> torch.Tensor:
        """y (T, out) += each adapter token's x (T, in) @ a[slot] @ b[slot]; returns y (changed in place)."""
        if self.use_kernel:
            from services.engine.kernels.lora_matmul import lora_grouped_matmul

            delta = lora_grouped_matmul(x, self.a, self.b, batch)  # (L, out)
        elif self.num_slots * self.width <= DENSE_MAX_WIDTH and x.dtype == y.dtype == self.b.dtype:
            return self._add_dense(y, x, batch)
        else:
            delta = grouped_matmul_reference(x, self.a, self.b, batch)
        return y.index_add_(0, batch.order, delta.to(y.dtype))

    def _add_dense(self, y: torch.Tensor, x: torch.Tensor, batch: LoraBatch) -> torch.Tensor:
        """Every token through every slot at once, each keeping only its own slot's rank columns (base
        tokens none): two matmuls and a mask (three calls: a decode step's cost is their dispatch)
        instead of a pair of matmuls per adapter plus a gather and a scatter. The masked columns are
        exact zeros, so the sums equal the grouped pass's."""
        mid = x @ self._a_all  # (T, S * W)
        mid.view(-1, self.num_slots, self.width).mul_(batch.slot_mask(self.num_slots, mid.dtype)[:, :, None])
        return y.addmm_(mid, self._b_all)  # (T, out)


def grouped_matmul_reference(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, batch: LoraBatch) -> torch.Tensor:
    """The LoRA terms of the batch's adapter tokens, in `batch.order`: (L, out). One pair of matmuls per
    adapter segment (never one per request); the torch reference the Triton kernel is tested against."""
    xs = x.index_select(0, batch.order)  # (L, in)
    out = x.new_empty(xs.shape[0], b.shape[2])  # (L, out)
    for slot, start, end in batch.segments:
        out[start:end] = (xs[start:end] @ a[slot]) @ b[slot]  # (n, in) @ (in, W) @ (W, out)
    return out
