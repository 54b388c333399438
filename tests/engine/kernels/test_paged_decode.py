"""The split-K paged decode kernel against its torch reference on random paged caches."""

from __future__ import annotations

import pytest
import torch

from services.engine.kernels.paged_decode import paged_decode, paged_decode_reference
from tests.engine.kernels.kernel_device import DEVICE
from tests.engine.kernels.paged_cache import random_paged_batch
from tests.tolerances import ATTENTION_ROUNDINGS, assert_close, attention_reduction, attention_scale

HEAD_DIM = 16
# With 4-token blocks and 16-token partitions: one token, exactly one partition, one past it (a
# partial block), and three partitions; the block table's extra width adds a fourth nobody uses.
LENGTHS = [1, 16, 17, 38]
HEADS = [(2, 2), (4, 2), (8, 2), (6, 2)]  # GQA group 1, 2, 4 and 3 (padded to 4)
HEAD_IDS = ["mha", "gqa2", "gqa4", "gqa3"]


def run_case(
    lengths: list[int],
    num_heads: int,
    num_kv_heads: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    *,
    head_dim: int = HEAD_DIM,
    extra_width: int = 1,
    device: str = DEVICE,
    **tiling: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch = random_paged_batch(
        lengths, num_kv_heads, head_dim, block_size, dtype, gen, extra_width=extra_width, device=device
    )
    # A strided view, as a slice of a wider projection would be.
    q = torch.randn(len(lengths), num_heads + 1, head_dim, generator=gen).to(dtype).to(device)[:, 1:]  # (B, Hq, D)
    out = torch.full_like(q, float("nan"))
    scale = head_dim**-0.5

    result = paged_decode(q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, scale, out=out, **tiling)

    assert result is out
    expected = paged_decode_reference(q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, scale)
    # The kernel rounds the probabilities to the cache dtype; both round the output.
    reduction = attention_reduction(head_dim, max(lengths))
    assert_close(
        out.float(),
        expected.float(),
        reduction=reduction,
        dtype=dtype,
        scale=attention_scale(expected.float(), batch.v_cache),
        roundings=ATTENTION_ROUNDINGS,
    )


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS, ids=HEAD_IDS)
def test_split_partitions_match_reference(num_heads: int, num_kv_heads: int) -> None:
    run_case(LENGTHS, num_heads, num_kv_heads, 4, torch.float32, seed=num_heads, partition_size=16, block_n=16)


@pytest.mark.parametrize("partition_size", [32, 256], ids=["two-tiles-per-partition", "one-partition-no-merge"])
def test_other_partitionings_match_reference(partition_size: int) -> None:
    run_case(LENGTHS, 8, 2, 4, torch.float32, seed=5, partition_size=partition_size, block_n=16)


def test_block_size_16_in_half_precision() -> None:
    run_case([3, 16, 33, 70], 8, 2, 16, torch.float16, seed=7, head_dim=32, partition_size=32, block_n=16)


def test_padded_graph_rows_read_the_zero_block() -> None:
    """Rows a CUDA-graph batch pads with: seq_len 1, block table at the zero block -> zeros."""
    gen = torch.Generator().manual_seed(3)
    batch = random_paged_batch([9, 30], 2, HEAD_DIM, 4, torch.float32, gen, extra_width=2)
    padded = torch.zeros(2, batch.block_tables.shape[1], dtype=torch.int64, device=DEVICE)
    padded[:, 0] = batch.null_block
    tables = torch.cat([batch.block_tables, padded])  # (4, W)
    seq_lens = torch.cat([batch.seq_lens, torch.ones(2, dtype=torch.int64, device=DEVICE)])
    q = torch.randn(4, 4, HEAD_DIM, generator=gen).to(DEVICE)
    out = paged_decode(q, batch.k_cache, batch.v_cache, tables, seq_lens, 0.25, partition_size=16, block_n=16)
    assert torch.equal(out[2:], torch.zeros_like(out[2:]))
    expected = paged_decode_reference(q[:2], batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25)
    assert_close(out[:2], expected, reduction=attention_reduction(HEAD_DIM, 30))


def test_partition_must_hold_whole_tiles() -> None:
    q = torch.zeros(1, 2, HEAD_DIM)
    cache = torch.zeros(2, 4, 2, HEAD_DIM)
    with pytest.raises(ValueError, match="multiple of block_n"):
        paged_decode(q, cache, cache, torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, dtype=torch.int64), 1.0,
                     partition_size=24, block_n=16)  # fmt: skip


cuda = pytest.mark.cuda


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_cuda_llama3_shapes(dtype: torch.dtype, head_dim: int) -> None:
    """Llama-3-8B-like heads (32 query, 8 KV) over lengths of one to many default partitions."""
    lengths = [1, 17, 255, 256, 257, 1000, 2049, 4000]
    run_case(lengths, 32, 8, 16, dtype, seed=head_dim, head_dim=head_dim, extra_width=8, device="cuda")


@cuda
def test_cuda_float32_is_not_tf32() -> None:
    run_case(LENGTHS * 4, 8, 2, 16, torch.float32, seed=1, head_dim=128, device="cuda")
