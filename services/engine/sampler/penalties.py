"""Additive and multiplicative edits of the logits from a row's settings and token history.

- logit bias: `logit += bias[token]` for the listed ids.
- repetition penalty (vLLM/HF): over every distinct token of prompt + output, a positive logit
  is divided by the penalty and a negative one multiplied by it.
- frequency / presence (OpenAI, vLLM): over generated tokens only,
  `logit -= frequency * count + presence * (count > 0)`.

Applied in that order: bias first (so a biased token is then penalised like any other), then
repetition, then frequency/presence, as vLLM does. All three touch only the (row, token) pairs
they concern: the pairs are flattened to `row * V + token`, deduplicated with one `unique`, and
the logits edited through a flat view, so the cost follows the histories, not N * V.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from services.engine.sampler.batch import SamplerBatch


def apply_logit_bias(logits: torch.Tensor, batch: SamplerBatch) -> None:
    """logits (N, V) edited in place; ids outside the vocabulary are ignored."""
    rows: list[int] = []
    tokens: list[int] = []
    values: list[float] = []
    for i, s in enumerate(batch.settings):
        for token, bias in s.logit_bias:
            if 0 <= token < batch.vocab_size:
                rows.append(i)
                tokens.append(token)
                values.append(bias)
    if rows:
        index = (batch.index(rows), batch.index(tokens))
        logits.index_put_(index, torch.tensor(values, dtype=logits.dtype).to(logits.device), accumulate=True)


def apply_penalties(logits: torch.Tensor, batch: SamplerBatch) -> None:
    """Repetition, then frequency and presence penalties; logits (N, V) edited in place."""
    flat = logits.view(-1)  # (N * V,)
    vocab = batch.vocab_size
    if batch.uses_repetition_penalty:
        rows = [i for i, s in enumerate(batch.settings) if s.repetition_penalty != 1.0]
        cells, _ = distinct_cells(rows, [batch.rows[i].token_ids for i in rows], vocab, logits.device)  # (C,)
        penalty = batch.table.col("repetition_penalty").squeeze(-1)[cells // vocab]  # (C,)
        seen = flat[cells]  # (C,)
        flat[cells] = torch.where(seen > 0, seen / penalty, seen * penalty)
    if batch.uses_frequency_presence:
        rows = [i for i, s in enumerate(batch.settings) if s.frequency_penalty != 0.0 or s.presence_penalty != 0.0]
        cells, counts = distinct_cells(rows, [batch.rows[i].output_ids for i in rows], vocab, logits.device)
        row = cells // vocab  # (C,)
        frequency = batch.table.col("frequency_penalty").squeeze(-1)[row]  # (C,)
        presence = batch.table.col("presence_penalty").squeeze(-1)[row]  # (C,)
        flat.index_add_(0, cells, -(frequency * counts + presence))


def distinct_cells(
    rows: Sequence[int], histories: Sequence[Sequence[int]], vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(C,) long flat indices `row * vocab + token` of the distinct (row, token) pairs in the
    histories, and (C,) float32 how often each occurs; on `device`."""
    lengths = [len(h) for h in histories]
    row_index = torch.repeat_interleave(torch.tensor(rows, dtype=torch.long), torch.tensor(lengths))  # (T,)
    tokens = torch.tensor(list(itertools.chain.from_iterable(histories)), dtype=torch.long)  # (T,)
    cells, counts = torch.unique(row_index * vocab + tokens, sorted=False, return_counts=True)  # (C,), (C,)
    return cells.to(device), counts.to(device=device, dtype=torch.float32)
