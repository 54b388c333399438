"""Guards against repeating the token history; each reads one row's history in Python (the only
per-row loops of the sampler besides seeded noise) and returns (row, token) edits.

- DRY ("don't repeat yourself", Aphrodite / text-generation-webui): if the context ends with a
  sequence of length L that also occurred earlier, followed there by token t, then t would extend
  the repeat; it is penalised additively by `multiplier * base ** (L - allowed_length)` when
  `L >= allowed_length` (the longest such L per t counts). Matching runs over prompt + output,
  never across a sequence-breaker token; nothing is penalised when the last token is a breaker,
  and breakers themselves are never penalised. Choices where Aphrodite's code is loose: like its
  defaults we examine the 8 most recent earlier occurrences of the last token
  (`dry_max_occurrences`) and cap L at 12 (`dry_max_ngram`), over the whole context
  (`dry_range` 0); unlike its current loop (which penalises every L >= 2, with a negative
  exponent below allowed_length) we follow its documentation and text-generation-webui: repeats
  shorter than allowed_length are free.
- no_repeat_ngram_size n (Aphrodite, as HF's NoRepeatNGram): ban every token that would complete
  an n-gram already present in prompt + output (n = 1: every token seen so far).
- bad words (vLLM): a listed sequence's last token is banned when the generated tokens end with
  the rest of the sequence (a one-token bad word is always banned). Like vLLM, only generated
  tokens are matched, never the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.engine.sampler.batch import SamplerBatch

DRY_MAX_OCCURRENCES = 8
DRY_MAX_MATCH = 12


def dry_penalties(
    tokens: Sequence[int], multiplier: float, base: float, allowed_length: int, breakers: frozenset[int]
) -> dict[int, float]:
    """{token: penalty to subtract} for one history."""
    n = len(tokens)
    if n < 2 or tokens[-1] in breakers:
        return {}
    last = tokens[-1]
    occurrences = [i for i in range(n - 1) if tokens[i] == last][-DRY_MAX_OCCURRENCES:]
    longest: dict[int, int] = {}
    for i in occurrences:
        follower = tokens[i + 1]
        if follower in breakers:
            continue
        # Grow the match backwards: tokens[i-m+1 .. i] == tokens[n-m .. n-1].
        m = 1
        while m < DRY_MAX_MATCH and i - m >= 0 and tokens[i - m] == tokens[n - 1 - m] and tokens[i - m] not in breakers:
            m += 1
        if m >= allowed_length and m > longest.get(follower, 0):
            longest[follower] = m
    return {t: multiplier * base ** (m - allowed_length) for t, m in longest.items()}


def repeated_ngram_bans(tokens: Sequence[int], size: int) -> set[int]:
    """Tokens that would complete an n-gram (n = size) already present in `tokens`."""
    n = len(tokens)
    if size <= 0 or n < size:
        return set()
    if size == 1:
        return set(tokens)
    prefix = list(tokens[n - size + 1 :])
    head = prefix[0]
    starts = [i for i in range(n - size + 1) if tokens[i] == head and list(tokens[i : i + size - 1]) == prefix]
    return {tokens[i + size - 1] for i in starts}


def bad_word_bans(output: Sequence[int], bad_words: Sequence[Sequence[int]]) -> set[int]:
    """Last tokens of the bad words whose other tokens end the generated output."""
    banned: set[int] = set()
    for word in bad_words:
        k = len(word) - 1
        if k < 0 or k > len(output):
            continue
        if k == 0 or list(output[len(output) - k :]) == list(word[:k]):
            banned.add(word[-1])
    return banned


def apply_dry(logits: torch.Tensor, batch: SamplerBatch) -> None:
    """Subtract each DRY row's penalties; logits (N, V) edited in place."""
    rows: list[int] = []
    tokens: list[int] = []
    values: list[float] = []
    for i, row in enumerate(batch.rows):
        s = row.settings
        if s.dry_multiplier <= 0.0:
            continue
        history = list(row.token_ids)
        penalties = dry_penalties(
            history, s.dry_multiplier, s.dry_base, s.dry_allowed_length, s.dry_sequence_breaker_ids
        )
        for token, penalty in penalties.items():
            if 0 <= token < batch.vocab_size:
                rows.append(i)
                tokens.append(token)
                values.append(-penalty)
    if rows:
        device = logits.device
        index = (torch.tensor(rows).to(device), torch.tensor(tokens).to(device))
        logits.index_put_(index, torch.tensor(values, dtype=logits.dtype).to(device), accumulate=True)


def history_bans(batch: SamplerBatch) -> dict[int, set[int]]:
    """{row: tokens} banned by no_repeat_ngram_size and bad words (ids not yet range-checked)."""
    bans: dict[int, set[int]] = {}
    for i, row in enumerate(batch.rows):
        s = row.settings
        banned: set[int] = set()
        if s.no_repeat_ngram_size > 0:
            banned |= repeated_ngram_bans(list(row.token_ids), s.no_repeat_ngram_size)
        if s.bad_words_ids:
            banned |= bad_word_bans(list(row.output_ids), s.bad_words_ids)
        if banned:
            bans[i] = banned
    return bans
