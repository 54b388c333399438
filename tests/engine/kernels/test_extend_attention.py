"""The varlen extend attention kernel against its torch reference on random paged caches."""

from __future__ import annotations

import pytest
import torch

from services.engine.kernels.extend_attention import extend_attention, extend_attention_reference
from tests.engine.kernels.kernel_device import DEVICE
from tests.engine.kernels.paged_cache import random_paged_batch
from tests.tolerances import ATTENTION_ROUNDINGS, assert_close, attention_reduction, attention_scale

HEAD_DIM = 16
# (cached prefix, new tokens) per sequence: a prompt with nothing cached, a chunk after a prefix,
# a decode row, a prefix-cache hit, and a chunk that fills whole query tiles (a spare program).
MIXED = [(0, 5), (7, 3), (13, 1), (2, 9), (16, 16)]
HEADS = [(2, 2), (4, 2), (8, 2), (6, 2)]  # GQA group 1, 2, 4 and 3 (padded to 4)
HEAD_IDS = ["mha", "gqa2", "gqa4", "gqa3"]


def run_case(
    lengths: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    *,
    head_dim: int = HEAD_DIM,
    device: str = DEVICE,
    block_rows: int | None = None,
    block_n: int | None = None,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [cached + new for cached, new in lengths]
    batch = random_paged_batch(seq_lens, num_kv_heads, head_dim, block_size, dtype, gen, extra_width=1, device=device)
    starts = [0]
    for _, new in lengths:
        starts.append(starts[-1] + new)
    query_start_loc = torch.tensor(starts, dtype=torch.int64, device=device)
    # A strided view, as a slice of a wider projection would be.
    q = torch.randn(starts[-1], num_heads + 1, head_dim, generator=gen).to(dtype).to(device)[:, 1:]  # (T, Hq, D)
    out = torch.full_like(q, float("nan"))
    scale = head_dim**-0.5
    args = (q, batch.k_cache, batch.v_cache, batch.block_tables, query_start_loc, batch.seq_lens, scale)

    result = extend_attention(*args, block_rows=block_rows, block_n=block_n, out=out)

    assert result is out
    # The kernel rounds the probabilities to the cache dtype; both round the output.
    reduction = attention_reduction(head_dim, max(seq_lens))
    expected = extend_attention_reference(*args).float()
    assert_close(
        out.float(),
        expected,
        reduction=reduction,
        dtype=dtype,
        scale=attention_scale(expected, batch.v_cache),
        roundings=ATTENTION_ROUNDINGS,
    )


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS, ids=HEAD_IDS)
def test_mixed_batch_matches_reference(num_heads: int, num_kv_heads: int) -> None:
    """Several query tiles per chunk and several K/V tiles per sequence (block_rows, block_n 16)."""
    run_case(MIXED, num_heads, num_kv_heads, 4, torch.float32, seed=num_heads, block_rows=16, block_n=16)


def test_block_size_16_in_half_precision() -> None:
    run_case([(0, 20), (33, 7), (50, 1)], 8, 2, 16, torch.float16, seed=9, head_dim=32, block_rows=16, block_n=16)


def test_single_sequence_and_default_tiles() -> None:
    run_case([(21, 12)], 4, 2, 4, torch.float32, seed=11)


cuda = pytest.mark.cuda


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_cuda_llama3_shapes(dtype: torch.dtype, head_dim: int) -> None:
    """Llama-3-8B-like heads (32 query, 8 KV): long prompts, chunks after prefixes, decode rows."""
    lengths = [(0, 700), (1000, 300), (37, 1), (2048, 1), (100, 77), (0, 1), (511, 513)]
    run_case(lengths, 32, 8, 16, dtype, seed=head_dim, head_dim=head_dim, device="cuda")


@cuda
def test_cuda_float32_is_not_tf32() -> None:
    run_case(MIXED * 3, 8, 2, 16, torch.float32, seed=1, head_dim=128, device="cuda")
