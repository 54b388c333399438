"""Stages after the tail truncation that do not just cut the tail (Aphrodite's order):

- typical (locally typical sampling): rank tokens by |surprisal - entropy| = |-log p - H|, most
  typical first, and keep them while the accumulated probability stays below typical_p; the most
  typical token is always kept. This is Aphrodite's rule: the token whose mass reaches typical_p
  is dropped (Hugging Face's warper keeps it).
- quadratic smoothing (kalomaze; smoothing_factor f, smoothing_curve c): with d = logit - max,
  `logit' = max - k * d**2 + s * d**3`, k = f * (3 - c) / 2, s = f * (c - 1) / 2. c = 1 is the
  plain quadratic. A small f flattens the distribution, a large one sharpens it; f = 0 is off
  (not the limit f -> 0, which would flatten everything).
- XTC (exclude top choices): with probability xtc_probability per row and step, if two or more
  tokens have p >= xtc_threshold, drop all of them except the least likely one. The coin is
  drawn from the row's own generator when it has one (see draw.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.engine.sampler.batch import ParamTable, TruncationPlan
from services.engine.sampler.candidates import NEG_INF, Candidates
from services.engine.sampler.draw import row_uniforms


def shape(
    c: Candidates,
    params: ParamTable,
    plan: TruncationPlan,
    generators: Sequence[torch.Generator | None],
    xtc_rows: Sequence[int],
) -> Candidates:
    """Edit c.values (R, W); generators: one per row; xtc_rows: rows with xtc_probability > 0,
    the only ones that flip the XTC coin. Every stage is elementwise given per-row statistics,
    so it works in any layout of the candidates."""
    logits = c.values
    if plan.typical:
        logits.masked_fill_(typical_drop(logits, params.col("typical_p")), NEG_INF)
    if plan.smoothing:
        logits = quadratic_smoothing(logits, params.col("smoothing_factor"), params.col("smoothing_curve"))
    if plan.xtc:
        coins = row_uniforms(len(generators), xtc_rows, generators, logits.device)  # (R,)
        applies = coins.unsqueeze(-1) < params.col("xtc_probability")  # (R, 1)
        logits.masked_fill_(xtc_drop(logits, params.col("xtc_threshold")) & applies, NEG_INF)
    # Smoothing with smoothing_curve > 3 is not monotone, so the rows may no longer be sorted.
    return Candidates(logits, c.ids, c.descending and not plan.smoothing)


def typical_drop(x: torch.Tensor, typical_p: torch.Tensor) -> torch.Tensor:
    """(R, W) bool; typical_p (R, 1), 1.0 = off."""
    logp = x.log_softmax(dim=-1)  # (R, W)
    probs = logp.exp()
    entropy = -(probs * logp).nansum(dim=-1, keepdim=True)  # (R, 1)
    deviation = (-logp - entropy).abs()  # (R, W); +inf for dropped tokens
    order = deviation.argsort(dim=-1, stable=True)  # (R, W), most typical first
    mass = probs.gather(-1, order).cumsum(dim=-1)  # (R, W)
    limit = torch.where(typical_p < 1.0, typical_p, torch.full_like(typical_p, float("inf")))  # (R, 1)
    drop_sorted = mass >= limit
    drop_sorted[:, 0] = False
    return torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)


def quadratic_smoothing(x: torch.Tensor, factor: torch.Tensor, curve: torch.Tensor) -> torch.Tensor:
    """(R, W) -> (R, W); factor, curve (R, 1); rows with factor 0 and -inf logits unchanged."""
    k = factor * (3.0 - curve) / 2.0  # (R, 1)
    s = factor * (curve - 1.0) / 2.0  # (R, 1)
    top = x.amax(dim=-1, keepdim=True)  # (R, 1)
    d = x - top  # (R, W), <= 0
    smoothed = top - k * d * d + s * d * d * d  # (R, W)
    keep = (factor == 0.0) | (x == NEG_INF)  # (R, W)
    return torch.where(keep, x, smoothed)


def xtc_drop(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """(R, W) bool, before the coin: every token at or above threshold but the least likely of
    them, where at least two are; threshold (R, 1)."""
    probs = x.softmax(dim=-1)  # (R, W)
    above = (probs >= threshold) & (probs > 0.0)  # (R, W)
    several = above.sum(dim=-1, keepdim=True) >= 2  # (R, 1)
    lowest = torch.where(above, probs, torch.full_like(probs, float("inf"))).argmin(dim=-1, keepdim=True)  # (R, 1)
    drop = above & several
    return drop.scatter_(-1, lowest, False)
