"""Turns a step's logits into next tokens, one row per sequence.

Greedy rows (temperature 0, nothing banned) are one batched argmax; other rows
go through the per-request sampler with their own generator, so a seeded
request draws the same tokens whatever else is in the batch.
"""

from __future__ import annotations

import torch

from services.engine.sampling import sample_token
from services.engine.sequence import Sequence


def banned_tokens(seq: Sequence, eos_token_ids: frozenset[int]) -> list[int]:
    """Stop ids are masked until min_new_tokens are generated."""
    settings = seq.request.sampling
    if seq.num_output_tokens >= settings.min_new_tokens:
        return []
    stops = settings.stop_token_ids | (frozenset() if settings.ignore_eos else eos_token_ids)
    return sorted(stops)


def sample(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: frozenset[int]) -> list[int]:
    """logits (N, V) float32 -> one token id per sequence."""
    if not seqs:
        return []
    tokens = torch.argmax(logits, dim=-1).tolist()  # (N,), right for every greedy row
    host_logits: torch.Tensor | None = None
    for row, seq in enumerate(seqs):
        banned = banned_tokens(seq, eos_token_ids)
        if seq.request.sampling.greedy and not banned:
            continue
        if host_logits is None:
            host_logits = logits.float().cpu()
        tokens[row] = sample_token(host_logits[row], seq.request.sampling, seq.generator, banned)
    return [int(t) for t in tokens]
