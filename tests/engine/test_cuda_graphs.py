"""Decode CUDA graphs: sizes, when they are used, and padded runs equal to unpadded eager ones.

On CPU the graphs run in eager mode over the same padded static buffers, so the padding (rows,
slots, block tables, the zero and scratch blocks) is checked here against the model run on the
unpadded batch; on CUDA the captured replays are checked against eager runs and the engine's
greedy output with graphs on against graphs off.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from services.engine.attention.backend import AttentionBackend, KVCache
from services.engine.attention.torch_backend import TorchAttentionBackend
from services.engine.attention.triton_backend import TritonAttentionBackend
from services.engine.config import EngineConfig
from services.engine.cuda_graphs import (
    DecodeGraphs,
    blocks_per_sequence,
    capture_sizes,
    decode_graphs_refusal,
    graph_table_width,
)
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import LoadedModel, load_model
from services.engine.model_runner import Batch, ModelRunner, StepLogits
from services.engine.models import build_model
from services.engine.models.llama import LlamaForCausalLM
from services.engine.request import EngineRequest
from services.engine.sampling_params import SamplingSettings
from services.engine.sampling_validation import Limits, resolve
from services.engine.sequence import Sequence
from tests.engine.model_fixtures import SequenceSlice, build_context, build_tiny_checkpoint, poison
from tests.tolerances import assert_close, forward_reduction
from turnout.v1 import common_pb2

BLOCK_SIZE = 4
NUM_BLOCKS = 160
MAX_MODEL_LEN = 32
WIDTH = blocks_per_sequence(MAX_MODEL_LEN, BLOCK_SIZE)  # 8
MAX_BS = 16  # sizes 1, 2, 4, 8, 16
# The torch backend (eager only: its decode reads host lengths) and the graph-safe Triton one.
BACKENDS: dict[str, type[AttentionBackend]] = {"torch": TorchAttentionBackend, "triton": TritonAttentionBackend}
on_cuda = pytest.mark.cuda  # CUDA graphs need a CUDA device


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with grouped-query attention (4 query heads, 2 KV heads)."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


@dataclass
class DecodeCase:
    """Sequences of different lengths prefilled into a poisoned paged cache; one decode step each."""

    model: LlamaForCausalLM
    backend: AttentionBackend
    seqs: list[SequenceSlice]  # the decode step: one new token after each prefix
    input_ids: torch.Tensor  # (B,)

    @property
    def cache(self) -> KVCache:
        return self.backend.kv_cache

    def snapshot(self) -> list[torch.Tensor]:
        return [pool.clone() for pool in (*self.cache.k, *self.cache.v)]

    def restore(self, saved: list[torch.Tensor]) -> None:
        for pool, copy in zip((*self.cache.k, *self.cache.v), saved, strict=True):
            pool.copy_(copy)

    def eager_logits(self) -> torch.Tensor:
        """The model over the unpadded batch: (B, V)."""
        ctx = build_context(self.backend, self.seqs, self.input_ids.device)
        with torch.inference_mode():
            return self.model.compute_logits(self.model(self.input_ids, ctx.positions, ctx))


def decode_case(
    model: LlamaForCausalLM, backend_cls: type[AttentionBackend], lengths: list[int], seed: int = 0
) -> DecodeCase:
    spec, device = model.spec, model.model.embed_tokens.weight.device
    dtype = model.model.embed_tokens.weight.dtype
    cache = KVCache(spec.num_layers, NUM_BLOCKS, BLOCK_SIZE, spec.num_kv_heads, spec.head_dim, dtype, device)
    poison(cache)
    backend = backend_cls(cache, spec.attention_scale)
    gen = torch.Generator().manual_seed(seed)
    free = torch.randperm(NUM_BLOCKS, generator=gen).tolist()  # random, non-contiguous blocks
    blocks = [[free.pop() for _ in range(math.ceil((n + 1) / BLOCK_SIZE))] for n in lengths]
    prompts = torch.randint(0, spec.vocab_size, (sum(lengths),), generator=gen).to(device)
    prefill = build_context(backend, [SequenceSlice(0, n, b) for n, b in zip(lengths, blocks, strict=True)], device)
    with torch.inference_mode():
        model(prompts, prefill.positions, prefill)
    seqs = [SequenceSlice(n, 1, b) for n, b in zip(lengths, blocks, strict=True)]
    input_ids = torch.randint(0, spec.vocab_size, (len(lengths),), generator=gen).to(device)
    return DecodeCase(model, backend, seqs, input_ids)


def spread_lengths(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, MAX_MODEL_LEN - 1) for _ in range(count)]


def managed(pools: list[torch.Tensor]) -> list[torch.Tensor]:
    return [pool[:NUM_BLOCKS] for pool in pools]


# -- sizes and when graphs are used -------------------------------------------------------------


@pytest.mark.parametrize(
    ("largest", "sizes"),
    [
        (1, [1]),
        (3, [1, 2, 3]),
        (8, [1, 2, 4, 8]),
        (20, [1, 2, 4, 8, 16, 20]),
        (256, [1, 2, 4, *range(8, 257, 8)]),
    ],
)
def test_capture_sizes_double_then_step_by_eight_and_end_at_the_largest(largest: int, sizes: list[int]) -> None:
    assert capture_sizes(largest) == sizes


def config_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_graph_batch_limit_defaults_to_the_running_cap_at_most_256(tmp_path: Path) -> None:
    folder = config_dir(tmp_path)
    assert EngineConfig(model=folder).cuda_graph_batch_limit == 256
    assert EngineConfig(model=folder, max_running_requests=48).cuda_graph_batch_limit == 48
    assert EngineConfig(model=folder, max_running_requests=1000).cuda_graph_batch_limit == 256
    assert EngineConfig(model=folder, cuda_graph_max_bs=512, max_running_requests=16).cuda_graph_batch_limit == 512
    # No decode batch has more rows than a step has tokens.
    assert EngineConfig(model=folder, max_num_batched_tokens=100).cuda_graph_batch_limit == 100


@pytest.mark.parametrize(
    ("option", "value", "flag"),
    [
        ("cuda_graph_max_bs", 0, "--cuda-graph-max-bs"),
        ("cuda_graph_max_seq_len", 0, "--cuda-graph-max-seq-len"),
        ("gpu_memory_utilization", 0.0, "--gpu-memory-utilization"),
        ("gpu_memory_utilization", 1.5, "--gpu-memory-utilization"),
        ("gpu_memory_utilization", float("nan"), "--gpu-memory-utilization"),
    ],
)
def test_config_refuses_bad_graph_and_memory_values(tmp_path: Path, option: str, value: object, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        EngineConfig(model=config_dir(tmp_path), **{option: value})  # type: ignore[arg-type]


def test_graph_block_tables_are_as_wide_as_the_longest_replayed_sequence(tmp_path: Path) -> None:
    config = EngineConfig(model=config_dir(tmp_path), block_size=16)
    assert graph_table_width(config, 131072) == 8192 // 16  # capped: a 128k context runs long decodes eagerly
    assert graph_table_width(config, 1000) == 63  # the context itself when shorter
    wide = EngineConfig(model=config.model, block_size=16, cuda_graph_max_seq_len=32768)
    assert graph_table_width(wide, 131072) == 2048


def test_graphs_are_refused_off_cuda_for_unsafe_backends_and_when_disabled(tmp_path: Path) -> None:
    cache = KVCache(1, 4, BLOCK_SIZE, 1, 16, torch.float32, torch.device("cpu"))
    torch_backend, triton = TorchAttentionBackend(cache, 1.0), TritonAttentionBackend(cache, 1.0)
    config = EngineConfig(model=config_dir(tmp_path))
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert decode_graphs_refusal(config, cuda, triton) is None
    assert "cpu" in str(decode_graphs_refusal(config, cpu, triton))
    assert "TorchAttentionBackend" in str(decode_graphs_refusal(config, cuda, torch_backend))
    disabled = EngineConfig(model=config.model, disable_cuda_graph=True)
    assert decode_graphs_refusal(disabled, cuda, triton) == "--disable-cuda-graph"
    parallel = EngineConfig(model=config.model, tensor_parallel_size=2)
    assert "--tensor-parallel-size" in str(decode_graphs_refusal(parallel, cuda, triton))


# -- padded eager runs on CPU -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tiny_folder: Path) -> LlamaForCausalLM:
    model, _ = build_model(tiny_folder, torch.float32, "cpu")
    return model


# Batches padded to 1, 4, 8, 16 and 16 rows. The Triton backend runs in Triton's interpreter here, at
# seconds a row: its largest case is 9, which replays the 16-row graph with 7 padding rows; a full 16
# (12 s there, nothing padded) runs on the torch backend only.
PADDED_CASES = [
    (batch, backend) for backend in BACKENDS for batch in (1, 3, 6, 9, 16) if (batch, backend) != (16, "triton")
]


@pytest.mark.parametrize(("batch", "backend"), PADDED_CASES)
def test_padded_run_equals_the_unpadded_batch_and_keeps_padding_out_of_the_cache(
    tiny_model: LlamaForCausalLM, backend: str, batch: int
) -> None:
    case = decode_case(tiny_model, BACKENDS[backend], spread_lengths(batch, seed=batch), seed=batch)
    graphs = DecodeGraphs(case.model, case.backend, MAX_BS, WIDTH, torch.device("cpu"), eager=True)
    before = case.snapshot()
    expected = case.eager_logits()
    expected_cache = case.snapshot()
    case.restore(before)

    got = graphs.run(case.input_ids, build_context(case.backend, case.seqs))

    assert got.shape == expected.shape and got.isfinite().all()
    # The padded batch's matmuls have other shapes than the unpadded one's: the same sums, in another order.
    forward = forward_reduction(tiny_model.spec, MAX_MODEL_LEN)
    assert_close(got, expected, reduction=forward)
    after = case.snapshot()
    # Requests' blocks hold what the unpadded step wrote (poison where nothing was written).
    assert_close(managed(after), managed(expected_cache), reduction=forward, equal_nan=True)
    null, scratch = case.cache.null_block, case.cache.null_block + 1
    assert not any(pool[null].any() for pool in after), "padding wrote into the zero block"
    # Padding K/V go to the scratch block (the Triton store skips any slot past the requests' blocks).
    padded = graphs.padded_size(batch) > batch and backend == "torch"
    assert all(bool(pool[scratch].any()) == padded for pool in after), "padding K/V belong in the scratch block"


def test_a_smaller_batch_after_a_larger_one_pads_every_row_it_replays(tiny_model: LlamaForCausalLM) -> None:
    # The first five are short: their tables are narrower than the whole batch's.
    case = decode_case(tiny_model, TorchAttentionBackend, [3, 7, 2, 5, 4, 30, 12, 25, 9, 17, 1, 28, 6], seed=2)
    graphs = DecodeGraphs(case.model, case.backend, MAX_BS, WIDTH, torch.device("cpu"), eager=True)
    graphs.run(case.input_ids, build_context(case.backend, case.seqs))
    small = DecodeCase(case.model, case.backend, case.seqs[:5], case.input_ids[:5])
    small_ctx = build_context(case.backend, small.seqs)
    width = small_ctx.block_tables.shape[1]

    graphs.run(small.input_ids, small_ctx)

    size = graphs.padded_size(5)
    assert size == 8
    rows = slice(5, size)
    assert not graphs.input_ids[rows].any() and not graphs.positions[rows].any()
    assert (graphs.slot_mapping[rows] == case.cache.scratch_slot).all()
    assert (graphs.seq_lens[rows] == 1).all()
    assert (graphs.block_tables[rows] == case.cache.null_block).all()
    # Past its own blocks, a real row's table points at the zero block too.
    assert (graphs.block_tables[:5, width:] == case.cache.null_block).all()
    assert torch.equal(graphs.block_tables[:5, :width], small_ctx.block_tables)


def test_rows_a_larger_batch_left_behind_cannot_write_into_reused_blocks(tiny_model: LlamaForCausalLM) -> None:
    # A, B, C, E decode together; then E ends and its blocks go to D, whose prompt covers the slot
    # E's row wrote; then A, B and D decode in a padded batch of 4, where row 3 was E's.
    case = decode_case(tiny_model, TorchAttentionBackend, [9, 3, 6, 5], seed=6)
    graphs = DecodeGraphs(case.model, case.backend, MAX_BS, WIDTH, torch.device("cpu"), eager=True)
    graphs.run(case.input_ids, build_context(case.backend, case.seqs))
    e_blocks = case.seqs[3].block_ids
    d_prompt = torch.randint(0, tiny_model.spec.vocab_size, (6,), generator=torch.Generator().manual_seed(6))
    d_prefill = build_context(case.backend, [SequenceSlice(0, 6, e_blocks)])
    with torch.inference_mode():
        tiny_model(d_prompt, d_prefill.positions, d_prefill)
    second = DecodeCase(case.model, case.backend, [*case.seqs[:2], SequenceSlice(6, 1, e_blocks)], d_prompt[:3])
    before = case.snapshot()
    expected = second.eager_logits()
    case.restore(before)

    got = graphs.run(second.input_ids, build_context(case.backend, second.seqs))

    assert graphs.padded_size(3) == 4
    assert_close(got, expected, reduction=forward_reduction(tiny_model.spec, MAX_MODEL_LEN))


def test_padding_alone_writes_only_the_scratch_block(tiny_model: LlamaForCausalLM) -> None:
    case = decode_case(tiny_model, TorchAttentionBackend, spread_lengths(3, seed=4), seed=4)
    graphs = DecodeGraphs(case.model, case.backend, MAX_BS, WIDTH, torch.device("cpu"), eager=True)
    before = case.snapshot()

    logits = graphs.run_padding(MAX_BS)

    assert logits.shape == (MAX_BS, tiny_model.spec.vocab_size) and logits.isfinite().all()
    after = case.snapshot()
    torch.testing.assert_close(managed(after), managed(before), atol=0, rtol=0, equal_nan=True)
    assert not any(pool[case.cache.null_block].any() for pool in after)


def test_batches_that_do_not_fit_are_refused(tiny_model: LlamaForCausalLM) -> None:
    case = decode_case(tiny_model, TorchAttentionBackend, spread_lengths(6, seed=3), seed=3)
    graphs = DecodeGraphs(case.model, case.backend, 4, WIDTH, torch.device("cpu"), eager=True)
    too_many = build_context(case.backend, case.seqs)
    prefill = build_context(case.backend, [SequenceSlice(0, 3, case.seqs[0].block_ids)])
    narrow = DecodeGraphs(case.model, case.backend, 8, 2, torch.device("cpu"), eager=True)
    assert not graphs.fits(too_many) and not graphs.fits(prefill)
    assert not narrow.fits(build_context(case.backend, case.seqs[:4]))  # tables wider than 2 blocks
    assert graphs.fits(build_context(case.backend, case.seqs[:4]))
    with pytest.raises(ValueError, match="does not fit"):
        graphs.run(case.input_ids, too_many)


def test_runner_samples_only_the_rows_that_sample(tiny_model: LlamaForCausalLM) -> None:
    # Row 1 is a one-token prefill chunk that ends mid-prompt: it has logits but samples nothing.
    case = decode_case(tiny_model, TorchAttentionBackend, [4, 11, 7], seed=7)
    graphs = DecodeGraphs(case.model, case.backend, MAX_BS, WIDTH, torch.device("cpu"), eager=True)
    runner = ModelRunner(case.model, case.backend, BLOCK_SIZE, torch.device("cpu"), graphs)
    settings = SamplingSettings(max_new_tokens=4, temperature=0.0)
    sampled = [Sequence(EngineRequest(name, (1, 2), settings)) for name in ("a", "c")]
    ctx = build_context(case.backend, case.seqs)
    batch = Batch(case.input_ids, ctx, torch.tensor([0, 2]), sampled, prompt_rows=[])
    before = case.snapshot()
    expected = case.eager_logits()[[0, 2]]
    case.restore(before)

    got = runner.run(batch).sample

    assert_close(got, expected, reduction=forward_reduction(tiny_model.spec, MAX_MODEL_LEN))


# -- the engine ---------------------------------------------------------------------------------


def greedy_request(
    loaded: LoadedModel, rid: str, prompt: list[int], max_new: int, prompt_logprobs: bool
) -> EngineRequest:
    params = common_pb2.SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True)
    logprobs = common_pb2.LogprobOptions(logprob_start_len=1) if prompt_logprobs else None
    limits = Limits(len(prompt), loaded.max_model_len, loaded.vocab_size)
    settings = resolve(params, loaded.info.generation_defaults, limits, logprobs)
    return EngineRequest(rid, tuple(prompt), settings)


# Requests arriving at each step: a burst, then late arrivals that join running decodes.
ARRIVALS = {0: 3, 9: 1, 10: 1, 14: 2, 40: 3}
# Steps whose arrivals ask for prompt log-probabilities.
PROMPT_LOGPROBS = {10, 40}


def generate(engine: LLMEngine, loaded: LoadedModel, seed: int) -> dict[str, tuple[list[int], list[float]]]:
    """Requests of different lengths arriving as ARRIVALS says: greedy tokens and prompt
    log-probabilities per request."""
    rng = random.Random(seed)
    outputs: dict[str, tuple[list[int], list[float]]] = {}
    asking: list[str] = []
    step = 0
    while step <= max(ARRIVALS) or engine.has_work():
        for rid in (f"r{step}.{i}" for i in range(ARRIVALS.get(step, 0))):
            prompt = [rng.randrange(3, loaded.vocab_size) for _ in range(rng.randint(2, 12))]
            max_new = rng.randint(6, 16)
            engine.add_request(greedy_request(loaded, rid, prompt, max_new, step in PROMPT_LOGPROBS))
            asking += [rid] if step in PROMPT_LOGPROBS else []
            outputs[rid] = ([], [])
        for out in engine.step():
            tokens, prompt_logprobs = outputs[out.request_id]
            tokens += out.output.token_ids
            prompt_logprobs += [position.token.logprob for position in out.output.input_logprobs]
        engine.block_manager.check_integrity()
        step += 1
        assert step < 1000
    assert all(outputs[rid][1] for rid in asking), "every request asking for prompt log-probabilities got them"
    return outputs


@dataclass
class GraphRuns:
    """What the decode graphs ran: rows per run, and runs where a row sampled nothing."""

    rows: list[int]
    unsampled: int = 0


def spy_on_graphs(monkeypatch: pytest.MonkeyPatch, engine: LLMEngine) -> GraphRuns:
    runs = GraphRuns([])
    graphs = engine.runner.graphs
    assert graphs is not None
    run_graph = engine.runner._run_graph

    def counting(batch: Batch, used: DecodeGraphs) -> StepLogits:
        runs.rows.append(batch.context.num_sequences)
        runs.unsampled += len(batch.sample_seqs) < batch.context.num_sequences
        return run_graph(batch, used)

    monkeypatch.setattr(engine.runner, "_run_graph", counting)
    return runs


@pytest.fixture(scope="module")
def loaded_tiny(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir))


def test_engine_greedy_output_is_the_same_through_padded_decode_graphs(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, loaded_tiny: LoadedModel
) -> None:
    # A budget of 4 tokens: a late arrival gets a one-token chunk beside three decodes (a decode-only
    # batch with a row that samples nothing).
    options = {"num_kv_blocks": 128, "max_num_batched_tokens": 4}
    plain = LLMEngine(EngineConfig(model=tiny_model_dir, **options), loaded_tiny)  # type: ignore[arg-type]
    expected = generate(plain, loaded_tiny, seed=5)
    engine = LLMEngine(EngineConfig(model=tiny_model_dir, **options), loaded_tiny)  # type: ignore[arg-type]
    backend = engine.runner.backend
    width = blocks_per_sequence(loaded_tiny.max_model_len, engine.config.block_size)
    engine.runner.graphs = DecodeGraphs(loaded_tiny.model, backend, 4, width, loaded_tiny.device, eager=True)
    runs = spy_on_graphs(monkeypatch, engine)

    assert generate(engine, loaded_tiny, seed=5) == expected
    assert set(runs.rows) == {1, 2, 3, 4}
    assert runs.unsampled > 0


# -- CUDA: captured graphs ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda_model(tiny_folder: Path) -> LlamaForCausalLM:
    model, _ = build_model(tiny_folder, torch.float32, "cuda")
    return model


@on_cuda
def test_replays_equal_eager_runs_for_batches_between_sizes(cuda_model: LlamaForCausalLM) -> None:
    device = torch.device("cuda")
    case = decode_case(cuda_model, TritonAttentionBackend, spread_lengths(MAX_BS, seed=4), seed=4)
    graphs = DecodeGraphs(case.model, case.backend, MAX_BS, WIDTH, device)
    eager = DecodeGraphs(case.model, case.backend, MAX_BS, WIDTH, device, eager=True)
    graphs.capture()
    assert sorted(graphs.graphs) == capture_sizes(MAX_BS)
    before = case.snapshot()
    # Larger and smaller batches in turn: each replay sees only its own rows and padding.
    for batch in (16, 3, 9, 1, 13, 2, 5):
        part = DecodeCase(case.model, case.backend, case.seqs[:batch], case.input_ids[:batch])
        case.restore(before)
        padded = eager.run(part.input_ids, build_context(part.backend, part.seqs, device)).clone()
        padded_cache = case.snapshot()
        case.restore(before)
        unpadded = part.eager_logits()
        case.restore(before)

        replayed = graphs.run(part.input_ids, build_context(part.backend, part.seqs, device))

        # The same kernels on the same shapes as the eager padded run; the unpadded run's matmuls
        # have other shapes, so only nearly the same sums.
        torch.testing.assert_close(replayed, padded, atol=1e-6, rtol=1e-6, msg=f"batch {batch}: replay != eager")
        assert_close(replayed, unpadded, reduction=forward_reduction(cuda_model.spec, MAX_MODEL_LEN))
        torch.testing.assert_close(case.snapshot(), padded_cache, atol=1e-6, rtol=1e-6, equal_nan=True)
        null = case.cache.null_block
        assert not any(pool[null].any() for pool in case.snapshot())


@on_cuda
def test_engine_greedy_output_is_the_same_with_cuda_graphs_on_and_off(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    def make(disable_cuda_graph: bool = False) -> EngineConfig:
        return EngineConfig(
            model=tiny_model_dir,
            device="cuda",
            dtype="float32",
            num_kv_blocks=128,
            cuda_graph_max_bs=8,
            disable_cuda_graph=disable_cuda_graph,
        )

    loaded = load_model(make())
    off = LLMEngine(make(disable_cuda_graph=True), loaded)
    assert off.runner.graphs is None
    expected = generate(off, loaded, seed=6)
    on = LLMEngine(make(), loaded)
    assert on.runner.graphs is not None and sorted(on.runner.graphs.graphs) == [1, 2, 4, 8]
    runs = spy_on_graphs(monkeypatch, on)

    assert generate(on, loaded, seed=6) == expected
    assert len(set(runs.rows)) > 2
