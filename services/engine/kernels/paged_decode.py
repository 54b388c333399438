"""Paged decode attention: one new query token per sequence against its cached K/V.

Split-K (flash-decoding): each sequence's positions are cut into partitions of
`partition_size` tokens. Kernel 1 runs one program per (sequence, KV head, partition):
it loads each K/V tile once for all G = Hq / Hkv query heads sharing that KV head and
keeps an online softmax in fp32, leaving per partition and query head the running max
m_p (base 2), sum-exp l_p and normalized output o_p. Kernel 2 merges a sequence's
partitions: out = sum_p 2^(m_p - M) l_p o_p / sum_p 2^(m_p - M) l_p with M = max_p m_p.
With a single partition kernel 1 writes the output itself.

The grid is (B, Hkv, ceil(W * block_size / partition_size)) from the block-table width W,
a shape: identical shapes launch identical work whatever the lengths, so the launch can be
captured in a CUDA graph. Programs whose partition starts at or past seq_len exit at once
and the merge reads only the partitions below seq_len.

Every seq_len must be >= 1 (a decoding token always sees itself). Positions are mapped to
cache slots one token at a time through the block table, so partitions need not align with
blocks. Padded rows of a graph batch (seq_len 1, block table at the zero block) read zeros
and produce zeros.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from services.engine.kernels.tiling import LOG2E, MIN_DOT_SIZE, attention_warps, kv_tile_size

# Tokens per split-K partition (a multiple of the K/V tile, tiling.kv_tile_size).
PARTITION_SIZE = 256
# Partitions merged per step of kernel 2's loop.
MERGE_BLOCK = 32


@triton.jit
def _partition_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    part_out_ptr,  # (B, Hq, P, D) fp32
    part_max_ptr,  # (B, Hq, P) fp32
    part_sum_ptr,  # (B, Hq, P) fp32
    scale_log2,  # softmax scale * log2(e): scores live in base 2
    block_size,
    num_partitions,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_cb,  # K and V caches share one layout
    stride_cs,
    stride_ch,
    stride_cd,
    stride_tb,
    stride_ob,
    stride_oh,
    stride_od,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PARTITION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_PARTITION: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = part * PARTITION
    if start < seq_len:
        group = tl.arange(0, BLOCK_G)  # (G',) query heads of this KV head, padded
        heads = kv_head * GROUP + group
        head_ok = group < GROUP
        dims = tl.arange(0, HEAD_DIM)  # (D,)
        q = tl.load(
            q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
            mask=head_ok[:, None],
            other=0.0,
        )  # (G', D)
        q = q.to(k_cache_ptr.dtype.element_ty)
        run_max = tl.full((BLOCK_G,), float("-inf"), tl.float32)
        run_sum = tl.zeros((BLOCK_G,), tl.float32)
        acc = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)
        end = tl.minimum(start + PARTITION, seq_len)
        for tile in range(start, end, BLOCK_N):
            positions = tile + tl.arange(0, BLOCK_N)  # (N,)
            valid = positions < end
            blocks = tl.load(block_tables_ptr + seq * stride_tb + positions // block_size, mask=valid, other=0)
            rows = blocks * stride_cb + (positions % block_size) * stride_cs + kv_head * stride_ch  # (N,)
            k = tl.load(
                k_cache_ptr + rows[None, :] + dims[:, None] * stride_cd, mask=valid[None, :], other=0.0
            )  # (D, N)
            scores = tl.dot(q, k, input_precision="ieee") * scale_log2  # (G', N)
            scores = tl.where(valid[None, :], scores, float("-inf"))
            new_max = tl.maximum(run_max, tl.max(scores, 1))  # finite: the tile holds a valid position
            correction = tl.exp2(run_max - new_max)
            probs = tl.exp2(scores - new_max[:, None])  # (G', N)
            run_sum = run_sum * correction + tl.sum(probs, 1)
            v = tl.load(
                v_cache_ptr + rows[:, None] + dims[None, :] * stride_cd, mask=valid[:, None], other=0.0
            )  # (N, D)
            acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision="ieee")
            run_max = new_max
        acc = acc / run_sum[:, None]  # (G', D)
        if SINGLE_PARTITION:
            out = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :] * stride_od
            tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=head_ok[:, None])
        else:
            # Partials are contiguous (B, Hq, P[, D]).
            cell = (seq * (GROUP * tl.num_programs(1)) + heads) * num_partitions + part  # (G',)
            tl.store(part_out_ptr + cell[:, None] * HEAD_DIM + dims[None, :], acc, mask=head_ok[:, None])
            tl.store(part_max_ptr + cell, run_max, mask=head_ok)
            tl.store(part_sum_ptr + cell, run_sum, mask=head_ok)


@triton.jit
def _merge_kernel(
    seq_lens_ptr,
    part_out_ptr,  # (B, Hq, P, D) fp32
    part_max_ptr,  # (B, Hq, P) fp32
    part_sum_ptr,  # (B, Hq, P) fp32
    out_ptr,
    num_partitions,
    stride_ob,
    stride_oh,
    stride_od,
    HEAD_DIM: tl.constexpr,
    PARTITION: tl.constexpr,
    MERGE_BLOCK: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    used = (tl.load(seq_lens_ptr + seq) + PARTITION - 1) // PARTITION  # partitions below seq_len, >= 1
    first = (seq * tl.num_programs(1) + head) * num_partitions  # this (sequence, head)'s partition 0
    dims = tl.arange(0, HEAD_DIM)
    # Partition 0 is always used and starts the running merge: its weight is its own sum-exp.
    run_max = tl.load(part_max_ptr + first)
    run_sum = tl.load(part_sum_ptr + first)
    acc = tl.load(part_out_ptr + first * HEAD_DIM + dims) * run_sum  # (D,)
    for chunk in range(1, used, MERGE_BLOCK):
        parts = chunk + tl.arange(0, MERGE_BLOCK)  # (P',)
        valid = parts < used
        maxes = tl.load(part_max_ptr + first + parts, mask=valid, other=float("-inf"))
        sums = tl.load(part_sum_ptr + first + parts, mask=valid, other=0.0)
        outs = tl.load(
            part_out_ptr + (first + parts)[:, None] * HEAD_DIM + dims[None, :], mask=valid[:, None], other=0.0
        )  # (P', D)
        new_max = tl.maximum(run_max, tl.max(maxes, 0))
        correction = tl.exp2(run_max - new_max)
        weights = tl.exp2(maxes - new_max) * sums  # (P',)
        run_sum = run_sum * correction + tl.sum(weights, 0)
        acc = acc * correction + tl.sum(weights[:, None] * outs, 0)
        run_max = new_max
    out = out_ptr + seq * stride_ob + head * stride_oh + dims * stride_od
    tl.store(out, (acc / run_sum).to(out_ptr.dtype.element_ty))


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    partition_size: int = PARTITION_SIZE,
    block_n: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q (B, Hq, D), caches (N + 1, bs, Hkv, D), block_tables (B, W) int64, seq_lens (B,) int64 >= 1
    -> attention of each query over its sequence's first seq_lens[b] cached positions: (B, Hq, D).
    `block_n` cached positions per K/V tile (default: tiling.kv_tile_size), a power of two >= 16
    dividing `partition_size`. Written into `out` (like q) when given."""
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    block_n = block_n or kv_tile_size(k_cache.dtype)
    if partition_size % block_n:
        raise ValueError(f"partition_size {partition_size} must be a multiple of block_n {block_n}")
    out = torch.empty_like(q) if out is None else out
    if batch == 0:
        return out
    num_partitions = math.ceil(block_tables.shape[1] * block_size / partition_size)
    single = num_partitions == 1
    # (B, Hq, P, D), (B, Hq, P), (B, Hq, P); unused (never touched) with a single partition.
    shape = (batch, num_heads, num_partitions) if not single else (1, 1, 1)
    part_out = torch.empty((*shape, head_dim), dtype=torch.float32, device=q.device)
    part_max = torch.empty(shape, dtype=torch.float32, device=q.device)
    part_sum = torch.empty(shape, dtype=torch.float32, device=q.device)
    group = num_heads // num_kv_heads
    _partition_kernel[(batch, num_kv_heads, num_partitions)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_out,
        part_max,
        part_sum,
        scale * LOG2E,
        block_size,
        num_partitions,
        *q.stride(),
        *k_cache.stride(),
        block_tables.stride(0),
        *out.stride(),
        GROUP=group,
        BLOCK_G=max(MIN_DOT_SIZE, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        PARTITION=partition_size,
        BLOCK_N=block_n,
        SINGLE_PARTITION=single,
        num_warps=attention_warps(k_cache.dtype),
    )
    if not single:
        _merge_kernel[(batch, num_heads)](
            seq_lens,
            part_out,
            part_max,
            part_sum,
            out,
            num_partitions,
            *out.stride(),
            HEAD_DIM=head_dim,
            PARTITION=partition_size,
            MERGE_BLOCK=min(MERGE_BLOCK, triton.next_power_of_2(num_partitions)),
        )
    return out


def paged_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """paged_decode in plain torch, one sequence at a time (without its tiling arguments)."""
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    out = torch.empty_like(q)
    for b, seq_len in enumerate(seq_lens.tolist()):
        blocks = block_tables[b, : -(-seq_len // block_size)]  # (nb,)
        keys = k_cache[blocks].flatten(0, 1)[:seq_len].float().repeat_interleave(group, 1)  # (L, Hq, D)
        values = v_cache[blocks].flatten(0, 1)[:seq_len].float().repeat_interleave(group, 1)  # (L, Hq, D)
        weights = (torch.einsum("hd,lhd->hl", q[b].float(), keys) * scale).softmax(-1)  # (Hq, L)
        out[b] = torch.einsum("hl,lhd->hd", weights, values).to(q.dtype)
    return out
