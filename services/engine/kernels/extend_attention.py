"""Prefill / extend attention over the paged cache for a varlen batch (see attention/context.py).

Sequence b brings q_b = query_start_loc[b+1] - query_start_loc[b] new tokens (rows of q) and
has seq_lens[b] tokens in the cache, its new ones included (stored first by kv_store). New
token i sits at position seq_lens[b] - q_b + i and sees cache positions 0 .. that one, so
chunked prefill, prefix-cache hits and decode rows (q_b = 1) are all the same case. K and V
are read from the cache only, through the block table, one position at a time.

One program handles a tile of BLOCK_Q new tokens of one sequence for the G = Hq / Hkv query
heads of one KV head: its query rows are (token, head) pairs, row r = token r // G' and head
r % G' (G' = G padded to a power of two), so every K/V tile is loaded once for the group.

Programs are numbered without any host-side plan: sequence b owns program ids from
first(b) = query_start_loc[b] // BLOCK_Q + b up to first(b+1) - 1, which is at least
ceil(q_b / BLOCK_Q) of them; a program finds its sequence by binary search over first()
and exits when its tile starts past q_b. The grid, (T // BLOCK_Q + B, Hkv), depends on
shapes only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.engine.kernels.tiling import LOG2E, MIN_DOT_SIZE, attention_warps, kv_tile_size, query_tile_rows


@triton.jit
def _extend_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    scale_log2,  # softmax scale * log2(e): scores live in base 2
    num_seqs,
    block_size,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_cb,  # K and V caches share one layout
    stride_cs,
    stride_ch,
    stride_cd,
    stride_tb,
    stride_ot,
    stride_oh,
    stride_od,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    program = tl.program_id(0)
    kv_head = tl.program_id(1)
    # The last sequence b with first(b) <= program: first() is increasing and first(0) = 0.
    low = program * 0
    high = low + num_seqs - 1
    while low < high:
        middle = (low + high + 1) // 2
        starts_before = tl.load(query_start_loc_ptr + middle) // BLOCK_Q + middle <= program
        low = tl.where(starts_before, middle, low)
        high = tl.where(starts_before, high, middle - 1)
    seq = low.to(tl.int64)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tile_start = (program - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # first new token of this tile
    if tile_start < q_len:
        seq_len = tl.load(seq_lens_ptr + seq)
        prefix = seq_len - q_len
        rows = tl.arange(0, BLOCK_Q * BLOCK_G)  # (R,)
        tokens = tile_start + rows // BLOCK_G  # (R,) index among the sequence's new tokens
        group = rows % BLOCK_G
        heads = kv_head * GROUP + group
        row_ok = (tokens < q_len) & (group < GROUP)
        dims = tl.arange(0, HEAD_DIM)  # (D,)
        q_rows = (q_start + tokens) * stride_qt + heads * stride_qh  # (R,)
        q = tl.load(q_ptr + q_rows[:, None] + dims[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)  # (R, D)
        q = q.to(k_cache_ptr.dtype.element_ty)
        row_positions = prefix + tokens  # (R,)
        run_max = tl.full((BLOCK_Q * BLOCK_G,), float("-inf"), tl.float32)
        run_sum = tl.zeros((BLOCK_Q * BLOCK_G,), tl.float32)
        acc = tl.zeros((BLOCK_Q * BLOCK_G, HEAD_DIM), tl.float32)
        # Positions up to the tile's last token (causal), never past the sequence.
        end = tl.minimum(prefix + tile_start + BLOCK_Q, seq_len)
        for tile in range(0, end, BLOCK_N):
            positions = tile + tl.arange(0, BLOCK_N)  # (N,)
            valid = positions < end
            blocks = tl.load(block_tables_ptr + seq * stride_tb + positions // block_size, mask=valid, other=0)
            slots = blocks * stride_cb + (positions % block_size) * stride_cs + kv_head * stride_ch  # (N,)
            k = tl.load(
                k_cache_ptr + slots[None, :] + dims[:, None] * stride_cd, mask=valid[None, :], other=0.0
            )  # (D, N)
            scores = tl.dot(q, k, input_precision="ieee") * scale_log2  # (R, N)
            visible = valid[None, :] & (positions[None, :] <= row_positions[:, None])  # (R, N)
            scores = tl.where(visible, scores, float("-inf"))
            # Finite: position 0 in the first tile is visible to every row, padding rows included.
            new_max = tl.maximum(run_max, tl.max(scores, 1))
            correction = tl.exp2(run_max - new_max)
            probs = tl.exp2(scores - new_max[:, None])  # (R, N)
            run_sum = run_sum * correction + tl.sum(probs, 1)
            v = tl.load(
                v_cache_ptr + slots[:, None] + dims[None, :] * stride_cd, mask=valid[:, None], other=0.0
            )  # (N, D)
            acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision="ieee")
            run_max = new_max
        out_rows = (q_start + tokens) * stride_ot + heads * stride_oh  # (R,)
        out = out_ptr + out_rows[:, None] + dims[None, :] * stride_od
        tl.store(out, (acc / run_sum[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    block_rows: int | None = None,
    block_n: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q (T, Hq, D), caches (N + 1, bs, Hkv, D), block_tables (B, W) int64, query_start_loc (B+1,)
    int64, seq_lens (B,) int64 -> causal attention of every new token over its cached sequence
    (T, Hq, D). `block_rows` query rows per program (default: tiling.query_tile_rows) and `block_n`
    cached positions per K/V tile (default: tiling.kv_tile_size), powers of two >= 16. Written into
    `out` (like q) when given."""
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q) if out is None else out
    if num_tokens == 0:
        return out
    group = num_heads // num_kv_heads
    block_g = triton.next_power_of_2(group)
    block_rows = block_rows or query_tile_rows(k_cache.dtype)
    block_q = max(block_rows, MIN_DOT_SIZE) // block_g or 1  # at least MIN_DOT_SIZE rows
    _extend_kernel[(num_tokens // block_q + num_seqs, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        out,
        scale * LOG2E,
        num_seqs,
        block_size,
        *q.stride(),
        *k_cache.stride(),
        block_tables.stride(0),
        *out.stride(),
        GROUP=group,
        BLOCK_G=block_g,
        BLOCK_Q=block_q,
        HEAD_DIM=head_dim,
        BLOCK_N=block_n or kv_tile_size(k_cache.dtype),
        num_warps=attention_warps(k_cache.dtype),
    )
    return out


def extend_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """extend_attention in plain torch, one sequence at a time (without its tiling arguments)."""
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        start, end = starts[b], starts[b + 1]
        blocks = block_tables[b, : -(-seq_len // block_size)]  # (nb,)
        keys = k_cache[blocks].flatten(0, 1)[:seq_len].float().repeat_interleave(group, 1)  # (L, Hq, D)
        values = v_cache[blocks].flatten(0, 1)[:seq_len].float().repeat_interleave(group, 1)  # (L, Hq, D)
        scores = torch.einsum("qhd,lhd->hql", q[start:end].float(), keys) * scale  # (Hq, q, L)
        rows = torch.arange(end - start, device=q.device)[:, None] + seq_len - (end - start)  # (q, 1)
        hidden = torch.arange(seq_len, device=q.device)[None, :] > rows  # (q, L) future positions
        weights = scores.masked_fill(hidden, float("-inf")).softmax(-1)
        out[start:end] = torch.einsum("hql,lhd->qhd", weights, values).to(q.dtype)
    return out
