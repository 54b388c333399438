"""Bans: logits set to -inf for tokens a row may not sample this step.

Two strengths:
- hard: `allowed_token_ids` (only those ids may be sampled);
- soft: the row's `suppressed_ids` (stop/EOS before min_new_tokens), bad words and
  no_repeat_ngram bans (see repetition_guards.py).

Empty-row fallback: if the bans leave a row no finite logit (say allowed_token_ids is {EOS} and
EOS is suppressed), that row drops its soft bans for this step and keeps the hard one; if the hard
ban alone empties it too (every allowed id already at -inf), the row is left unmasked. The choice
is made per row on the device, without a host sync, so a row never ends up all -inf (NaN
probabilities) because of a mask.

Soft bans are sparse: they are applied through the flat indices `row * V + token` of the banned
cells; only allowed_token_ids needs a dense (N, V) mask.
"""

from __future__ import annotations

import functools

import torch

from services.engine.sampler.batch import SamplerBatch
from services.engine.sampler.repetition_guards import history_bans

NEG_INF = float("-inf")


def uses_masks(batch: SamplerBatch) -> bool:
    return batch.uses_allowed or batch.uses_suppressed or batch.uses_bad_words or batch.uses_no_repeat_ngram


def apply_masks(logits: torch.Tensor, batch: SamplerBatch) -> None:
    """logits (N, V) edited in place."""
    live = logits > NEG_INF  # (N, V)
    allowed = _allowed_mask(logits, batch) if batch.uses_allowed else None  # (N, V) bool: may be sampled
    if allowed is not None:
        live &= allowed
    live_after_hard = live.sum(dim=-1, dtype=torch.float32)  # (N,)
    keep_hard = live_after_hard > 0  # (N,)

    cells = _soft_cells(batch)  # (C,) flat indices, distinct
    if cells is not None:
        cells = cells.to(logits.device)
        rows = cells // batch.vocab_size  # (C,)
        hit = live.view(-1)[cells].to(live_after_hard.dtype)  # (C,) 1 where a ban removes a live token
        removed = torch.zeros_like(live_after_hard).index_add_(0, rows, hit)  # (N,)
        keep_soft = (live_after_hard - removed > 0) & keep_hard  # (N,)
    if allowed is not None:
        logits.masked_fill_(~allowed & keep_hard.unsqueeze(-1), NEG_INF)
    if cells is not None:
        flat = logits.view(-1)  # (N * V,)
        flat[cells] = flat[cells].masked_fill(keep_soft[rows], NEG_INF)


def _allowed_mask(logits: torch.Tensor, batch: SamplerBatch) -> torch.Tensor:
    """(N, V) bool: True where the row may sample the token (all True for rows without a list)."""
    rows = [i for i, s in enumerate(batch.settings) if s.allowed_token_ids is not None]
    allowed = torch.ones(logits.shape, dtype=torch.bool, device=logits.device)  # (N, V)
    allowed[batch.index(rows)] = False
    ids = [_id_tensor(batch.settings[i].allowed_token_ids or frozenset(), batch.vocab_size) for i in rows]
    row_index = torch.repeat_interleave(torch.tensor(rows), torch.tensor([t.numel() for t in ids]))  # (T,)
    index = (row_index.to(logits.device), torch.cat(ids).to(logits.device))
    allowed.index_put_(index, torch.tensor(True, device=logits.device))
    return allowed


class _Same:
    """Cache key comparing by identity: a request's allowed_token_ids is the same frozenset object
    every step, and comparing two large equal sets element by element would cost what caching
    saves. The cache holds the object, so its id cannot be reused while cached."""

    __slots__ = ("ids",)

    def __init__(self, ids: frozenset[int]) -> None:
        self.ids = ids

    def __hash__(self) -> int:
        return id(self.ids)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.ids is self.ids


@functools.lru_cache(maxsize=256)
def _cached_ids(key: _Same, vocab_size: int) -> torch.Tensor:
    return torch.tensor(sorted(t for t in key.ids if 0 <= t < vocab_size), dtype=torch.long)


def _id_tensor(ids: frozenset[int], vocab_size: int) -> torch.Tensor:
    """(T,) long CPU tensor of the ids inside the vocabulary, cached per set object."""
    return _cached_ids(_Same(ids), vocab_size)


def _soft_cells(batch: SamplerBatch) -> torch.Tensor | None:
    """(C,) long CPU flat indices of the distinct soft-banned cells, or None."""
    banned: list[set[int]] = [set(row.suppressed_ids) for row in batch.rows]
    if batch.uses_bad_words or batch.uses_no_repeat_ngram:
        for i, tokens in history_bans(batch).items():
            banned[i] |= tokens
    vocab = batch.vocab_size
    cells = [i * vocab + t for i, tokens in enumerate(banned) for t in tokens if 0 <= t < vocab]
    return torch.tensor(cells, dtype=torch.long) if cells else None
