"""The C++ CPU attention kernels (paged_decode, paged_prefill) against the torch backend (the
reference) on the same paged cache: ragged lengths, blocks in scattered order, GQA, stale NaN in
unused slots, float32 and bfloat16, decode-only and mixed batches, head shapes of their register
paths and of their general loops."""

from __future__ import annotations

import pytest
import torch

from services.engine.attention.backend import KVCache
from services.engine.attention.context import ForwardContext
from services.engine.attention.cpu_backend import CpuAttentionBackend
from services.engine.attention.torch_backend import TorchAttentionBackend
from services.engine.cpu_kernels import load
from tests.tolerances import ATTENTION_ROUNDINGS, assert_close, attention_reduction

kernels = load()
pytestmark = pytest.mark.skipif(kernels is None, reason="the CPU kernels could not be built here")

BLOCK = 16
HEADS, KV_HEADS, DIM = 9, 3, 64


def filled_cache(dtype: torch.dtype, num_blocks: int, seed: int, kv_heads: int = KV_HEADS, dim: int = DIM) -> KVCache:
    cache = KVCache(2, num_blocks, BLOCK, kv_heads, dim, dtype, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    for pool in (*cache.k, *cache.v):
        pool[:num_blocks] = torch.randn(pool[:num_blocks].shape, generator=generator).to(dtype)
    return cache


def context(backend: object, query_lens: list[int], seq_lens: list[int], tables: list[list[int]]) -> ForwardContext:
    slots = []
    for q_len, seq_len, table in zip(query_lens, seq_lens, tables, strict=True):
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(seq_len - q_len, seq_len)]
    width = max(len(t) for t in tables)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return ForwardContext(
        backend=backend,  # type: ignore[arg-type]
        positions=torch.cat([torch.arange(s - q, s) for q, s in zip(query_lens, seq_lens, strict=True)]),
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.tensor(starts),
        seq_lens=torch.tensor(seq_lens),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
    )


def scattered_tables(seq_lens: list[int], num_blocks: int, seed: int) -> list[list[int]]:
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    tables = []
    for length in seq_lens:
        need = -(-length // BLOCK)
        tables.append(order[:need])
        order = order[need:]
    return tables


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("query_lens", "seq_lens"),
    [
        ([1], [1]),
        ([1] * 5, [1, 17, 16, 300, 33]),
        ([1, 7, 1, 40, 1], [9, 7, 129, 64, 250]),  # mixed: prefill chunks among decodes
        ([64, 3], [64, 200]),  # prefill only: a whole prompt, and a chunk over a cached prefix
        ([100, 1, 37], [612, 301, 37]),  # paged_prefill's tiles: many key chunks, ragged last tiles
    ],
    ids=["one-token", "decode-ragged", "mixed", "prefill", "prefill-long"],
)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [(HEADS, KV_HEADS, DIM), (8, 2, 128), (4, 4, 32), (16, 1, 64)],
    ids=["model", "dim128", "general-dim32", "general-group16"],  # the last two: no register path
)
def test_cpu_kernel_matches_the_torch_reference(
    dtype: torch.dtype, query_lens: list[int], seq_lens: list[int], heads: int, kv_heads: int, dim: int
) -> None:
    num_blocks = 64
    tables = scattered_tables(seq_lens, num_blocks, seed=1)
    used = {b for t in tables for b in t}
    outputs = []
    for backend_type in (TorchAttentionBackend, CpuAttentionBackend):
        cache = filled_cache(dtype, num_blocks, seed=0, kv_heads=kv_heads, dim=dim)
        for pool in (*cache.k, *cache.v):
            for block in set(range(num_blocks)) - used:
                pool[block] = float("nan")  # another request's stale K/V: never read
        if backend_type is CpuAttentionBackend:
            backend = CpuAttentionBackend(cache, dim**-0.5, kernels)
        else:
            backend = TorchAttentionBackend(cache, dim**-0.5)
        generator = torch.Generator().manual_seed(2)
        total = sum(query_lens)
        q = torch.randn(total, heads, dim, generator=generator).to(dtype)
        k = torch.randn(total, kv_heads, dim, generator=generator).to(dtype)
        v = torch.randn(total, kv_heads, dim, generator=generator).to(dtype)
        ctx = context(backend, query_lens, seq_lens, tables)
        outputs.append([ctx.attention(layer, q, k, v) for layer in range(2)])
    for reference, fast in zip(*outputs, strict=True):
        assert not fast.isnan().any()
        # The kernel and SDPA sum the same products in other orders and round at other points.
        reduction = attention_reduction(dim, max(seq_lens))
        assert_close(fast.float(), reference.float(), reduction=reduction, dtype=dtype, roundings=ATTENTION_ROUNDINGS)


def test_the_kernel_refuses_mismatched_inputs_by_name() -> None:
    cache = filled_cache(torch.float32, 4, seed=0)
    q = torch.randn(2, HEADS, DIM)
    tables, lens = torch.zeros(2, 1, dtype=torch.int64), torch.ones(2, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="share a dtype"):
        kernels.paged_decode(q.bfloat16(), cache.k[0], cache.v[0], tables, lens, 1.0)
    with pytest.raises(RuntimeError, match="int64"):
        kernels.paged_decode(q, cache.k[0], cache.v[0], tables.int(), lens, 1.0)
