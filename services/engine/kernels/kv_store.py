"""Storing new tokens' K and V into one layer's paged caches, in one launch for both.

Cache layout (see attention/backend.py KVCache): (blocks, block_size, Hkv, D); token t goes
to slot slot_mapping[t] = block * block_size + offset. Only slots 0 .. num_slots - 1 (the
requests' blocks) are written: a negative slot (a padding mark) or one past them (the zero or
scratch block) is skipped, so padded rows of a CUDA-graph batch can never dirty the zero block
whichever they point at.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_store_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    block_size,
    num_slots,  # writable slots: the requests' blocks
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_cb,  # K and V caches share one layout
    stride_cs,
    stride_ch,
    stride_cd,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    heads = tl.arange(0, BLOCK_H)  # (BLOCK_H,)
    dims = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    # No head at all for a slot that is not written (a scalar condition folded into the bound:
    # Triton's interpreter mistypes a scalar mask combined with a tensor one).
    num_written = tl.where((slot >= 0) & (slot < num_slots), NUM_HEADS, 0)
    mask = (heads[:, None] < num_written) & (dims[None, :] < HEAD_DIM)  # (BLOCK_H, BLOCK_D)
    k = tl.load(k_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :] * stride_kd, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :] * stride_vd, mask=mask)
    # (BLOCK_H, BLOCK_D) offsets of this token's slot in either cache
    cache = (slot // block_size) * stride_cb + (slot % block_size) * stride_cs
    cache += heads[:, None] * stride_ch + dims[None, :] * stride_cd
    tl.store(k_cache_ptr + cache, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + cache, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def kv_store(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_slots: int,
) -> None:
    """Write k/v (T, Hkv, D) into k_cache/v_cache (blocks, bs, Hkv, D) at slot_mapping (T,) int64,
    cast to the cache dtype; slots outside 0 .. num_slots - 1 are skipped."""
    num_tokens, num_heads, head_dim = k.shape
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError(f"K and V caches differ: {tuple(k_cache.shape)} vs {tuple(v_cache.shape)}")
    if num_tokens == 0:
        return
    block_size = k_cache.shape[1]
    _kv_store_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        block_size,
        num_slots,
        *k.stride(),
        *v.stride(),
        *k_cache.stride(),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )


def kv_store_reference(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_slots: int,
) -> None:
    """kv_store in plain torch."""
    num_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    writable = (slot_mapping >= 0) & (slot_mapping < num_slots)  # (T,)
    slots = slot_mapping[writable]
    k_cache.view(-1, num_heads, head_dim).index_copy_(0, slots, k[writable].to(k_cache.dtype))  # (slots, Hkv, D)
    v_cache.view(-1, num_heads, head_dim).index_copy_(0, slots, v[writable].to(v_cache.dtype))
