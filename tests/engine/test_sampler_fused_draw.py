"""The sampler's fused draw (kernels/sampling.py): taken for all-unseeded batches where it runs (CUDA;
here forced onto the interpreter), never with a seeded row in the batch, never on CPU by default.
Through sample() it follows each row's distribution, full-width and compacted (top-k) rows alike,
and torch.manual_seed fixes it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

from services.engine.kernels import sampling as sampling_kernel
from services.engine.sampler import draw, sample
from tests.engine.test_sampler_support import assert_frequencies, logits_of, renormalised, row, settings

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
PROBS = [0.3, 0.25, 0.15, 0.1, 0.08, 0.05, 0.04, 0.03]
TEMPERED = renormalised([p ** (1 / 0.8) for p in PROBS], set(range(len(PROBS))))  # temperature 0.8
TOP_3 = renormalised(PROBS, {0, 1, 2})


@pytest.fixture
def kernel_launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The (rows, columns) of each fused-draw launch."""
    launches: list[tuple[int, int]] = []
    original: Callable[..., torch.Tensor] = sampling_kernel.exponential_race_argmax

    def counted(logits: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        launches.append(tuple(logits.shape))
        return original(logits, *args, **kwargs)

    monkeypatch.setattr(sampling_kernel, "exponential_race_argmax", counted)
    return launches


@pytest.fixture
def fused_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(draw, "fused_draw_runs_on", lambda device: True)


def test_only_cuda_takes_the_fused_draw() -> None:
    assert draw.fused_draw_runs_on(torch.device("cuda"))
    assert not draw.fused_draw_runs_on(torch.device("cpu"))


def test_cpu_keeps_the_torch_draw(kernel_launches: list[tuple[int, int]]) -> None:
    sample(torch.randn(3, 8), [row(settings()) for _ in range(3)])
    assert kernel_launches == []


def test_the_sampling_backend_decides_the_draw(kernel_launches: list[tuple[int, int]]) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (draw.fused_draw_for("auto", cuda), draw.fused_draw_for("auto", cpu)) == (True, False)
    assert not draw.fused_draw_for("torch", cuda)
    assert draw.fused_draw_for("triton", cpu)  # the suite runs with TRITON_INTERPRET=1
    rows = [row(settings()) for _ in range(3)]
    sample(torch.randn(3, 8), rows, fused_draw=True)
    sample(torch.randn(3, 8), rows, fused_draw=False)
    assert kernel_launches == [(3, 8)]


def test_a_triton_draw_where_triton_cannot_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="--sampling-backend triton needs a CUDA device, or TRITON_INTERPRET=1"):
        draw.fused_draw_for("triton", torch.device("cpu"))


@pytest.mark.usefixtures("fused_on_cpu")
def test_unseeded_rows_follow_their_distributions(kernel_launches: list[tuple[int, int]]) -> None:
    """One sample() call of 1500 rows a setting: temperature only and top-k 3, side by side in 8 columns."""
    draws = 1500
    logits = logits_of(PROBS).expand(2 * draws, -1).contiguous()
    rows = [row(settings(temperature=0.8)) for _ in range(draws)] + [row(settings(top_k=3)) for _ in range(draws)]
    tokens = sample(logits, rows).token_ids
    assert kernel_launches == [(2 * draws, len(PROBS))]
    assert_frequencies(Counter(tokens[:draws]), TEMPERED, draws)
    assert_frequencies(Counter(tokens[draws:]), TOP_3, draws)


@pytest.mark.usefixtures("fused_on_cpu")
def test_compacted_columns_map_to_token_ids(kernel_launches: list[tuple[int, int]]) -> None:
    """All rows top-k 3 of 64 tokens: the kernel sees the compacted (R, 3) candidates, and its columns
    become token ids through them. The likely tokens sit at high ids, so a column taken for an id shows."""
    draws = 600
    logits = torch.full((64,), -30.0)
    logits[56:] = logits_of(PROBS[::-1])  # token 63 is the likeliest
    tokens = sample(logits.expand(draws, -1).contiguous(), [row(settings(top_k=3))] * draws).token_ids
    assert kernel_launches == [(draws, 3)]
    assert_frequencies(Counter(tokens), {63 - i: p for i, p in TOP_3.items()}, draws)


@pytest.mark.usefixtures("fused_on_cpu")
def test_a_seeded_row_keeps_the_batch_on_the_generator_draw(kernel_launches: list[tuple[int, int]]) -> None:
    logits = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    seeded = [row(settings(), generator=torch.Generator().manual_seed(7)), row(settings()), row(settings())]
    token = sample(logits, seeded).token_ids[0]
    assert kernel_launches == []
    alone = sample(logits[:1], [row(settings(), generator=torch.Generator().manual_seed(7))]).token_ids[0]
    assert token == alone


@pytest.mark.usefixtures("fused_on_cpu")
def test_manual_seed_fixes_the_fused_draw() -> None:
    logits = torch.zeros(64, 8)
    rows = [row(settings()) for _ in range(64)]
    torch.manual_seed(3)
    first = sample(logits, rows).token_ids
    torch.manual_seed(3)
    assert sample(logits, rows).token_ids == first
    assert sample(logits, rows).token_ids != first


@needs_cuda
def test_fused_draw_on_cuda_follows_the_distributions(kernel_launches: list[tuple[int, int]]) -> None:
    draws = 20000
    logits = logits_of(PROBS).to("cuda").expand(2 * draws, -1).contiguous()
    rows = [row(settings(temperature=0.8)) for _ in range(draws)] + [row(settings(top_k=3)) for _ in range(draws)]
    tokens = sample(logits, rows).token_ids
    assert kernel_launches == [(2 * draws, len(PROBS))]
    assert_frequencies(Counter(tokens[:draws]), TEMPERED, draws)
    assert_frequencies(Counter(tokens[draws:]), TOP_3, draws)
