"""typical_p, quadratic smoothing and XTC through sample(), against per-row references."""

from __future__ import annotations

import math

import pytest
import torch

from services.engine.sampler import sample
from services.engine.sampler.shaping import quadratic_smoothing
from tests.engine.test_sampler_support import (
    assert_frequencies,
    draw_counts,
    logits_of,
    renormalised,
    row,
    settings,
    softmax,
)

PROBS = [0.05, 0.4, 0.02, 0.25, 0.1, 0.08, 0.06, 0.04]
DRAWS = 4000


def ref_typical(probs: list[float], typical_p: float) -> set[int]:
    entropy = -sum(p * math.log(p) for p in probs)
    order = sorted(range(len(probs)), key=lambda i: (abs(-math.log(probs[i]) - entropy), i))
    keep: set[int] = set()
    mass = 0.0
    for i in order:
        mass += probs[i]
        if keep and mass >= typical_p:
            break
        keep.add(i)
    return keep


def ref_smoothed(logits: list[float], factor: float, curve: float) -> list[float]:
    top = max(logits)
    k = factor * (3 - curve) / 2
    s = factor * (curve - 1) / 2
    return [top - k * (x - top) ** 2 + s * (x - top) ** 3 for x in logits]


@pytest.mark.parametrize("typical_p", [0.3, 0.6, 0.9])
def test_typical_keeps_the_tokens_closest_to_the_entropy(typical_p: float) -> None:
    keep = ref_typical(PROBS, typical_p)
    assert keep != set(range(len(PROBS)))
    counts = draw_counts(logits_of(PROBS), settings(typical_p=typical_p), DRAWS)
    assert set(counts) == keep
    assert_frequencies(counts, renormalised(PROBS, keep), DRAWS)


def test_typical_can_drop_the_most_likely_token() -> None:
    # H = 1.75 nats: the 0.4 token (surprisal 0.92) is further from H than the 0.1 ones (2.30);
    # ties in typicality rank by id.
    probs = [0.4] + [0.1] * 6
    assert ref_typical(probs, 0.25) == {1, 2}
    counts = draw_counts(logits_of(probs), settings(typical_p=0.25), 500)
    assert set(counts) == {1, 2}


@pytest.mark.parametrize(("factor", "curve"), [(2.0, 1.0), (0.2, 1.0), (1.0, 2.5)])
def test_quadratic_smoothing_matches_the_formula(factor: float, curve: float) -> None:
    logits = [0.0, -0.5, -1.0, -1.5, -2.5, float("-inf"), -0.2, -3.0]
    expected = ref_smoothed(logits, factor, curve)
    got = quadratic_smoothing(
        torch.tensor([logits]), torch.tensor([[factor]]), torch.tensor([[curve]])
    )  # the stage itself: exact values
    finite = [i for i, x in enumerate(logits) if x != float("-inf")]
    assert got[0, 5] == float("-inf")
    assert torch.allclose(got[0, finite], torch.tensor([expected[i] for i in finite]), atol=1e-5)
    # Through sample(): the draw frequencies follow the smoothed distribution.
    counts = draw_counts(torch.tensor(logits), settings(smoothing_factor=factor, smoothing_curve=curve), DRAWS)
    probs = softmax([expected[i] if i in finite else float("-inf") for i in range(len(logits))])
    assert_frequencies(counts, {i: probs[i] for i in finite}, DRAWS)


def test_xtc_removes_all_top_choices_but_the_least_likely() -> None:
    # Above 0.09: 0.4, 0.25, 0.1 -> drop 0.4 and 0.25, keep 0.1 and everything below.
    keep = {0, 2, 4, 5, 6, 7}
    counts = draw_counts(logits_of(PROBS), settings(xtc_threshold=0.09, xtc_probability=1.0), DRAWS)
    assert set(counts) == keep
    assert_frequencies(counts, renormalised(PROBS, keep), DRAWS)


def test_xtc_does_nothing_with_a_single_token_above_the_threshold() -> None:
    counts = draw_counts(logits_of(PROBS), settings(xtc_threshold=0.3, xtc_probability=1.0), DRAWS)
    assert set(counts) == set(range(len(PROBS)))


def test_xtc_fires_with_its_probability_using_the_rows_generator() -> None:
    # Top two tokens only reachable when the coin says no; the coin comes from the row's generator.
    logits = logits_of(PROBS)
    s = settings(xtc_threshold=0.09, xtc_probability=0.3)
    generator = torch.Generator().manual_seed(11)
    rows = [row(s, generator=generator) for _ in range(DRAWS)]
    tokens = sample(logits.unsqueeze(0).expand(DRAWS, -1).contiguous(), rows).token_ids
    top_share = sum(t in (1, 3) for t in tokens) / DRAWS
    expected = 0.7 * (PROBS[1] + PROBS[3])  # coin "no" 70% of the time, then a plain draw
    assert abs(top_share - expected) < 5 * math.sqrt(expected * (1 - expected) / DRAWS)
    # Same generator state, same coins and draws.
    generator.manual_seed(11)
    again = sample(logits.unsqueeze(0).expand(DRAWS, -1).contiguous(), rows).token_ids
    assert again == tokens
