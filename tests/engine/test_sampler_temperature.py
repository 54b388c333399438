"""Temperature and dynamic temperature: the logprobs returned are log_softmax(logits / T) with T
from an independent per-row reference, and draws follow that distribution."""

from __future__ import annotations

import math

import pytest
import torch

from services.engine.sampler import sample
from tests.engine.test_sampler_support import (
    assert_frequencies,
    draw_counts,
    log_softmax,
    logprobs_of,
    row,
    settings,
    softmax,
)

LOGITS = [2.0, 1.0, 0.5, 0.0, -1.0, -2.0]
DRAWS = 4000


def ref_dynatemp(logits: list[float], low: float, high: float, exponent: float) -> float:
    probs = [p for p in softmax(logits) if p > 0]
    entropy = -sum(p * math.log(p) for p in probs)
    live = sum(1 for x in logits if x != float("-inf"))
    return low + (high - low) * (entropy / math.log(live)) ** exponent


@pytest.mark.parametrize("temperature", [0.5, 1.7])
def test_temperature_divides_the_logits(temperature: float) -> None:
    got = logprobs_of(torch.tensor(LOGITS), row(settings(temperature=temperature), want_logprobs=True))
    expected = log_softmax([x / temperature for x in LOGITS])
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float32), atol=1e-5)


def test_draws_follow_the_tempered_distribution() -> None:
    counts = draw_counts(torch.tensor(LOGITS), settings(temperature=0.6), DRAWS)
    expected = softmax([x / 0.6 for x in LOGITS])
    assert_frequencies(counts, dict(enumerate(expected)), DRAWS)


@pytest.mark.parametrize(
    ("logits", "low", "high", "exponent"),
    [
        (LOGITS, 0.5, 1.5, 1.0),
        (LOGITS, 0.2, 3.0, 2.0),
        ([4.0, 0.0, float("-inf"), -1.0, float("-inf"), 0.5], 0.3, 1.2, 0.5),
    ],
)
def test_dynamic_temperature_follows_the_normalised_entropy(
    logits: list[float], low: float, high: float, exponent: float
) -> None:
    s = settings(temperature=1.0, dynatemp_min=low, dynatemp_max=high, dynatemp_exponent=exponent)
    temperature = ref_dynatemp(logits, low, high, exponent)
    assert abs(temperature - 1.0) > 0.05, "the case must change the temperature"
    got = logprobs_of(torch.tensor(logits), row(s, want_logprobs=True))
    expected = log_softmax([x / temperature for x in logits])
    finite = [i for i, x in enumerate(logits) if x != float("-inf")]
    assert torch.allclose(got[finite], torch.tensor([expected[i] for i in finite]), atol=1e-4)
    assert all(got[i] == float("-inf") for i in range(len(logits)) if i not in finite)


def test_dynamic_temperature_replaces_the_requested_temperature() -> None:
    # As in Aphrodite, dynatemp ignores `temperature` (except 0, which is greedy).
    base = dict(dynatemp_min=0.5, dynatemp_max=1.5)
    a = logprobs_of(torch.tensor(LOGITS), row(settings(temperature=0.3, **base), want_logprobs=True))
    b = logprobs_of(torch.tensor(LOGITS), row(settings(temperature=2.0, **base), want_logprobs=True))
    assert torch.equal(a, b)


def test_greedy_rows_ignore_temperature_truncation_and_dynatemp() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.9, 1.0]])
    s = settings(temperature=0.0, top_k=1, xtc_probability=1.0, xtc_threshold=0.01, dynatemp_max=2.0)
    assert s.greedy
    out = sample(logits, [row(s, want_logprobs=True)])
    assert out.token_ids == [1]
    assert out.logprobs is not None
    assert torch.allclose(out.logprobs[0], torch.log_softmax(logits[0], dim=-1))  # temperature 1
