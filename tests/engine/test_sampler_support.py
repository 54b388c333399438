"""Helpers shared by the test_sampler_* files (no tests here): rows, many-draw runs and
straightforward reference formulas written per row in plain Python."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import torch

from services.engine.sampler import SamplerOutput, SamplerRow, sample
from services.engine.sampling_params import SamplingSettings


def settings(**fields: object) -> SamplingSettings:
    return SamplingSettings(max_new_tokens=100, **fields)  # type: ignore[arg-type]


def row(
    s: SamplingSettings,
    token_ids: Sequence[int] = (),
    num_prompt_tokens: int | None = None,
    generator: torch.Generator | None = None,
    suppressed_ids: Sequence[int] = (),
    want_logprobs: bool = False,
) -> SamplerRow:
    return SamplerRow(
        settings=s,
        token_ids=list(token_ids),
        num_prompt_tokens=len(token_ids) if num_prompt_tokens is None else num_prompt_tokens,
        generator=generator,
        suppressed_ids=list(suppressed_ids),
        want_logprobs=want_logprobs,
    )


def logits_of(probs: Sequence[float]) -> torch.Tensor:
    """(V,) float32 logits whose softmax is `probs` (which should sum to 1)."""
    return torch.tensor([math.log(p) for p in probs], dtype=torch.float32)


def draw_counts(
    logits: torch.Tensor, s: SamplingSettings, draws: int = 4000, seed: int = 0, **row_fields: object
) -> Counter[int]:
    """Token counts over `draws` rows of the same logits (V,) and settings in one sample() call,
    all rows drawing from one fixed generator."""
    generator = torch.Generator().manual_seed(seed)
    rows = [row(s, generator=generator, **row_fields) for _ in range(draws)]  # type: ignore[arg-type]
    out = sample(logits.unsqueeze(0).expand(draws, -1).contiguous(), rows)
    return Counter(out.token_ids)


def logprobs_of(logits: torch.Tensor, r: SamplerRow) -> torch.Tensor:
    """(V,) the sampler's logprobs for a single row asking for them."""
    out: SamplerOutput = sample(logits.unsqueeze(0), [r])
    assert out.logprobs is not None
    return out.logprobs[0]


def log_softmax(values: Sequence[float]) -> list[float]:
    finite = [v for v in values if v != -math.inf]
    top = max(finite)
    log_z = top + math.log(sum(math.exp(v - top) for v in finite))
    return [v - log_z if v != -math.inf else -math.inf for v in values]


def softmax(values: Sequence[float]) -> list[float]:
    return [math.exp(v) for v in log_softmax(values)]


def assert_frequencies(counts: Counter[int], expected: dict[int, float], draws: int) -> None:
    """Empirical frequencies within 5 standard errors (+0.005) of the expected probabilities, and
    no token outside `expected`."""
    assert set(counts) <= set(expected), f"unexpected tokens {set(counts) - set(expected)}"
    for token, p in expected.items():
        tolerance = 5.0 * math.sqrt(p * (1.0 - p) / draws) + 0.005
        assert abs(counts[token] / draws - p) <= tolerance, (token, counts[token] / draws, p)


def renormalised(probs: Sequence[float], keep: set[int]) -> dict[int, float]:
    total = sum(probs[i] for i in keep)
    return {i: probs[i] / total for i in keep}
