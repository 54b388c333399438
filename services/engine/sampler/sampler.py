"""The step's sampler: logits (N, V) and one `SamplerRow` per row -> one token per row.

Stages, in order (docs/architecture.md), each skipped when no row in the batch uses it:

 1. logit bias, repetition / frequency / presence penalties          penalties.py
 2. DRY penalty                                                      repetition_guards.py
 3. bans: suppressed ids, bad words, no_repeat_ngram (soft) and
    allowed_token_ids (hard), with the empty-row fallback            masks.py
 4. extra_masks hooks: grammar bitmask, then logits processors     grammar/, processors/
 5. temperature or dynamic temperature                               temperature.py
    -> logprobs are taken here; greedy rows take their argmax here
 6. tail truncation: top-n-sigma, top-k, top-p, min-p, top-a, tfs,
    eta, epsilon; then the survivors are compacted when few          truncation.py, candidates.py
 7. typical, quadratic smoothing, XTC                                shaping.py
 8. draw: exponential race, seeded rows with their own generator     draw.py

no_repeat_ngram bans are -inf edits, so they join the soft bans of step 3 (and its fallback)
rather than the additive penalties; where they run among the penalties changes nothing else.
Steps 6-8 run only on the non-greedy rows. All stages work on the whole batch at once on the
logits' device; the only per-row Python loops walk a row's token history (DRY, n-grams, bad
words) or draw a seeded row's noise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.engine.sampler.batch import SamplerBatch
from services.engine.sampler.candidates import Candidates
from services.engine.sampler.draw import exponential_race
from services.engine.sampler.masks import apply_masks, uses_masks
from services.engine.sampler.penalties import apply_logit_bias, apply_penalties
from services.engine.sampler.repetition_guards import apply_dry
from services.engine.sampler.row_argmax import row_argmax
from services.engine.sampler.shaping import shape
from services.engine.sampler.temperature import apply_temperature
from services.engine.sampler.truncation import truncate_tail
from services.engine.sampler.types import LogitsHook, SamplerOutput, SamplerRow


def sample(
    logits: torch.Tensor,
    rows: Sequence[SamplerRow],
    extra_masks: Sequence[LogitsHook] = (),
    fused_draw: bool | None = None,
) -> SamplerOutput:
    """logits (N, V) float32 on any device (not modified) -> one token id per row, left on the device
    (`SamplerOutput.tokens`; `.token_ids` reads them back).

    extra_masks: hooks run after the built-in bans and before temperature, in order (the place
    for a grammar bitmask and custom logits processors); each edits the (N, V) logits in place.
    fused_draw: whether a draw without seeded rows runs in the fused kernel (None: on CUDA).
    """
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(f"logits {tuple(logits.shape)} must be (N, V) with one row per SamplerRow ({len(rows)})")
    if not rows:
        return SamplerOutput(tokens=torch.empty(0, dtype=torch.long, device=logits.device), logprobs=None)
    batch = SamplerBatch(rows, logits.shape[-1], logits.device)
    if batch.plain_greedy and not extra_masks:
        return SamplerOutput(tokens=row_argmax(logits), logprobs=None)

    x = logits.to(dtype=torch.float32, memory_format=torch.contiguous_format, copy=True)  # (N, V), ours to edit
    if batch.uses_bias:
        apply_logit_bias(x, batch)
    if batch.uses_repetition_penalty or batch.uses_frequency_presence:
        apply_penalties(x, batch)
    if batch.uses_dry:
        apply_dry(x, batch)
    if uses_masks(batch):
        apply_masks(x, batch)
    for hook in extra_masks:
        hook(x, rows)
    if batch.uses_temperature:
        apply_temperature(x, batch)
    logprobs = torch.log_softmax(x, dim=-1) if batch.wants_logprobs else None  # (N, V)

    tokens = torch.empty(len(rows), dtype=torch.long, device=x.device)  # (N,)
    if batch.greedy_rows:
        greedy = batch.index(batch.greedy_rows)
        tokens.index_copy_(0, greedy, row_argmax(x.index_select(0, greedy)))
    if batch.random_rows:
        tokens.index_copy_(0, batch.index(batch.random_rows), _draw(x, batch, fused_draw))
    return SamplerOutput(tokens=tokens, logprobs=logprobs)


def _draw(x: torch.Tensor, batch: SamplerBatch, fused: bool | None) -> torch.Tensor:
    """Truncate, shape and draw the non-greedy rows of x (N, V) -> (R,) token ids."""
    picked = batch.random_rows
    if len(picked) == len(batch.rows):
        work, params = x, batch.table  # x is no longer needed: work on it in place
    else:
        index = batch.index(picked)
        work, params = x.index_select(0, index), batch.table.select(index)  # (R, V), (R, F)
    plan = batch.truncation
    candidates = Candidates.of(work)
    if plan.any_tail:
        candidates = truncate_tail(candidates, params, plan).compacted()
    generators = [batch.rows[i].generator for i in picked]
    xtc_rows = [j for j, i in enumerate(picked) if batch.settings[i].xtc_probability > 0.0]
    candidates = shape(candidates, params, plan, generators, xtc_rows)
    return exponential_race(candidates, generators, batch.vocab_size, fused)
