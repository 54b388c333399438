"""Bans: allowed_token_ids, suppressed ids, the empty-row fallback and the extra_masks hook."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from services.engine.sampler import SamplerRow, sample
from tests.engine.test_sampler_support import draw_counts, log_softmax, row, settings

LOGITS = [0.5, 2.0, 0.4, 1.0, 1.5, 0.3, 0.2, 0.9]
V = len(LOGITS)


def test_allowed_token_ids_restrict_greedy_and_random_rows() -> None:
    allowed = frozenset({0, 3, 6, 42})  # 42 is outside the vocabulary: ignored
    greedy = row(settings(temperature=0.0, allowed_token_ids=allowed), want_logprobs=True)
    out = sample(torch.tensor([LOGITS]), [greedy])
    assert out.token_ids == [3]
    assert out.logprobs is not None
    edited = [x if t in allowed else -math.inf for t, x in enumerate(LOGITS)]
    assert torch.allclose(out.logprobs[0], torch.tensor(log_softmax(edited), dtype=torch.float32))
    counts = draw_counts(torch.tensor(LOGITS), settings(allowed_token_ids=allowed), 2000)
    assert set(counts) == {0, 3, 6}


def test_suppressed_ids_are_banned_for_this_step_only_on_their_row() -> None:
    s = settings(temperature=0.0)
    out = sample(
        torch.tensor([LOGITS, LOGITS]), [row(s, suppressed_ids=[1, 4], want_logprobs=True), row(s, want_logprobs=True)]
    )
    assert out.token_ids == [3, 1]
    assert out.logprobs is not None
    assert out.logprobs[0, 1] == -math.inf and out.logprobs[0, 4] == -math.inf
    assert torch.isfinite(out.logprobs[1]).all()
    counts = draw_counts(torch.tensor(LOGITS), settings(), 2000, suppressed_ids=[1, 4])
    assert set(counts) == set(range(V)) - {1, 4}


def test_a_row_emptied_by_soft_bans_keeps_its_hard_ban() -> None:
    # Only EOS (7) is allowed but it is suppressed before min_new_tokens: the suppression yields.
    s = settings(temperature=0.0, allowed_token_ids=frozenset({7}), bad_words_ids=((7,),))
    out = sample(torch.tensor([LOGITS]), [row(s, suppressed_ids=[7], want_logprobs=True)])
    assert out.token_ids == [7]
    assert out.logprobs is not None
    assert out.logprobs[0, 7] == 0.0 and not out.logprobs.isnan().any()
    counts = draw_counts(torch.tensor(LOGITS), settings(allowed_token_ids=frozenset({7})), 200, suppressed_ids=[7])
    assert set(counts) == {7}


def test_a_row_with_every_token_banned_falls_back_to_no_ban() -> None:
    out = sample(torch.tensor([LOGITS]), [row(settings(), suppressed_ids=range(V), want_logprobs=True)])
    assert 0 <= out.token_ids[0] < V
    assert out.logprobs is not None and torch.isfinite(out.logprobs).all()


def test_fallback_is_per_row() -> None:
    s = settings(temperature=0.0)
    out = sample(torch.tensor([LOGITS, LOGITS]), [row(s, suppressed_ids=range(V)), row(s, suppressed_ids=[1])])
    assert out.token_ids == [1, 4]


class BanToken:
    """A stand-in for a grammar bitmask: bans one token on every row, recording what it saw."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.seen: torch.Tensor | None = None

    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplerRow]) -> None:
        self.seen = logits.clone()
        logits[:, self.token] = -math.inf


def test_extra_masks_run_after_the_bans_and_before_temperature() -> None:
    hook = BanToken(1)
    r = row(settings(temperature=0.5), suppressed_ids=[4], want_logprobs=True)
    out = sample(torch.tensor([LOGITS]), [r], extra_masks=[hook])
    assert hook.seen is not None
    assert hook.seen[0, 4] == -math.inf  # built-in bans already applied
    assert hook.seen[0, 0] == LOGITS[0]  # not yet divided by the temperature
    assert out.logprobs is not None
    expected = log_softmax([-math.inf if t in (1, 4) else x / 0.5 for t, x in enumerate(LOGITS)])
    assert torch.allclose(out.logprobs[0], torch.tensor(expected, dtype=torch.float32), atol=1e-5)
    assert out.token_ids[0] not in (1, 4)
