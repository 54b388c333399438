"""DRY, no_repeat_ngram and bad words: penalties and bans computed from the token history, checked
through the logprobs of sample() against per-row references and hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from services.engine.sampler import sample
from tests.engine.test_sampler_support import log_softmax, row, settings

V = 10
LOGITS = [0.5, 0.1, 0.4, 1.0, 1.2, 0.3, 0.2, 0.9, 1.1, 0.0]


def ref_dry(tokens: list[int], mult: float, base: float, allowed: int, breakers: set[int]) -> dict[int, float]:
    if len(tokens) < 2 or tokens[-1] in breakers:
        return {}
    n = len(tokens)
    ends = [i for i in range(n - 1) if tokens[i] == tokens[-1]][-8:]
    best: dict[int, int] = {}
    for i in ends:
        length = 0
        while length < min(12, i + 1) and tokens[i - length] == tokens[n - 1 - length]:
            if tokens[i - length] in breakers:
                break
            length += 1
        follower = tokens[i + 1]
        if follower not in breakers and length >= allowed:
            best[follower] = max(best.get(follower, 0), length)
    return {t: mult * base ** (length - allowed) for t, length in best.items()}


def ref_ngram_bans(tokens: list[int], n: int) -> set[int]:
    if len(tokens) < n:
        return set()
    prefix = tuple(tokens[len(tokens) - n + 1 :])
    return {tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tuple(tokens[i : i + n - 1]) == prefix}


def processed(tokens: list[int], num_prompt: int | None = None, **fields: object) -> torch.Tensor:
    r = row(settings(temperature=0.0, **fields), tokens, num_prompt_tokens=num_prompt, want_logprobs=True)
    out = sample(torch.tensor([LOGITS]), [r])
    assert out.logprobs is not None
    return out.logprobs[0]


def test_dry_hand_computed_penalty() -> None:
    # The context ends with 1 2 3, seen before followed by 4: a repeat of L = 3 >= 2, so token 4
    # loses 0.8 * 1.75 ** (3 - 2) = 1.4.
    got = processed([1, 2, 3, 4, 1, 2, 3], dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2)
    edited = list(LOGITS)
    edited[4] -= 1.4
    assert torch.allclose(got, torch.tensor(log_softmax(edited), dtype=torch.float32), atol=1e-5)


@pytest.mark.parametrize(
    ("tokens", "allowed", "breakers"),
    [
        ([1, 2, 3, 4, 1, 2, 3], 2, set()),
        ([1, 2, 3, 4, 1, 2, 3], 2, {1}),  # the match stops before a breaker: L = 2
        ([1, 2, 3, 4, 1, 2, 3], 4, set()),  # L = 3 is within the allowed length: free
        ([5, 6, 7, 5, 6, 8, 2, 5, 6], 2, set()),  # two followers, 7 and 8
        ([5, 6, 7, 5, 6, 8, 2, 5, 6], 1, {8}),  # a breaker is never penalised
        ([9, 3, 3, 3, 3, 3], 2, set()),  # overlapping repeats of one token
        ([1, 2, 3, 4, 1, 2, 1], 2, {1}),  # the last token is a breaker: nothing
        ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8], 2, set()),  # L cap 12
    ],
)
def test_dry_matches_the_reference(tokens: list[int], allowed: int, breakers: set[int]) -> None:
    got = processed(
        tokens,
        dry_multiplier=0.5,
        dry_base=1.5,
        dry_allowed_length=allowed,
        dry_sequence_breaker_ids=frozenset(breakers),
    )
    penalties = ref_dry(tokens, 0.5, 1.5, allowed, breakers)
    edited = [x - penalties.get(t, 0.0) for t, x in enumerate(LOGITS)]
    assert torch.allclose(got, torch.tensor(log_softmax(edited), dtype=torch.float32), atol=1e-5)


def test_dry_penalises_enough_to_change_the_greedy_choice() -> None:
    history = [3, 7, 4, 2, 3, 7]  # "3 7" was followed by 4
    r = row(settings(temperature=0.0, dry_multiplier=1.0), history)
    assert sample(torch.tensor([LOGITS]), [r]).token_ids == [8]
    assert sample(torch.tensor([LOGITS]), [row(settings(temperature=0.0), history)]).token_ids == [4]


@pytest.mark.parametrize(
    ("tokens", "size"),
    [([5, 6, 7, 1, 5, 6], 3), ([5, 6, 7, 1, 6], 2), ([5, 6, 7, 5, 6, 2, 5, 6], 3), ([4, 8, 3], 1), ([4, 8], 3)],
)
def test_no_repeat_ngram_bans_tokens_completing_a_seen_ngram(tokens: list[int], size: int) -> None:
    got = processed(tokens, no_repeat_ngram_size=size)
    banned = ref_ngram_bans(tokens, size)
    assert {t for t in range(V) if got[t] == -math.inf} == banned
    edited = [-math.inf if t in banned else x for t, x in enumerate(LOGITS)]
    assert torch.allclose(got, torch.tensor(log_softmax(edited), dtype=torch.float32), atol=1e-5)


def test_no_repeat_ngram_changes_the_greedy_choice() -> None:
    r = row(settings(temperature=0.0, no_repeat_ngram_size=2), [9, 4, 9])  # 9 was followed by 4
    assert sample(torch.tensor([LOGITS]), [r]).token_ids == [8]


@pytest.mark.parametrize(
    ("tokens", "num_prompt", "banned"),
    [
        ([9, 3], 1, {4, 7}),  # output ends with 3: (3, 4) bans 4; (7,) is always banned
        ([9, 2], 1, {7}),
        ([1, 2], 0, {7, 8}),  # (1, 2, 8) matches the whole output
        ([1, 3], 2, {7}),  # the prompt ends with 3, but only generated tokens are matched (vLLM)
    ],
)
def test_bad_words_ban_the_last_token_of_a_started_word(tokens: list[int], num_prompt: int, banned: set[int]) -> None:
    words = ((3, 4), (7,), (1, 2, 8))
    got = processed(tokens, num_prompt, bad_words_ids=words)
    assert {t for t in range(V) if got[t] == -math.inf} == banned
