"""Tail truncation: stages that drop the least likely tokens of each row (logit -> -inf).

In this order, each seeing the renormalised survivors of the previous. It is Aphrodite's
default order except that min-p moves ahead of top-a, keeping our architecture's core top-k,
top-p, min-p together (Aphrodite: nsigma, top-k/top-p, top-a, min-p, tfs, eta, epsilon):
- top-n-sigma: drop logits below `max - nsigma * std`, std over the row's live logits
  (Bessel-corrected). Aphrodite runs it first, right after temperature, because its threshold
  is a statistic of the whole distribution that earlier cuts would distort; we do the same.
- top-k: drop logits below the k-th highest (ties with the k-th kept, as in vLLM); 0 = off.
- top-p: keep the smallest head whose mass reaches top_p (a token is dropped when the mass
  ranked strictly above it, ties ranked by id, is already >= top_p).
- min-p: drop p < min_p * p_max.
- top-a: drop p < top_a * p_max ** 2.
- tail-free (tfs): sort descending, take |second difference| of the probabilities, normalise it
  to sum 1 and accumulate; token j >= 1 is dropped once the accumulated curvature up to j-1
  exceeds tfs. The row is read as followed by zero-probability tokens, so the drop to zero after
  its last live token counts as curvature. With two or more dead tokens in the row this is
  Aphrodite's computation exactly; Aphrodite also always drops the vocabulary's least likely
  token, which is then already dead (we do not, so a row without dead tokens may keep it).
- eta: drop p < min(eta, sqrt(eta) * exp(-H)), eta = eta_cutoff * 1e-4, H the entropy in nats.
- epsilon: drop p < epsilon_cutoff * 1e-4.

Every stage keeps the most likely token, and rows with the stage off are untouched bit for bit.
top-k finds the k-th value with `topk`, no sort; top-p and tfs need the descending order, which
one sort (or a compaction, see candidates.py, or a head of the likeliest tokens, see _sorted)
provides for all the stages after them.
"""

from __future__ import annotations

import torch

from services.engine.sampler.batch import ParamTable, TruncationPlan
from services.engine.sampler.candidates import COMPACT_FRACTION, NEG_INF, Candidates, live_count


def truncate_tail(c: Candidates, params: ParamTable, plan: TruncationPlan) -> Candidates:
    """Drop tokens in place in c.values (R, W); may return a re-laid-out copy."""
    if plan.nsigma:
        _drop(c.values, top_nsigma_drop(c.values, params.col("nsigma")))
    if plan.top_k:
        _drop(c.values, top_k_drop(c.values, params.col("top_k"), plan.top_k))
    top_p_done = False
    if plan.needs_sorted:
        c, top_p_done = _sorted(c, params, plan)
    x = c.values  # (R, W)
    if plan.top_p and not top_p_done:
        _drop(x, top_p_drop_sorted(x, params.col("top_p")))
    if plan.min_p:
        probs = x.softmax(dim=-1)  # (R, W)
        _drop(x, probs < params.col("min_p") * probs.amax(dim=-1, keepdim=True))
    if plan.top_a:
        probs = x.softmax(dim=-1)
        top = probs.amax(dim=-1, keepdim=True)  # (R, 1)
        _drop(x, probs < torch.minimum(params.col("top_a") * top * top, top))
    if plan.tfs:
        _drop(x, tail_free_drop_sorted(x, params.col("tfs")))
    if plan.eta:
        _drop(x, eta_drop(x, params.col("eta_cutoff")))
    if plan.epsilon:
        probs = x.softmax(dim=-1)
        _drop(x, probs < torch.minimum(params.col("epsilon_cutoff"), probs.amax(dim=-1, keepdim=True)))
    return c


