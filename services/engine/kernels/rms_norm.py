"""RMSNorm, and residual add + RMSNorm, in one pass over each row.

Numerics are those of `layers.RMSNorm` (Hugging Face `transformers`), step for step:
  summed = x + residual            rounded to the activation dtype (the residual stream's dtype)
  normed = summed * rsqrt(mean(summed^2) + eps)   in float32, then rounded to the activation dtype
  out    = weight * normed         in the promoted dtype of weight and activation
Each product and sum is taken in float32 and rounded once to its dtype, which is what torch does
for half-precision elementwise ops, so results match the torch path bit for bit up to the
float32 reduction order and rsqrt (fp32: ~1e-6; fp16 and bf16 on a GPU: one ulp at most; fp16
is bit-identical in the interpreter). Triton's interpreter rounds float32 -> bfloat16 toward zero
instead of to nearest even, so on CPU bf16 results are a few ulps off (tests allow four).

Rows are the leading dims of x: (rows, dim) for hidden states, or (T, H, D) for Qwen3's per-head
q/k norm, where q and k are non-contiguous views of the fused qkv output; only the last dim has
to be contiguous. Outputs are new contiguous tensors (writing into an input saves no traffic).
A row is one tile in registers, so dim is limited to MAX_DIM; small rows share a program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_DIM = 32768  # a whole row lives in one program's registers
ELEMENTS_PER_PROGRAM = 4096  # rows of dim < this share a program, up to this many elements


# One compiled variant per (dim, dtype, strides) whatever the row count, so a CUDA-graph capture
# over many batch sizes never compiles mid-capture once one size has run.
@triton.jit(do_not_specialize=["rows"])
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    summed_ptr,
    rows,
    heads,
    dim,
    x_stride_t,
    x_stride_h,
    residual_stride_t,
    residual_stride_h,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
):
    # Row r of the flattened (rows = T * heads, dim) view is x[r // heads, r % heads, :].
    row = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # (R,)
    col = tl.arange(0, BLOCK_DIM)  # (C,)
    mask = (row < rows)[:, None] & (col < dim)[None, :]  # (R, C)
    token, head = row // heads, row % heads
    x_at = x_ptr + (token * x_stride_t + head * x_stride_h)[:, None] + col[None, :]
    x = tl.load(x_at, mask=mask, other=0.0)  # (R, C), activation dtype
    dtype = x.dtype
    if HAS_RESIDUAL:
        residual_at = residual_ptr + (token * residual_stride_t + head * residual_stride_h)[:, None] + col[None, :]
        residual = tl.load(residual_at, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(dtype)
        tl.store(summed_ptr + row[:, None] * dim + col[None, :], x, mask=mask)
    x32 = x.to(tl.float32)
    mean_square = tl.sum(x32 * x32, axis=1) / dim  # (R,); masked columns hold 0
    normed = (x32 * tl.rsqrt(mean_square + eps)[:, None]).to(dtype)  # (R, C)
    weight = tl.load(weight_ptr + col, mask=col < dim, other=0.0)  # (C,)
    out = normed.to(tl.float32) * weight.to(tl.float32)[None, :]
    tl.store(out_ptr + row[:, None] * dim + col[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (rows, dim) or (T, H, dim), weight (dim,) -> normalised, same shape, contiguous."""
    out, _ = _launch(x, None, weight, eps)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual (rows, dim) -> (norm(x + residual), x + residual), both new and contiguous."""
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}")
    out, summed = _launch(x, residual, weight, eps)
    assert summed is not None
    return out, summed


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    dim = x.shape[-1]
    if x.dim() not in (2, 3) or weight.shape != (dim,):
        raise ValueError(
            f"x {tuple(x.shape)} must be (rows, dim) or (T, H, dim) with weight (dim,), got {weight.shape}"
        )
    if dim > MAX_DIM:
        raise ValueError(f"rms_norm handles rows of at most {MAX_DIM} elements, got {dim}")
    x3 = _as_3d(x)  # (T, H, dim)
    residual3 = _as_3d(residual) if residual is not None else x3
    weight = weight.contiguous()
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    summed = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else None
    rows = x3.shape[0] * x3.shape[1]
    if rows == 0:
        return out, summed
    block_dim = triton.next_power_of_2(dim)
    block_rows = max(1, ELEMENTS_PER_PROGRAM // block_dim)
    _rms_norm_kernel[(triton.cdiv(rows, block_rows),)](
        x3,
        residual3,
        weight,
        out,
        summed if summed is not None else out,
        rows,
        x3.shape[1],
        dim,
        x3.stride(0),
        x3.stride(1),
        residual3.stride(0),
        residual3.stride(1),
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK_ROWS=block_rows,
        BLOCK_DIM=block_dim,
        num_warps=min(16, max(1, block_rows * block_dim // 256)),
    )
    return out, summed


def _as_3d(x: torch.Tensor) -> torch.Tensor:
    """(rows, dim) -> (rows, 1, dim) view; (T, H, dim) as is. The last dim must be contiguous."""
    if x.stride(-1) != 1:
        raise ValueError(f"the last dim must be contiguous, got strides {x.stride()}")
    return x.unsqueeze(1) if x.dim() == 2 else x


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The torch ops of layers.RMSNorm.forward."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch ops of layers.RMSNorm.add_forward."""
    summed = x + residual
    return rms_norm_reference(summed, weight, eps), summed
