"""TorchAttentionBackend against plain per-sequence softmax attention on contiguous K/V."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from services.engine.attention.backend import AttentionBackend, KVCache
from services.engine.attention.torch_backend import TorchAttentionBackend
from tests.engine.model_fixtures import SequenceSlice, build_context, poison, slots
from tests.tolerances import ATTENTION_ROUNDINGS, assert_close, attention_reduction

HEAD_DIM = 8
NUM_BLOCKS = 256
MIXED = [(0, 5), (7, 3), (13, 1), (2, 9), (16, 16)]  # (cached prefix, new tokens) per sequence
DECODE = [(9, 1), (0, 1), (31, 1), (3, 1), (15, 1), (16, 1)]
# Enough decoding sequences of spread-out lengths for the backend to split them into length groups.
MANY_DECODE = [((7 * i) % 23, 1) for i in range(26)]
# Prefill chunks among many decodes: each sequence takes its own path within one batch.
MIXED_MANY = [*MANY_DECODE[:13], *MIXED, *MANY_DECODE[13:]]


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """q (q, Hq, D) are the last q positions of keys/values (L, Hkv, D): causal attention in float64."""
    q_len, seq_len, group = q.shape[0], keys.shape[0], q.shape[1] // keys.shape[1]
    keys = keys.double().repeat_interleave(group, dim=1)  # (L, Hq, D)
    values = values.double().repeat_interleave(group, dim=1)  # (L, Hq, D)
    scores = torch.einsum("qhd,khd->hqk", q.double(), keys) * scale  # (Hq, q, L)
    positions = torch.arange(q_len)[:, None] + seq_len - q_len  # (q, 1)
    scores = scores.masked_fill(torch.arange(seq_len)[None, :] > positions, -math.inf)
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)  # (q, Hq, D)


def run_case(
    lengths: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int = 0,
    *,
    head_dim: int = HEAD_DIM,
    make_backend: Callable[[KVCache, float], AttentionBackend] = TorchAttentionBackend,
    device: str = "cpu",
) -> torch.Tensor:
    """Run one forward of `lengths` on random data from `seed`; check it and return its output."""
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(2, NUM_BLOCKS, block_size, num_kv_heads, head_dim, dtype, torch.device(device))
    poison(cache)
    backend = make_backend(cache, head_dim**-0.5)
    free = torch.randperm(NUM_BLOCKS, generator=gen).tolist()  # random, non-contiguous blocks
    layer = 1  # layer 0 must stay untouched

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    seqs, full_k, full_v = [], [], []
    for cached, new in lengths:
        blocks = [free.pop() for _ in range(math.ceil((cached + new) / block_size))]
        seqs.append(SequenceSlice(cached, new, blocks))
        full_k.append(randn(cached + new, num_kv_heads, head_dim))  # (L, Hkv, D)
        full_v.append(randn(cached + new, num_kv_heads, head_dim))
        prefix = torch.tensor(slots(blocks, block_size, 0, cached), dtype=torch.int64, device=device)
        cache.k[layer].view(-1, num_kv_heads, head_dim)[prefix] = full_k[-1][:cached]
        cache.v[layer].view(-1, num_kv_heads, head_dim)[prefix] = full_v[-1][:cached]
    ctx = build_context(backend, seqs, device)
    assert ctx.is_decode_only == all(new == 1 for _, new in lengths)
    q = randn(sum(new for _, new in lengths), num_heads, head_dim)  # (T, Hq, D)
    k = torch.cat([fk[s.cached_len :] for fk, s in zip(full_k, seqs, strict=True)])  # (T, Hkv, D)
    v = torch.cat([fv[s.cached_len :] for fv, s in zip(full_v, seqs, strict=True)])

    out = backend.forward(layer, q, k, v, ctx)  # (T, Hq, D)

    assert out.shape == q.shape and out.dtype == dtype
    expected = torch.cat(
        [
            reference(q_b, fk.cpu(), fv.cpu(), backend.scale)
            for q_b, fk, fv in zip(q.cpu().split(ctx.query_lens_cpu), full_k, full_v, strict=True)
        ]
    )
    reduction = attention_reduction(head_dim, max(cached + new for cached, new in lengths))
    assert_close(out.cpu().double(), expected, reduction=reduction, dtype=dtype, roundings=ATTENTION_ROUNDINGS)

    # Every position of every sequence is in its slot; every other slot still holds the poison.
    written = torch.zeros(NUM_BLOCKS * block_size, dtype=torch.bool, device=device)
    for s, fk, fv in zip(seqs, full_k, full_v, strict=True):
        where = torch.tensor(slots(s.block_ids, block_size, 0, s.seq_len), dtype=torch.int64, device=device)
        written[where] = True
        assert torch.equal(cache.k[layer].view(-1, num_kv_heads, head_dim)[where], fk)
        assert torch.equal(cache.v[layer].view(-1, num_kv_heads, head_dim)[where], fv)
    for pool in (cache.k[layer], cache.v[layer]):
        assert pool[:NUM_BLOCKS].reshape(-1, num_kv_heads * head_dim)[~written].isnan().all()
    assert all(pool[:NUM_BLOCKS].isnan().all() for pool in (cache.k[0], cache.v[0]))
    # The zero block that padding reads from is never written.
    assert all(not pool[NUM_BLOCKS:].any() for pool in (*cache.k, *cache.v))
    return out


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "lengths", [MIXED, DECODE, MANY_DECODE, MIXED_MANY], ids=["mixed", "decode", "decode-grouped", "mixed-grouped"]
)
def test_matches_reference(lengths: list[tuple[int, int]], dtype: torch.dtype, block_size: int) -> None:
    run_case(lengths, num_heads=4, num_kv_heads=2, block_size=block_size, dtype=dtype)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(2, 2), (6, 2), (8, 1)], ids=["mha", "gqa3", "mqa"])
@pytest.mark.parametrize("lengths", [MIXED, DECODE], ids=["mixed", "decode"])
def test_head_groupings(lengths: list[tuple[int, int]], num_heads: int, num_kv_heads: int) -> None:
    run_case(lengths, num_heads, num_kv_heads, block_size=4, dtype=torch.float32, seed=1)


def test_prefill_without_prefix_only() -> None:
    run_case([(0, 7), (0, 1), (0, 12)], num_heads=4, num_kv_heads=2, block_size=4, dtype=torch.float32, seed=2)


def test_single_decode_sequence_at_block_boundary() -> None:
    run_case([(4, 1)], num_heads=4, num_kv_heads=2, block_size=4, dtype=torch.float32, seed=3)
    run_case([(3, 1)], num_heads=4, num_kv_heads=2, block_size=4, dtype=torch.float32, seed=4)