def _sorted(c: Candidates, params: ParamTable, plan: TruncationPlan) -> tuple[Candidates, bool]:
    """Descending candidates for top-p / tfs, and whether top-p has been applied on the way.

    A narrow row (after top-k, say) is compacted. For wide rows needing only top-p (no tfs): the
    live tokens with p <= (1 - top_p) / live hold at most 1 - top_p together, so top-p drops every
    one of them; the tokens above that floor form a head which, when at most a quarter of the
    row, is sorted instead of the whole row and gets top-p with the whole row's normaliser.
    Otherwise the rows are fully sorted.
    """
    if c.descending:
        return c, False
    columns = c.values.shape[-1]
    width = c.live_width()
    if width * COMPACT_FRACTION <= columns:
        return c.compact(width), False
    if plan.top_p and not plan.tfs:
        top_p = params.col("top_p")  # (R, 1)
        log_norm = c.values.logsumexp(dim=-1, keepdim=True)  # (R, 1) of the whole row
        floor = torch.log1p(-top_p.clamp_max(1.0)) - live_count(c.values).log()  # (R, 1); -inf when off
        width = int(((c.values - log_norm) > floor).sum(dim=-1, dtype=torch.float32).max())
        if width * 4 <= columns:
            head = c.compact(width)  # (R, width): every token above its row's floor
            _drop(head.values, top_p_drop_sorted(head.values, top_p, log_norm))
            return head, True
    return c.full_sort(), False


def _drop(x: torch.Tensor, drop: torch.Tensor) -> None:
    x.masked_fill_(drop, NEG_INF)


def top_nsigma_drop(x: torch.Tensor, nsigma: torch.Tensor) -> torch.Tensor:
    """(R, W) bool; nsigma (R, 1), 0 = off."""
    count = live_count(x)  # (R, 1)
    top = x.amax(dim=-1, keepdim=True)  # (R, 1)
    shifted = torch.where(x > NEG_INF, x - top, 0.0)  # (R, W); dead tokens add nothing below
    total = shifted.sum(dim=-1, keepdim=True)  # (R, 1)
    squares = (shifted * shifted).sum(dim=-1, keepdim=True)  # (R, 1)
    variance = (squares - total * total / count.clamp_min(1.0)) / (count - 1.0).clamp_min(1.0)  # (R, 1)
    threshold = top - nsigma * variance.clamp_min(0.0).sqrt()  # (R, 1)
    return (x < threshold) & (nsigma > 0.0)


def top_k_drop(x: torch.Tensor, top_k: torch.Tensor, largest_k: int) -> torch.Tensor:
    """(R, W) bool; top_k (R, 1), 0 = off; largest_k: the largest top_k of any row."""
    head = x.topk(min(largest_k, x.shape[-1]), dim=-1).values  # (R, largest_k), descending
    k = top_k.long().clamp(1, head.shape[-1])  # (R, 1)
    kth = head.gather(-1, k - 1)  # (R, 1)
    return (x < kth) & (top_k > 0.0)


def top_p_drop_sorted(x: torch.Tensor, top_p: torch.Tensor, log_norm: torch.Tensor | None = None) -> torch.Tensor:
    """(R, W) bool; x sorted descending, top_p (R, 1), 1.0 = off; log_norm (R, 1): the row's
    log-normaliser when x holds only part of it (else softmax over x)."""
    probs = x.softmax(dim=-1) if log_norm is None else (x - log_norm).exp()  # (R, W)
    mass_above = probs.cumsum(dim=-1) - probs  # (R, W)
    limit = torch.where(top_p < 1.0, top_p, torch.full_like(top_p, float("inf")))  # (R, 1)
    drop = mass_above >= limit
    drop[:, 0] = False
    return drop


def tail_free_drop_sorted(x: torch.Tensor, tfs: torch.Tensor) -> torch.Tensor:
    """(R, W) bool; x sorted descending, tfs (R, 1), 1.0 = off."""
    probs = torch.nn.functional.pad(x.softmax(dim=-1), (0, 2))  # (R, W + 2), two dead tokens after
    curvature = (probs[:, :-2] - 2.0 * probs[:, 1:-1] + probs[:, 2:]).abs()  # (R, W)
    cdf = (curvature / curvature.sum(dim=-1, keepdim=True)).cumsum(dim=-1)  # (R, W)
    drop = torch.zeros_like(x, dtype=torch.bool)  # (R, W)
    drop[:, 1:] = cdf[:, :-1] > tfs
    return drop & (tfs < 1.0)


def eta_drop(x: torch.Tensor, eta: torch.Tensor) -> torch.Tensor:
    """(R, W) bool; eta (R, 1) already in probability units, 0 = off."""
    logp = x.log_softmax(dim=-1)  # (R, W)
    probs = logp.exp()
    entropy = -(probs * logp).nansum(dim=-1, keepdim=True)  # (R, 1)
    threshold = torch.minimum(eta, eta.sqrt() * torch.exp(-entropy))  # (R, 1)
    return probs < torch.minimum(threshold, probs.amax(dim=-1, keepdim=True))
