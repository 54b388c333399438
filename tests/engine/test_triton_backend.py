"""TritonAttentionBackend against TorchAttentionBackend, through test_torch_backend's harness
(random blocks, poisoned caches, the float64 reference, the slots written and not written).
On CPU the kernels run in Triton's interpreter, with small tiles so short sequences still
cross K/V tiles, query tiles and split-K partitions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from services.engine.attention.backend import AttentionBackend, KVCache
from services.engine.attention.context import ForwardContext
from services.engine.attention.torch_backend import TorchAttentionBackend
from services.engine.attention.triton_backend import TritonAttentionBackend
from tests.engine.model_fixtures import SequenceSlice, build_context, poison
from tests.engine.test_torch_backend import DECODE, MIXED, run_case
from tests.tolerances import ATTENTION_ROUNDINGS, assert_close, attention_reduction

HEAD_DIM = 16
SMALL_TILES = dict(decode_partition_size=16, block_n=16, block_rows=16)


def small_tiles(cache: KVCache, scale: float) -> TritonAttentionBackend:
    return TritonAttentionBackend(cache, scale, **SMALL_TILES)


class StaleHostLists(TritonAttentionBackend):
    """Sees the host-side lengths of another batch, as a replayed CUDA graph would."""

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        stale = dataclasses.replace(ctx, seq_lens_cpu=[1] * ctx.num_sequences, scratch={})
        return super().forward(layer, q, k, v, stale)


def assert_matches_torch(
    lengths: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    make_backend: Callable[[KVCache, float], AttentionBackend] = small_tiles,
    device: str = "cpu",
) -> None:
    head_dim = HEAD_DIM if device == "cpu" else 128
    case = (lengths, num_heads, num_kv_heads, block_size, dtype, seed)
    out = run_case(*case, head_dim=head_dim, make_backend=make_backend, device=device)
    expected = run_case(*case, head_dim=head_dim, device=device)
    longest = max(cached + new for cached, new in lengths)
    assert_close(out, expected, reduction=attention_reduction(head_dim, longest), roundings=ATTENTION_ROUNDINGS)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("lengths", [MIXED, DECODE], ids=["mixed", "decode"])
def test_matches_torch_backend(lengths: list[tuple[int, int]], block_size: int) -> None:
    assert_matches_torch(lengths, 8, 2, block_size, torch.float32, seed=block_size)


@pytest.mark.parametrize(
    ("lengths", "num_heads", "num_kv_heads"), [(MIXED, 2, 2), (DECODE, 8, 1)], ids=["mixed-mha", "decode-mqa"]
)
def test_head_groupings(lengths: list[tuple[int, int]], num_heads: int, num_kv_heads: int) -> None:
    assert_matches_torch(lengths, num_heads, num_kv_heads, 4, torch.float32, seed=1)


def test_half_precision() -> None:
    assert_matches_torch(MIXED, 4, 2, 4, torch.float16, seed=2)


def test_decode_reads_only_context_tensors() -> None:
    """graph_safe_decode: decode plans nothing from the host lists a graph replay would leave stale."""
    assert TritonAttentionBackend.graph_safe_decode
    assert_matches_torch(DECODE, 4, 2, 4, torch.float32, seed=3, make_backend=StaleHostLists)


def test_padded_graph_rows_leave_the_zero_block_zero() -> None:
    """Rows a CUDA-graph batch pads with (seq_len 1, block table and slot at the zero block, or slot
    -1) come out as zeros; the real rows are unaffected and the zero block stays zero."""
    gen = torch.Generator().manual_seed(4)
    cache = KVCache(1, 8, 4, 2, HEAD_DIM, torch.float32, torch.device("cpu"))
    poison(cache)
    backend = small_tiles(cache, HEAD_DIM**-0.5)
    reference = TorchAttentionBackend(KVCache(1, 8, 4, 2, HEAD_DIM, torch.float32, torch.device("cpu")), 0.25)
    real = build_context(backend, [SequenceSlice(0, 1, [3]), SequenceSlice(0, 1, [5])])
    pad_table = torch.tensor([[cache.num_blocks], [cache.num_blocks]])  # (2, W)
    padded = dataclasses.replace(
        real,
        positions=torch.cat([real.positions, torch.zeros(2, dtype=torch.int64)]),
        slot_mapping=torch.cat([real.slot_mapping, torch.tensor([cache.null_slot, -1])]),
        query_start_loc=torch.arange(5),
        seq_lens=torch.cat([real.seq_lens, torch.ones(2, dtype=torch.int64)]),
        block_tables=torch.cat([real.block_tables, pad_table]),
        query_lens_cpu=[1] * 4,
        seq_lens_cpu=[*real.seq_lens_cpu, 1, 1],
    )
    q = torch.randn(4, 4, HEAD_DIM, generator=gen)
    k, v = torch.randn(2, 4, 2, HEAD_DIM, generator=gen)  # (T, Hkv, D) each

    out = backend.forward(0, q, k, v, padded)

    assert torch.equal(out[2:], torch.zeros_like(out[2:]))
    expected = reference.forward(0, q[:2], k[:2], v[:2], dataclasses.replace(real, backend=reference))
    assert_close(out[:2], expected, reduction=attention_reduction(HEAD_DIM, 1))
    assert not cache.k[0][cache.num_blocks].any() and not cache.v[0][cache.num_blocks].any()


def test_unsupported_setups_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def cache(head_dim: int, dtype: torch.dtype = torch.float32) -> KVCache:
        return KVCache(1, 4, 4, 2, head_dim, dtype, torch.device("cpu"))

    with pytest.raises(ValueError, match="power of two >= 16, got 24"):
        TritonAttentionBackend(cache(24), 1.0)
    with pytest.raises(ValueError, match="multiple of the tile"):
        TritonAttentionBackend(cache(16), 1.0, decode_partition_size=24, block_n=16)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="bfloat16"):
        TritonAttentionBackend(cache(16, torch.bfloat16), 1.0)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA device, or TRITON_INTERPRET=1 on CPU"):
        TritonAttentionBackend(cache(16), 1.0)


cuda = pytest.mark.cuda
# (cached, new) per sequence, within test_torch_backend's 256 blocks of 16 tokens.
LLAMA3_MIXED = [(0, 300), (700, 1), (1000, 64), (37, 1), (1500, 1), (0, 1)]
LLAMA3_DECODE = [(0, 1), (255, 1), (256, 1), (3000, 1), (17, 1)]


@cuda
@pytest.mark.parametrize("lengths", [LLAMA3_MIXED, LLAMA3_DECODE], ids=["mixed", "decode"])
def test_cuda_llama3_shapes(lengths: list[tuple[int, int]]) -> None:
    """bfloat16, head_dim 128, 32 query heads on 8 KV heads, default tiles, 16-token blocks."""
    assert_matches_torch(lengths, 32, 8, 16, torch.bfloat16, seed=0, make_backend=TritonAttentionBackend, device="cuda")


@cuda
def test_cuda_decode_replays_in_a_graph() -> None:
    """Captured once, a decode forward replayed with new lengths, block tables and slots matches
    the torch backend run eagerly on the same inputs (over up to four split-K partitions)."""
    device = torch.device("cuda")
    gen = torch.Generator(device).manual_seed(0)
    num_blocks, block_size, width, batch = 64, 16, 16, 4
    caches = [KVCache(1, num_blocks, block_size, 8, 128, torch.bfloat16, device) for _ in range(2)]
    for pool in (caches[0].k[0], caches[0].v[0]):
        pool[:num_blocks].normal_(generator=gen)
    caches[1].k[0].copy_(caches[0].k[0])
    caches[1].v[0].copy_(caches[0].v[0])
    backend = TritonAttentionBackend(caches[0], 128**-0.5, decode_partition_size=64)
    reference = TorchAttentionBackend(caches[1], 128**-0.5)
    static = ForwardContext(
        backend=backend,
        positions=torch.zeros(batch, dtype=torch.int64, device=device),
        slot_mapping=torch.zeros(batch, dtype=torch.int64, device=device),
        query_start_loc=torch.arange(batch + 1, device=device),
        seq_lens=torch.ones(batch, dtype=torch.int64, device=device),
        block_tables=torch.zeros(batch, width, dtype=torch.int64, device=device),
        query_lens_cpu=[1] * batch,
        seq_lens_cpu=[1] * batch,
    )
    q = torch.zeros(batch, 32, 128, dtype=torch.bfloat16, device=device)
    k = torch.zeros(batch, 8, 128, dtype=torch.bfloat16, device=device)
    v = torch.zeros_like(k)

    def load(step: int) -> list[int]:
        """Fill the static inputs with a fresh decode batch (distinct blocks per sequence); its lengths."""
        lengths = [1 + (step * 37 + 53 * b) % (width * block_size) for b in range(batch)]
        blocks = torch.randperm(num_blocks, generator=gen, device=device)[: batch * width].view(batch, width)
        seq_lens = torch.tensor(lengths, device=device)
        static.block_tables.copy_(blocks)
        static.seq_lens.copy_(seq_lens)
        static.positions.copy_(seq_lens - 1)
        static.slot_mapping.copy_(blocks.gather(1, ((seq_lens - 1) // block_size)[:, None])[:, 0] * block_size)
        static.slot_mapping.add_((seq_lens - 1) % block_size)
        for tensor in (q, k, v):
            tensor.normal_(generator=gen)
        return lengths

    def run_reference(lengths: list[int]) -> torch.Tensor:
        eager = dataclasses.replace(static, backend=reference, seq_lens_cpu=lengths, scratch={})
        return reference.forward(0, q, k, v, eager)

    run_reference(load(0))  # keeps the two caches equal: the warm-up below stores K/V too
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        backend.forward(0, q, k, v, static)  # compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(0, q, k, v, static)
    for step in (1, 2):
        expected = run_reference(load(step))
        graph.replay()
        reduction = attention_reduction(128, width * block_size)
        assert_close(out, expected, reduction=reduction, roundings=ATTENTION_ROUNDINGS)
