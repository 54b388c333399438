"""Every part of the CUDA path at once, on CPU: Triton attention and the fused RMSNorm / rotary
kernels (in Triton's interpreter), the overlap schedule and decode steps run through the CUDA
graphs' padded static buffers (eager: capture needs a GPU). On a GPU these are all on by
default together, so their interplay is checked here against the plain torch engine: the same
greedy tokens through chunked prefill, mixed batches, prefix-cache hits and staggered arrivals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from services.engine.attention.triton_backend import TritonAttentionBackend
from services.engine.config import EngineConfig
from services.engine.cuda_graphs import DecodeGraphs, graph_table_width
from services.engine.kernels import sampling as sampling_kernel
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import LoadedModel, load_model
from services.engine.model_runner import Batch, StepLogits
from services.engine.models.layers import RMSNorm, enable_fused_kernels
from services.engine.request import EngineRequest
from services.engine.sampling_validation import Limits, resolve
from tests.engine.model_fixtures import build_tiny_checkpoint
from tests.engine.test_engine_parity import prompts, request, run
from turnout.v1 import common_pb2

OPTIONS: dict[str, Any] = {"num_kv_blocks": 64, "block_size": 4, "max_num_batched_tokens": 12, "dtype": "float32"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Untied with unit-scale weights: its greedy tokens change with any attention or norm mistake.
    return build_tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama_untied")


def plain_engine(model_dir: Path) -> LLMEngine:
    config = EngineConfig(model=model_dir, attention_backend="torch", overlap_schedule=False, **OPTIONS)
    return LLMEngine(config, load_model(config))


def cuda_path_engine(model_dir: Path) -> tuple[LLMEngine, list[int]]:
    """The engine as a GPU runs it, and the batch sizes its decode graphs ran."""
    config = EngineConfig(
        model=model_dir,
        attention_backend="triton",
        sampling_backend="triton",
        overlap_schedule=True,
        cuda_graph_max_seq_len=64,
        **OPTIONS,
    )
    loaded: LoadedModel = load_model(config)
    enable_fused_kernels(loaded.model)  # the loader does this on CUDA only
    engine = LLMEngine(config, loaded)
    assert engine.runner.graphs is None, "no capture on CPU"
    graphs = DecodeGraphs(
        loaded.model,
        engine.runner.backend,
        8,
        graph_table_width(config, loaded.max_model_len),
        loaded.device,
        eager=True,
    )
    engine.runner.graphs = graphs
    replayed: list[int] = []
    run_graph = engine.runner._run_graph

    def counting(batch: Batch, used: DecodeGraphs) -> StepLogits:
        replayed.append(batch.context.num_sequences)
        return run_graph(batch, used)

    engine.runner._run_graph = counting  # type: ignore[method-assign,assignment]
    return engine, replayed


def test_the_whole_cuda_path_gives_the_plain_engines_greedy_tokens(model_dir: Path) -> None:
    plain = plain_engine(model_dir)
    loaded = plain.loaded
    system = prompts(loaded, 1, seed=3, low=10, high=10)[0]  # two full blocks of 4, shared
    shared = prompts(loaded, 2, seed=4, low=3, high=6, prefix=system)
    others = prompts(loaded, 5, seed=5, low=2, high=12)

    def arrivals() -> dict[int, list[EngineRequest]]:
        return {
            0: [request(loaded, "a", others[0], 8), request(loaded, "s0", shared[0], 6)],
            3: [request(loaded, "b", others[1], 5), request(loaded, "s1", shared[1], 6)],
            9: [
                request(loaded, "c", others[2], 7),
                request(loaded, "d", others[3], 3),
                request(loaded, "e", others[4], 9),
            ],
        }

    expected = run(plain, arrivals())
    engine, replayed = cuda_path_engine(model_dir)
    got = run(engine, arrivals())

    assert got == expected
    tokens, cached = got
    assert all(len(set(ids)) > 1 for ids in tokens.values()), "outputs that would show a numerical mistake"
    assert cached["s1"] == 8, "s1 was meant to find s0's two full blocks in the prefix cache"
    assert isinstance(engine.runner.backend, TritonAttentionBackend) and engine.overlap and engine.fused_draw
    assert all(m.fused for m in engine.loaded.model.modules() if isinstance(m, RMSNorm))
    # Decode-only steps went through the padded graph buffers, at sizes between captured ones too.
    assert replayed and max(replayed) > 1 and any(n not in (1, 2, 4, 8) for n in replayed)
    assert not torch.isnan(engine.runner.backend.kv_cache.k[0][engine.runner.backend.kv_cache.null_block]).any()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_sampling_backend_decides_where_unseeded_requests_draw(
    model_dir: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    launches: list[int] = []
    original = sampling_kernel.exponential_race_argmax

    def counted(logits: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        launches.append(logits.shape[0])
        return original(logits, *args, **kwargs)

    monkeypatch.setattr(sampling_kernel, "exponential_race_argmax", counted)
    config = EngineConfig(model=model_dir, sampling_backend=backend, **OPTIONS)
    engine = LLMEngine(config, load_model(config))
    loaded = engine.loaded
    params = common_pb2.SamplingParams(temperature=1.0, max_new_tokens=4, ignore_eos=True)
    settings = resolve(params, loaded.info.generation_defaults, Limits(5, loaded.max_model_len, loaded.vocab_size))
    tokens, _ = run(engine, {0: [EngineRequest("r", (5, 6, 7, 8, 9), settings)]})
    assert len(tokens["r"]) == 4
    assert launches == ([1] * 4 if backend == "triton" else [])
