"""Temperature: every non-greedy row's logits are divided by its temperature.

Dynamic temperature (Aphrodite's dynatemp; active when dynatemp_min or dynatemp_max is non-zero)
replaces the row's `temperature` with one chosen from the entropy of the distribution it is about
to scale (after bias, penalties and masks):

    T = dynatemp_min + (dynatemp_max - dynatemp_min) * (H / ln(n)) ** dynatemp_exponent

where H is the entropy in nats and n the number of tokens with a finite logit, so H / ln(n) is in
[0, 1] (a row with one live token counts as 0). A confident distribution gets a temperature near
dynatemp_min, a flat one near dynatemp_max. Greedy rows (temperature 0) keep temperature 1 and
ignore dynatemp, as in Aphrodite where temperature 0 selects greedy sampling. Every temperature is
floored at MIN_TEMPERATURE (Aphrodite's floor) so a zero dynamic temperature cannot divide by 0.
"""

from __future__ import annotations

import math

import torch

from services.engine.sampler.batch import SamplerBatch
from services.engine.sampler.candidates import live_count

MIN_TEMPERATURE = 1e-5


def apply_temperature(logits: torch.Tensor, batch: SamplerBatch) -> None:
    """logits (N, V) divided in place, row by row."""
    table = batch.table
    temperature = table.col("temperature")  # (N, 1)
    if batch.uses_dynatemp:
        dynamic = dynamic_temperature(
            logits, table.col("dynatemp_min"), table.col("dynatemp_max"), table.col("dynatemp_exponent")
        )
        temperature = torch.where(table.col("dynatemp_on") > 0.5, dynamic, temperature)  # (N, 1)
    logits.div_(temperature.clamp_min(MIN_TEMPERATURE))


def dynamic_temperature(
    logits: torch.Tensor,  # (N, V)
    low: torch.Tensor,  # (N, 1)
    high: torch.Tensor,  # (N, 1)
    exponent: torch.Tensor,  # (N, 1)
) -> torch.Tensor:
    """(N, 1) entropy-scaled temperature of each row."""
    normalized = normalized_entropy(logits)  # (N, 1)
    return low + (high - low) * normalized.pow(exponent)


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """(N, 1): entropy of softmax(logits) over ln(live tokens), 0 for rows with one live token."""
    logp = torch.log_softmax(logits, dim=-1)  # (N, V)
    entropy = -(logp.exp() * logp).nansum(dim=-1, keepdim=True)  # (N, 1); 0 * -inf terms dropped
    live = live_count(logits)  # (N, 1)
    max_entropy = torch.log(live.clamp_min(1.0))  # (N, 1)
    ratio = entropy / max_entropy.clamp_min(math.log(2.0))  # (N, 1)
    return torch.where(live > 1, ratio.clamp(0.0, 1.0), torch.zeros_like(ratio))
