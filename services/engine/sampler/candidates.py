"""Each non-greedy row's still-possible tokens, in whichever layout is cheapest for the stages
that follow.

`values` (R, W) are logits (-inf for dropped tokens and padding) and `ids` (R, W) their token ids;
`ids` None means W is the whole vocabulary in id order. With `descending`, rows are sorted by
descending value with ties in id order, so a tie is always broken the same way whatever the
layout; otherwise columns are in id order when `ids` is None, and in no set order after
non-monotone reshaping (quadratic smoothing), after which nothing re-lays them out.

Every stage after temperature is elementwise given per-row statistics, so it gives the same
survivors in any layout; only the order in which a softmax adds up a row may differ, which moves
a probability by a few ulps.

Compaction keeps, for every row, all its live tokens in W = (most live tokens in any row) columns
instead of V: after top-k or a strong min-p the later stages and the draw then touch a few hundred
columns instead of the vocabulary. Finding W costs one device-to-host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG_INF = float("-inf")

# Compact when the widest row keeps at most 1 / COMPACT_FRACTION of the columns.
COMPACT_FRACTION = 8


def live_count(x: torch.Tensor) -> torch.Tensor:
    """(R, 1) float32: how many logits of each row of x (R, W) are not -inf."""
    return (x > NEG_INF).sum(dim=-1, keepdim=True, dtype=torch.float32)  # float sum: faster than bool


@dataclass(frozen=True)
class Candidates:
    values: torch.Tensor  # (R, W) float32 logits
    ids: torch.Tensor | None  # (R, W) long token ids; None: column j is token j
    descending: bool

    @staticmethod
    def of(logits: torch.Tensor) -> Candidates:
        return Candidates(logits, None, False)

    def live_width(self) -> int:
        """Most live (finite) tokens in any row; syncs with the device."""
        return int(live_count(self.values).max())

    def full_sort(self) -> Candidates:
        values, order = self.values.sort(dim=-1, descending=True, stable=True)  # (R, W), (R, W)
        return Candidates(values, order if self.ids is None else self.ids.gather(-1, order), True)

    def compacted(self) -> Candidates:
        """The same candidates in fewer columns when the rows keep few tokens; else self."""
        width = self.live_width()
        if width * COMPACT_FRACTION > self.values.shape[-1]:
            return self
        return self.compact(width)

    def compact(self, width: int) -> Candidates:
        """Each row's `width` most likely tokens, descending with ties by id; tokens left out are
        dropped, so callers pass at least the live width unless those tokens are meant to go."""
        _, picked = self.values.topk(max(width, 1), dim=-1)  # (R, w) columns of the top tokens
        picked, _ = picked.sort(dim=-1)  # (R, w) column order, hence id order among ties
        values = self.values.gather(-1, picked)  # (R, w)
        values, order = values.sort(dim=-1, descending=True, stable=True)  # (R, w)
        columns = picked.gather(-1, order)  # (R, w)
        ids = columns if self.ids is None else self.ids.gather(-1, columns)
        return Candidates(values, ids, True)

    def token_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """columns (R,) chosen per row -> (R,) token ids."""
        if self.ids is None:
            return columns
        return self.ids.gather(-1, columns.unsqueeze(-1)).squeeze(-1)
