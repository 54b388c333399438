"""cpu_kernels' CpuDecoder (every layer of a forward in one C++ call) against the same model's
layers run one by one from Python: the same kernels in the same order, so the hidden states and
the K/V written to the cache must be equal to the bit, on a batch mixing a first prefill, a
chunk after a cached prefix and decodes, in float32 and bfloat16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.engine.attention.context import ForwardContext
from services.engine.config import EngineConfig
from services.engine.cpu_kernels import load
from services.engine.model_loader import LoadedModel, load_model
from tests.engine.model_fixtures import build_tiny_checkpoint

kernels = load()
pytestmark = pytest.mark.skipif(kernels is None, reason="the CPU kernels could not be built here")

BLOCK = 16
NUM_BLOCKS = 24
# (tokens already cached, new tokens) per sequence: a first prefill, a chunk after a cached
# prefix, and two decodes.
BATCH = [(0, 21), (35, 17), (40, 1), (7, 1)]


def packed_dtypes() -> list[torch.dtype]:
    return [getattr(torch, name) for name in kernels.PACKED_LINEAR_DTYPES] if kernels is not None else []


def load_tiny(folder: Path, dtype: torch.dtype) -> LoadedModel:
    return load_model(EngineConfig(model=folder, dtype=str(dtype).removeprefix("torch."), device="cpu"))


def context(backend: object, seed: int) -> ForwardContext:
    order = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(seed)).tolist()
    tables, slots, positions, starts = [], [], [], [0]
    for cached, new in BATCH:
        need = -(-(cached + new) // BLOCK)
        table, order = order[:need], order[need:]
        tables.append(table)
        positions += range(cached, cached + new)
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(cached, cached + new)]
        starts.append(starts[-1] + new)
    width = max(len(t) for t in tables)
    return ForwardContext(
        backend=backend,  # type: ignore[arg-type]
        positions=torch.tensor(positions),
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.tensor(starts),
        seq_lens=torch.tensor([c + n for c, n in BATCH]),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        query_lens_cpu=[n for _, n in BATCH],
        seq_lens_cpu=[c + n for c, n in BATCH],
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoder")
    return {name: build_tiny_checkpoint(root / name, name) for name in ("llama", "qwen2", "qwen3")}


@pytest.mark.parametrize("dtype", packed_dtypes())
@pytest.mark.parametrize("name", ["llama", "qwen2"])  # qwen2: biased q/k/v projections
def test_decoder_equals_the_layers_to_the_bit(folders: dict[str, Path], name: str, dtype: torch.dtype) -> None:
    loaded = load_tiny(folders[name], dtype)
    model = loaded.model.model
    assert model.cpu_decoder is not None and model.cpu_decoder.num_layers == len(model.layers)
    backend = loaded.make_backend(NUM_BLOCKS, BLOCK, "cpu")
    generator = torch.Generator().manual_seed(1)
    # Earlier tokens' K/V: random, the same before both runs; unused slots NaN, never to be read.
    initial = [
        torch.randn(pool.shape, generator=generator).to(dtype) for pool in (*backend.kv_cache.k, *backend.kv_cache.v)
    ]
    total = sum(n for _, n in BATCH)
    input_ids = torch.randint(0, loaded.vocab_size, (total,), generator=generator)
    results = []
    for decoder in (model.cpu_decoder, None):
        for pool, start in zip((*backend.kv_cache.k, *backend.kv_cache.v), initial, strict=True):
            pool.copy_(start)
        model.cpu_decoder = decoder
        ctx = context(backend, seed=2)
        with torch.inference_mode():
            hidden = loaded.model(input_ids, ctx.positions, ctx)
        results.append((hidden, [p.clone() for p in (*backend.kv_cache.k, *backend.kv_cache.v)]))
    (fused, fused_cache), (layers, layers_cache) = results
    assert fused.dtype == dtype and torch.isfinite(fused).all()
    assert torch.equal(fused, layers)
    assert all(torch.equal(a, b) for a, b in zip(fused_cache, layers_cache, strict=True))


@pytest.mark.parametrize("dtype", packed_dtypes()[:1])
def test_decoder_is_left_out_where_a_layer_needs_more_than_its_kernels(
    folders: dict[str, Path], dtype: torch.dtype
) -> None:
    # Qwen3 normalises q and k per head, which the decoder does not: its layers run one by one.
    assert load_tiny(folders["qwen3"], dtype).model.model.cpu_decoder is None
    # Without the kernels (use_cpu_decoder(None)) the layers run one by one too.
    model = load_tiny(folders["llama"], dtype).model.model
    assert model.use_cpu_decoder(None) is False and model.cpu_decoder is None


def test_decoder_refuses_a_cache_list_of_the_wrong_length(folders: dict[str, Path]) -> None:
    if not packed_dtypes():
        pytest.skip("packed_linear takes no dtype on this CPU")
    loaded = load_tiny(folders["llama"], packed_dtypes()[0])
    decoder = loaded.model.model.cpu_decoder
    hidden = torch.zeros(1, 64, dtype=packed_dtypes()[0])
    cos = sin = torch.zeros(1, 8)
    with pytest.raises(RuntimeError, match="one K and V cache per layer"):
        decoder.forward(
            hidden,
            [],
            [],
            cos,
            sin,
            torch.zeros(1, dtype=torch.long),
            torch.zeros(1, 1, dtype=torch.long),
            torch.ones(1, dtype=torch.long),
        )
