"""The engine on the Triton attention backend (interpreted on CPU) generates the greedy tokens it
generates on the torch backend, through chunked prefill, mixed batches and prefix-cache hits; and
EngineConfig.attention_backend picks the backend."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from services.engine.attention.context import ForwardContext
from services.engine.attention.cpu_backend import CpuAttentionBackend
from services.engine.attention.torch_backend import TorchAttentionBackend
from services.engine.attention.triton_backend import TritonAttentionBackend
from services.engine.config import EngineConfig
from services.engine.cpu_kernels import load as load_cpu_kernels
from services.engine.model_loader import LoadedModel, load_model
from tests.engine.model_fixtures import build_tiny_checkpoint
from tests.engine.test_engine_parity import make_engine, prompts, request, run


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama whose greedy tokens change with any attention mistake: unit-scale random weights
    and untied embeddings (tiny_model_dir, default-initialized, and the tied unit-scale one each
    repeat one token whatever attention computes)."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama_untied")


@pytest.fixture(scope="module")
def loaded(model_dir: Path) -> LoadedModel:
    # float32 on a GPU as well: bfloat16 rounding could flip a greedy choice between two backends.
    return load_model(EngineConfig(model=model_dir, dtype="float32"))


def test_greedy_tokens_match_the_torch_backend(model_dir: Path, loaded: LoadedModel) -> None:
    system = prompts(loaded, 1, seed=3, low=10, high=10)[0]  # shared: two full blocks of 4
    shared = prompts(loaded, 2, seed=4, low=3, high=6, prefix=system)
    others = prompts(loaded, 2, seed=5, low=5, high=12)
    results = {}
    for name in ("torch", "triton"):
        engine = make_engine(
            model_dir,
            loaded,
            attention_backend=name,
            num_kv_blocks=48,
            block_size=4,
            max_num_batched_tokens=12,  # chunks every prompt, mixes chunks with decodes
        )
        batches = record_batches(engine.runner.backend)
        arrivals = {
            0: [request(loaded, "a", others[0], 6), request(loaded, "s0", shared[0], 6)],
            4: [request(loaded, "b", others[1], 6), request(loaded, "s1", shared[1], 6)],
        }
        results[name] = run(engine, arrivals)
    assert isinstance(engine.runner.backend, TritonAttentionBackend)
    assert results["triton"] == results["torch"]
    tokens, cached = results["triton"]
    assert all(len(set(ids)) > 1 for ids in tokens.values()), "outputs that would show an attention mistake"
    assert cached["s1"] == 8, "s1 was meant to find s0's two full blocks in the prefix cache"
    # The batches the triton run went through (two layers each):
    lens = [(ctx.query_lens_cpu, ctx.seq_lens_cpu) for ctx in batches]
    assert any(1 in q and any(n > 1 for n in q) for q, _ in lens), "a prefill chunk mixed with decodes"
    assert any(1 < q_b < s_b for q, s in lens for q_b, s_b in zip(q, s, strict=True)), "a chunk after a prefix"
    assert any(all(n == 1 for n in q) for q, _ in lens), "a decode-only batch"


def record_batches(backend: object) -> list[ForwardContext]:
    """Every ForwardContext the backend's forward is called with, in order."""
    seen: list[ForwardContext] = []
    forward = backend.forward  # type: ignore[attr-defined]

    def spy(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        seen.append(ctx)
        return forward(layer, q, k, v, ctx)  # type: ignore[no-any-return]

    backend.forward = spy  # type: ignore[attr-defined]
    return seen


def cpu_auto_backend() -> type:
    """`auto` on CPU: the C++ kernel's backend where it builds, else torch."""
    return CpuAttentionBackend if load_cpu_kernels() is not None else TorchAttentionBackend


def test_the_configured_backend_is_built(loaded: LoadedModel) -> None:
    auto = TritonAttentionBackend if loaded.device.type == "cuda" else cpu_auto_backend()
    assert type(loaded.make_backend(4, 4)) is auto
    assert type(loaded.make_backend(4, 4, "torch")) is TorchAttentionBackend
    assert type(loaded.make_backend(4, 4, "triton")) is TritonAttentionBackend


def test_unusable_triton_is_refused(loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"--attention-backend triton: .* power of two >= 16, got 24"):
        dataclasses.replace(loaded, head_dim=24).make_backend(4, 4, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    on_cpu = dataclasses.replace(loaded, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="needs a CUDA device, or TRITON_INTERPRET=1 on CPU"):
        on_cpu.make_backend(4, 4, "triton")
    assert type(on_cpu.make_backend(4, 4, "auto")) is cpu_auto_backend()


def test_unknown_backend_names_are_refused(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="--attention-backend must be one of auto, torch, triton, cpu"):
        EngineConfig(model=model_dir, attention_backend="flash")
    with pytest.raises(ValueError, match="--sampling-backend must be one of auto, torch, triton"):
        EngineConfig(model=model_dir, sampling_backend="flashinfer")
