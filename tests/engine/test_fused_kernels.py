"""Models with the fused kernels on (RMSNorm, residual add + RMSNorm and rotary as Triton kernels,
interpreted on CPU) compute what the torch ops compute: the same logits at every step of a
prefill / chunk / decode schedule and the same greedy tokens. The loader switches them on for CUDA
only."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.kernels import rms_norm as rms_norm_module
from services.engine.kernels import rotary as rotary_module
from services.engine.model_loader import load_model
from services.engine.models import build_model
from services.engine.models.layers import RMSNorm, RotaryEmbedding, enable_fused_kernels
from services.engine.models.llama import LlamaForCausalLM
from tests.engine.model_fixtures import PagedSequences, build_tiny_checkpoint
from tests.tolerances import assert_close, forward_reduction

needs_cuda = pytest.mark.cuda
# Tokens per sequence per step: a batched prefill, a chunk over the cached prefix beside a decode,
# then decodes.
SCHEDULE = [{"a": 7, "b": 5}, {"a": 6, "b": 1}, {"a": 1, "b": 1}, {"a": 1, "b": 1}]
CONTEXT = max(sum(step.get(s, 0) for step in SCHEDULE) for s in ("a", "b"))  # the longest sequence


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often each kernel launcher runs (layers import them at call time, so the spies are seen)."""
    calls: Counter[str] = Counter()

    def spy(module: Any, name: str) -> None:
        original: Callable[..., Any] = getattr(module, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    spy(rms_norm_module, "rms_norm")
    spy(rms_norm_module, "fused_add_rms_norm")
    spy(rotary_module, "rotary_embedding")
    return calls


def fused_modules(model: torch.nn.Module) -> list[bool]:
    return [m.fused for m in model.modules() if isinstance(m, (RMSNorm, RotaryEmbedding))]


def run_schedule(model: LlamaForCausalLM, fused: bool, device: str = "cpu") -> list[dict[str, torch.Tensor]]:
    enable_fused_kernels(model, fused)
    runner = PagedSequences(model, seed=3, device=device)
    g = torch.Generator().manual_seed(5)
    return [
        runner.step({s: torch.randint(0, 256, (n,), generator=g).tolist() for s, n in step.items()})
        for step in SCHEDULE
    ]


def greedy(model: LlamaForCausalLM, prompt: list[int], steps: int, fused: bool, device: str = "cpu") -> list[int]:
    enable_fused_kernels(model, fused)
    runner = PagedSequences(model, seed=4, device=device)
    logits = runner.step({"a": prompt})["a"][-1]
    tokens: list[int] = []
    for _ in range(steps):
        tokens.append(int(logits.argmax()))
        logits = runner.step({"a": tokens[-1:]})["a"][-1]
    return tokens


@pytest.mark.parametrize("name", ["llama3_rope", "qwen3"])  # scaled rope; per-head q/k norm on strided views
def test_fused_kernels_match_torch_ops(tmp_path: Path, name: str, kernel_calls: Counter[str]) -> None:
    model, _ = build_model(build_tiny_checkpoint(tmp_path, name), torch.float32, "cpu")
    expected = run_schedule(model, fused=False)
    assert not kernel_calls
    actual = run_schedule(model, fused=True)
    assert all(fused_modules(model))
    layers = model.spec.num_layers
    assert kernel_calls["rotary_embedding"] == layers * len(SCHEDULE)
    # Per forward: the first input norm has no residual; every later norm adds one (the final norm too).
    q_k_norms = 2 * layers if model.spec.qk_norm else 0
    assert kernel_calls["rms_norm"] == (1 + q_k_norms) * len(SCHEDULE)
    assert kernel_calls["fused_add_rms_norm"] == 2 * layers * len(SCHEDULE)
    forward = forward_reduction(model.spec, CONTEXT)
    for want, got in zip(expected, actual, strict=True):
        for seq in want:
            assert_close(got[seq], want[seq], reduction=forward)


def test_tiny_llama_greedy_tokens_match(tiny_model_dir: Path) -> None:
    loaded = load_model(EngineConfig(model=tiny_model_dir, device="cpu"))
    assert not any(fused_modules(loaded.model)), "the loader keeps the torch ops on CPU"
    model = loaded.model
    assert isinstance(model, LlamaForCausalLM)
    prompt = [1, 9690, 198, 2683, 359, 253, 5356]
    expected = greedy(model, prompt, steps=6, fused=False)
    assert greedy(model, prompt, steps=6, fused=True) == expected


def test_enabling_needs_a_device_triton_runs_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = build_model(build_tiny_checkpoint(tmp_path, "llama"), torch.float32, "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="need a CUDA device, or TRITON_INTERPRET=1"):
        enable_fused_kernels(model)
    enable_fused_kernels(model, False)
    assert not any(fused_modules(model))


@needs_cuda
def test_loader_turns_fused_kernels_on_for_cuda(tiny_model_dir: Path) -> None:
    loaded = load_model(EngineConfig(model=tiny_model_dir, device="cuda"))
    assert all(fused_modules(loaded.model))


@needs_cuda
def test_fused_kernels_on_cuda(tmp_path: Path) -> None:
    """fp32: the same greedy tokens and logits to float32 precision; bf16: logits within bf16 noise."""
    folder = build_tiny_checkpoint(tmp_path, "qwen3")
    model, _ = build_model(folder, torch.float32, "cuda")
    assert greedy(model, [5, 17, 99, 3], 8, fused=True, device="cuda") == greedy(
        model, [5, 17, 99, 3], 8, fused=False, device="cuda"
    )
    forward = forward_reduction(model.spec, CONTEXT)
    for want, got in zip(run_schedule(model, False, "cuda"), run_schedule(model, True, "cuda"), strict=True):
        for seq in want:
            assert_close(got[seq], want[seq], reduction=forward)
    model, _ = build_model(folder, torch.bfloat16, "cuda")
    # In bfloat16 every op rounds its output: a norm or rotation that lands one step apart (another
    # float32 sum order) carries that step through the layers after it.
    roundings = 2 * model.spec.num_layers + 1
    for want, got in zip(run_schedule(model, False, "cuda"), run_schedule(model, True, "cuda"), strict=True):
        for seq in want:
            assert_close(got[seq], want[seq], reduction=forward, dtype=torch.bfloat16, roundings=roundings)
