"""What the sampler takes and returns: one `SamplerRow` per logits row, one `SamplerOutput` per call.

`LogitsHook` is the extension point between the built-in masks and temperature where the
grammar bitmask (grammar/bitmask.py) and logits processors (processors/hook.py) plug in
(see `sampler.sample`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from services.engine.sampling_params import SamplingSettings


@dataclass(slots=True)  # one per sequence per step: see request.EngineOutput on why not frozen
class SamplerRow:
    """One sequence's view of a sampling step."""

    settings: SamplingSettings
    # Prompt + output so far; the prompt is token_ids[:num_prompt_tokens].
    token_ids: Sequence[int]
    num_prompt_tokens: int
    # CPU generator of a seeded request; None: torch's default RNG on the logits' device.
    generator: torch.Generator | None
    # Ids that must not be sampled this step (stop/EOS ids before min_new_tokens).
    suppressed_ids: Sequence[int]
    # The caller needs this row's log-probabilities.
    want_logprobs: bool

    @property
    def output_ids(self) -> Sequence[int]:
        return self.token_ids[self.num_prompt_tokens :]


@dataclass(frozen=True)
class SamplerOutput:
    # (N,) int64 on the logits' device: one sampled token id per row, not read back to the host
    # (the engine keeps a step's tokens on the device until it needs them; see step_sampler.py).
    tokens: torch.Tensor
    # (N, V) float32 log_softmax of the distribution sampled from: logits after bias, penalties,
    # masks and temperature (dynatemp included), before the truncation samplers. Greedy rows use
    # temperature 1. None when no row wants logprobs; rows that did not ask may hold anything.
    logprobs: torch.Tensor | None

    @functools.cached_property
    def token_ids(self) -> list[int]:
        """The tokens on the host (waits for the device on first use)."""
        return self.tokens.tolist()  # type: ignore[no-any-return]


class LogitsHook(Protocol):
    """Edits a step's processed logits (N, V) in place, after the built-in masks and before
    temperature: the place for a grammar bitmask or custom logits processors. A hook must leave
    every row at least one finite logit; the sampler's empty-row fallback runs before hooks."""

    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplerRow]) -> None: ...
