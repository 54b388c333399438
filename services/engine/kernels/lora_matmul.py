"""The grouped LoRA matmul (S-LoRA / Punica SGMV): every adapter segment of a step in one launch each
for the shrink (x @ A) and the expand (@ B), whatever the number of adapters.

Layouts are those of lora/weights.py and lora/batch.py:

    x        (T, in)            the step's activations, all tokens
    a        (S, in, W)         per slot, W = n_shards * max_rank
    b        (S, W, out)        per slot, scaling folded in, block diagonal over the shards
    order    (L,)               adapter tokens grouped by slot; segment g is order[seg_starts[g] : seg_starts[g+1]]
    mid      (L, W) float32     x[order] @ a[slot of its segment]
    result   (L, out) float32   mid @ b[slot], in `order` (the caller adds it into the base output)

Program (g, m[, n]) handles rows m*BLOCK_M.. of segment g (rows past the segment's end are masked):
the grid's second axis is sized by the longest segment, so short segments leave programs idle
rather than a launch per adapter. Products and accumulation are float32 throughout (tl.dot in
"ieee" precision: Triton's default on NVIDIA is tf32, ten mantissa bits, which missed the reference
by 1e-3 relative on an H100), one rounding at the end (the caller's cast), so results match
`grouped_matmul_reference` within float32 sums.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.engine.lora.batch import LoraBatch

BLOCK_M = 16  # tokens per program (tl.dot's smallest tile)
BLOCK_K = 32  # input features per step of the shrink's loop
BLOCK_N = 64  # output features per expand program


@triton.jit(do_not_specialize=["in_features"])
def _shrink_kernel(
    x_ptr,
    a_ptr,
    order_ptr,
    seg_starts_ptr,
    seg_slots_ptr,
    mid_ptr,
    in_features,
    width,
    x_stride,
    a_stride_s,
    a_stride_k,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    g = tl.program_id(0)
    start = tl.load(seg_starts_ptr + g)
    end = tl.load(seg_starts_ptr + g + 1)
    slot = tl.load(seg_slots_ptr + g).to(tl.int64)
    rows = start + tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # (M,) positions in order
    row_ok = rows < end
    tokens = tl.load(order_ptr + rows, mask=row_ok, other=0).to(tl.int64)  # (M,)
    cols = tl.arange(0, BLOCK_W)  # (W,)
    acc = tl.zeros((BLOCK_M, BLOCK_W), dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)  # (K,)
        k_ok = ks < in_features
        x = tl.load(x_ptr + tokens[:, None] * x_stride + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        a_at = a_ptr + slot * a_stride_s + ks[:, None] * a_stride_k + cols[None, :]
        a = tl.load(a_at, mask=k_ok[:, None] & (cols < width)[None, :], other=0.0)
        acc += tl.dot(x.to(tl.float32), a.to(tl.float32), input_precision="ieee")
    tl.store(mid_ptr + rows[:, None] * width + cols[None, :], acc, mask=row_ok[:, None] & (cols < width)[None, :])


@triton.jit(do_not_specialize=["out_features"])
def _expand_kernel(
    mid_ptr,
    b_ptr,
    seg_starts_ptr,
    seg_slots_ptr,
    out_ptr,
    width,
    out_features,
    b_stride_s,
    b_stride_k,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    g = tl.program_id(0)
    start = tl.load(seg_starts_ptr + g)
    end = tl.load(seg_starts_ptr + g + 1)
    slot = tl.load(seg_slots_ptr + g).to(tl.int64)
    rows = start + tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # (M,)
    row_ok = rows < end
    ws = tl.arange(0, BLOCK_W)  # (W,)
    w_ok = ws < width
    ns = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)  # (N,)
    n_ok = ns < out_features
    mid = tl.load(mid_ptr + rows[:, None] * width + ws[None, :], mask=row_ok[:, None] & w_ok[None, :], other=0.0)
    b_at = b_ptr + slot * b_stride_s + ws[:, None] * b_stride_k + ns[None, :]
    b = tl.load(b_at, mask=w_ok[:, None] & n_ok[None, :], other=0.0)
    acc = tl.dot(mid, b.to(tl.float32), input_precision="ieee")  # (M, N)
    tl.store(out_ptr + rows[:, None] * out_features + ns[None, :], acc, mask=row_ok[:, None] & n_ok[None, :])


def lora_grouped_matmul(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, batch: LoraBatch) -> torch.Tensor:
    """x (T, in), a (S, in, W), b (S, W, out) -> the batch's adapter tokens' x @ a[slot] @ b[slot],
    (L, out) float32 in `batch.order`."""
    assert x.stride(1) == 1 and a.stride(2) == 1 and b.stride(2) == 1, "last dims must be contiguous"
    num_tokens, groups = batch.num_tokens, len(batch.segments)
    width, out_features = a.shape[2], b.shape[2]
    block_w = max(16, triton.next_power_of_2(width))
    mid = torch.empty(num_tokens, width, dtype=torch.float32, device=x.device)  # (L, W)
    out = torch.empty(num_tokens, out_features, dtype=torch.float32, device=x.device)  # (L, out)
    tiles = triton.cdiv(batch.max_segment, BLOCK_M)
    _shrink_kernel[(groups, tiles)](
        x, a, batch.order, batch.seg_starts, batch.seg_slots, mid,
        x.shape[1], width, x.stride(0), a.stride(0), a.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, BLOCK_W=block_w,
    )  # fmt: skip
    _expand_kernel[(groups, tiles, triton.cdiv(out_features, BLOCK_N))](
        mid, b, batch.seg_starts, batch.seg_slots, out,
        width, out_features, b.stride(0), b.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_W=block_w,
    )  # fmt: skip
    return out
