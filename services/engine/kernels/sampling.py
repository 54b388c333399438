"""The sampler's draw in one pass: argmax_i (logit_i - log(-log u_i)) with u_i from Philox in the kernel.

This is the exponential race of sampler/draw.py (q_i = -log u_i ~ Exp(1), and argmax_i logit_i -
log q_i is a draw from softmax(logits)), without materialising the (R, W) uniforms or scores.

The noise is a pure function of (seed, offset, row, column): u for logits[r, c] is Triton's
`tl.rand(seed, offset + r * W + c)` (Philox4x32-10 keyed by the 64-bit seed, counter = that 64-bit
number, first output word mapped to [0, 1)), so the tokens do not depend on how rows and columns
are tiled or split across programs, and `exponential_race_argmax_reference` reproduces them in
torch. u = 0 (2 in 2^32 draws) counts as the smallest positive u, so every finite logit gets a
finite score and a -inf logit (score -inf) is never chosen over a finite one. A row whose logits
are all -inf gets column 0. Ties go to the lowest column, as torch.argmax does.

A row of more than MIN_SPLIT_COLUMNS columns may be cut into splits handled by separate programs
when there are too few rows to fill the GPU; each split writes its best (score, column) and a
torch argmax over the (R, splits) partials picks the row's winner. The grid depends on shapes
only and nothing syncs with the host: seed and offset are host ints the caller draws.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Tiles are ELEMENTS_PER_TILE elements, BLOCK_COLUMNS from MIN_ to MAX_BLOCK_COLUMNS wide: eight
# compiled variants cover every shape (widths vary step to step with compaction).
MIN_BLOCK_COLUMNS = 8
MAX_BLOCK_COLUMNS = 1024
ELEMENTS_PER_TILE = 2048
MIN_SPLIT_COLUMNS = 4096  # a split covers at least this many columns
TARGET_PROGRAMS = 512  # rows are split until about this many programs run (a few per SM)
# Triton's tl.rand maps a 31-bit integer k to k * this (the largest float32 scale with
# (2^31 - 1) * scale < 1); u = 0 is raised to the next value, k = 1.
UNIFORM_SCALE = 4.6566127342e-10
_SMALLEST_UNIFORM: tl.constexpr = tl.constexpr(UNIFORM_SCALE)
MAX_SEED = 2**63
MAX_OFFSET = 2**62  # offset + R * W stays a non-negative int64


@triton.jit(do_not_specialize=["rows", "seed", "offset"])
def _race_kernel(
    logits_ptr,
    best_score_ptr,
    best_column_ptr,
    rows,
    width,
    row_stride,
    split_columns,
    seed,
    offset,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLUMNS: tl.constexpr,
):
    """Program (i, s): rows i * BLOCK_ROWS ..., columns of split s -> best_score / best_column (R, splits)."""
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    row = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # (R,)
    row_mask = row < rows
    start = split * split_columns
    end = tl.minimum(start + split_columns, width)
    # Per lane: the best score so far and its column; strict `>` keeps the earliest column of a tie.
    best = tl.full((BLOCK_ROWS, BLOCK_COLUMNS), float("-inf"), tl.float32)
    best_column = tl.full((BLOCK_ROWS, BLOCK_COLUMNS), 0, tl.int64) + start
    for tile in range(start, end, BLOCK_COLUMNS):
        column = tile + tl.arange(0, BLOCK_COLUMNS)  # (C,)
        mask = row_mask[:, None] & (column < end)[None, :]  # (R, C)
        logits = tl.load(logits_ptr + row[:, None] * row_stride + column[None, :], mask=mask, other=float("-inf"))
        u = tl.rand(seed, offset + row[:, None] * width + column[None, :])  # (R, C) in [0, 1)
        u = tl.maximum(u, _SMALLEST_UNIFORM)
        score = logits - tl.log(-tl.log(u))  # -inf logits stay -inf
        better = score > best
        best = tl.where(better, score, best)
        best_column = tl.where(better, column[None, :], best_column)
    top = tl.max(best, axis=1)  # (R,)
    # The lowest column among the lanes holding the top score (all lanes when the row is all -inf).
    winner = tl.min(tl.where(best == top[:, None], best_column, width), axis=1)  # (R,)
    tl.store(best_score_ptr + row * splits + split, top, mask=row_mask)
    tl.store(best_column_ptr + row * splits + split, winner, mask=row_mask)


def exponential_race_argmax(
    logits: torch.Tensor, seed: int, offset: int, *, split_columns: int | None = None
) -> torch.Tensor:
    """logits (R, W) float32 -> (R,) int64 column drawn from each row's softmax.

    seed in [0, 2^63) and offset in [0, 2^62) pick the noise (see the module docstring).
    split_columns: columns one program covers (default: from the shape); changes speed, not tokens."""
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(-1) != 1:
        raise ValueError(
            f"logits must be (R, W) float32 with contiguous rows, got {tuple(logits.shape)} {logits.dtype}"
        )
    if not (0 <= seed < MAX_SEED and 0 <= offset < MAX_OFFSET):
        raise ValueError(f"seed {seed} must be in [0, 2^63) and offset {offset} in [0, 2^62)")
    rows, width = logits.shape
    if rows == 0 or width == 0:
        return torch.zeros(rows, dtype=torch.int64, device=logits.device)
    block_columns = min(max(triton.next_power_of_2(width), MIN_BLOCK_COLUMNS), MAX_BLOCK_COLUMNS)
    block_rows = ELEMENTS_PER_TILE // block_columns
    row_programs = triton.cdiv(rows, block_rows)
    if split_columns is None:
        wanted_splits = max(1, TARGET_PROGRAMS // row_programs)
        split_columns = max(MIN_SPLIT_COLUMNS, triton.cdiv(width, wanted_splits))
        split_columns = triton.cdiv(split_columns, block_columns) * block_columns  # whole tiles
    else:
        block_columns = min(block_columns, triton.next_power_of_2(split_columns))
    splits = triton.cdiv(width, split_columns)
    best_score = torch.empty(rows, splits, dtype=torch.float32, device=logits.device)
    best_column = torch.empty(rows, splits, dtype=torch.int64, device=logits.device)
    _race_kernel[(row_programs, splits)](
        logits,
        best_score,
        best_column,
        rows,
        width,
        logits.stride(0),
        split_columns,
        seed,
        offset,
        BLOCK_ROWS=block_rows,
        BLOCK_COLUMNS=block_columns,
        num_warps=4,
    )
    if splits == 1:
        return best_column.squeeze(1)
    # torch.argmax takes the first of equal scores: the lowest split, hence the lowest column.
    return best_column.gather(1, best_score.argmax(dim=1, keepdim=True)).squeeze(1)


def exponential_race_argmax_reference(logits: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
    """The same draw in torch: the same Philox noise per (row, column), then one argmax."""
    rows, width = logits.shape
    counters = offset + torch.arange(rows * width, dtype=torch.int64, device=logits.device).view(rows, width)
    u = philox_uniform(seed, counters).clamp_min(UNIFORM_SCALE)  # (R, W)
    return (logits - (-u.log()).log()).argmax(dim=1)


# Philox4x32-10 constants (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", 2011).
_ROUND_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_KEY_INCREMENTS = (0x9E3779B9, 0xBB67AE85)
_LOW32 = 0xFFFFFFFF


def philox_uniform(seed: int, counters: torch.Tensor) -> torch.Tensor:
    """float32 U[0, 1) like tl.rand(seed, counters) for int64 counters >= 0, computed with int64 ops
    on 32-bit words."""
    c0, c1 = counters & _LOW32, counters >> 32
    c2, c3 = torch.zeros_like(counters), torch.zeros_like(counters)
    k0, k1 = seed & _LOW32, (seed >> 32) & _LOW32
    for _ in range(10):
        high_b, low_b = _mul_32(_ROUND_MULTIPLIERS[1], c2)
        high_a, low_a = _mul_32(_ROUND_MULTIPLIERS[0], c0)
        c0, c1, c2, c3 = high_b ^ c1 ^ k0, low_b, high_a ^ c3 ^ k1, low_a
        k0, k1 = (k0 + _KEY_INCREMENTS[0]) & _LOW32, (k1 + _KEY_INCREMENTS[1]) & _LOW32
    signed = torch.where(c0 >= 2**31, c0 - 2**32, c0)  # the word as int32
    magnitude = torch.where(signed < 0, -signed - 1, signed)  # ~x for negative x: [0, 2^31)
    return magnitude.to(torch.float32) * UNIFORM_SCALE


def _mul_32(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of a * b for 32-bit a and b (int64 holds 16 x 32-bit partial products)."""
    a_low, a_high = a & 0xFFFF, a >> 16
    b_low, b_high = b & 0xFFFF, b >> 16
    low_low, low_high, high_low = a_low * b_low, a_low * b_high, a_high * b_low
    middle = (low_low >> 16) + (low_high & 0xFFFF) + (high_low & 0xFFFF)  # < 2^18
    low = ((middle & 0xFFFF) << 16) | (low_low & 0xFFFF)
    high = a_high * b_high + (low_high >> 16) + (high_low >> 16) + (middle >> 16)
    return high, low
