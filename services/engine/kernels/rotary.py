"""Rotary position embedding of q and k in one launch, cos/sin computed in the kernel.

Same numerics as `layers.RotaryEmbedding` + `layers.apply_rotary` (rotate-half layout, as in
`transformers`): angles = float32(position) * inv_freq and their cos/sin in float32, then cos/sin
rounded to the activation dtype and each product, sum and difference rounded to it, which is what
torch's half-precision elementwise ops do.

One program per token: it computes the token's cos/sin (D/2,) once and rotates all of its q heads
and k heads with them. q (T, Hq, D) and k (T, Hkv, D) may be strided views (they are slices of the
fused qkv output); only the last dim must be contiguous. The results are new contiguous tensors,
as apply_rotary returns, so attention backends see the same layout on both paths; rotating in
place would save no memory traffic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ELEMENTS_PER_WARP = 256  # half-rows x heads a warp rotates at once


@triton.jit
def _rotate_heads(x_ptr, out_ptr, x_stride_h, heads, cos, sin, col, HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr):
    """Rotate one token's `heads` rows (x_ptr: the token's first row) by cos/sin (C,) float32."""
    head = tl.arange(0, BLOCK_HEADS)  # (H,)
    mask = (head < heads)[:, None] & (col < HALF)[None, :]  # (H, C)
    first = x_ptr + head[:, None] * x_stride_h + col[None, :]  # the first half of each head
    x1 = tl.load(first, mask=mask, other=0.0)  # (H, C), activation dtype
    x2 = tl.load(first + HALF, mask=mask, other=0.0)
    dtype = x1.dtype
    cos = cos.to(dtype).to(tl.float32)[None, :]  # (1, C)
    sin = sin.to(dtype).to(tl.float32)[None, :]
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    x1_cos, x2_sin = (x1 * cos).to(dtype).to(tl.float32), (x2 * sin).to(dtype).to(tl.float32)
    x2_cos, x1_sin = (x2 * cos).to(dtype).to(tl.float32), (x1 * sin).to(dtype).to(tl.float32)
    out = out_ptr + head[:, None] * (2 * HALF) + col[None, :]  # out is contiguous (heads, 2 * HALF)
    tl.store(out, (x1_cos - x2_sin).to(dtype), mask=mask)
    tl.store(out + HALF, (x2_cos + x1_sin).to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    positions_ptr,
    inv_freq_ptr,
    q_stride_t,
    q_stride_h,
    k_stride_t,
    k_stride_h,
    q_heads,
    k_heads,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_Q_HEADS: tl.constexpr,
    BLOCK_K_HEADS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK_HALF)  # (C,)
    inv_freq = tl.load(inv_freq_ptr + col, mask=col < HALF, other=0.0)  # (C,) float32
    angle = tl.load(positions_ptr + token).to(tl.float32) * inv_freq  # (C,)
    cos, sin = tl.cos(angle), tl.sin(angle)
    q_token, q_out_token = q_ptr + token * q_stride_t, q_out_ptr + token * q_heads * (2 * HALF)
    k_token, k_out_token = k_ptr + token * k_stride_t, k_out_ptr + token * k_heads * (2 * HALF)
    _rotate_heads(q_token, q_out_token, q_stride_h, q_heads, cos, sin, col, HALF, BLOCK_Q_HEADS)
    _rotate_heads(k_token, k_out_token, k_stride_h, k_heads, cos, sin, col, HALF, BLOCK_K_HEADS)


def rotary_embedding(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q (T, Hq, D), k (T, Hkv, D), positions (T,) int64, inv_freq (D/2,) float32 -> rotated q, k
    (new, contiguous, same dtype)."""
    tokens, q_heads, head_dim = q.shape
    if k.dim() != 3 or k.shape[0] != tokens or k.shape[2] != head_dim or k.dtype != q.dtype:
        raise ValueError(f"k {tuple(k.shape)} {k.dtype} must be (T, Hkv, D) like q {tuple(q.shape)} {q.dtype}")
    if head_dim % 2 or inv_freq.shape != (head_dim // 2,) or inv_freq.dtype != torch.float32:
        raise ValueError(f"inv_freq must be (D/2,) float32 for an even D = {head_dim}, got {inv_freq.shape}")
    if positions.shape != (tokens,):
        raise ValueError(f"positions {tuple(positions.shape)} must be ({tokens},)")
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError(f"q and k need a contiguous last dim, got strides {q.stride()} and {k.stride()}")
    q_out, k_out = (
        torch.empty(q.shape, dtype=q.dtype, device=q.device),
        torch.empty(k.shape, dtype=k.dtype, device=k.device),
    )
    if tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    block_half = triton.next_power_of_2(half)
    block_q_heads = triton.next_power_of_2(q_heads)
    _rotary_kernel[(tokens,)](
        q,
        k,
        q_out,
        k_out,
        positions,
        inv_freq.contiguous(),
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        q_heads,
        k.shape[1],
        HALF=half,
        BLOCK_HALF=block_half,
        BLOCK_Q_HEADS=block_q_heads,
        BLOCK_K_HEADS=triton.next_power_of_2(k.shape[1]),
        num_warps=min(8, max(1, block_q_heads * block_half // ELEMENTS_PER_WARP)),
        # Contracted, `x1 * cos - x2 * sin` becomes one bfloat16 fma on sm_90 and skips the product's
        # rounding that torch does: a fifth of the elements one step off on an H100 (ptx: fma.rn.bf16).
        enable_fp_fusion=False,
    )
    return q_out, k_out


def rotary_embedding_reference(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch ops of layers.RotaryEmbedding.forward and layers.apply_rotary."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = freqs.cos(), freqs.sin()

    def rotate(x: torch.Tensor) -> torch.Tensor:
        c, s = cos.to(x.dtype)[:, None, :], sin.to(x.dtype)[:, None, :]  # (T, 1, D/2)
        x1, x2 = x.chunk(2, dim=-1)  # (T, H, D/2) each
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    return rotate(q), rotate(k)
