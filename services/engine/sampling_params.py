"""One request's sampling settings, resolved and validated (see sampling_validation.py).

Every field holds its effective value: "off" is spelled as the value that
changes nothing (top_p 1.0, top_k 0, penalties 0 / 1.0, ...), so the sampler
never needs to know whether the client set a field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from services.engine.grammar.constraint import Constraint
from services.engine.processors.catalog import ProcessorCall


@dataclass(frozen=True)
class LogprobSettings:
    """Which log-probabilities to return (all off by default)."""

    # Log-probability of each sampled token.
    sampled: bool = False
    # Alternatives per generated position.
    top_n: int = 0
    # Token ids whose log-probabilities are returned at every generated position.
    token_ids: tuple[int, ...] = ()
    # First prompt position with a log-probability; None: no prompt logprobs.
    prompt_start: int | None = None
    # Alternatives per prompt position.
    prompt_top_n: int = 0

    @property
    def any_output(self) -> bool:
        return self.sampled or self.top_n > 0 or bool(self.token_ids)


@dataclass(frozen=True)
class BeamSettings:
    """Beam search (beam_search.py): `width` live beams, finished ones scored
    cumulative_logprob / generated_length ** length_penalty."""

    width: int
    length_penalty: float = 1.0
    # True: stop once `width` beams finished; False: once no live beam can beat the worst finished one
    # at its current length; "never": at any length it may still reach (Hugging Face's three modes).
    early_stopping: bool | Literal["never"] = False


@dataclass(frozen=True)
class SamplingSettings:
    max_new_tokens: int
    min_new_tokens: int = 0
    # 0 means greedy: argmax of the processed logits (penalties, bias and masks still apply).
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0

    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # (token id, bias) pairs, added to the logits.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # None: every token may be sampled.
    allowed_token_ids: frozenset[int] | None = None
    # Token sequences that must not be generated.
    bad_words_ids: tuple[tuple[int, ...], ...] = ()

    # Aphrodite's samplers, each off at its default.
    typical_p: float = 1.0
    tfs: float = 1.0
    top_a: float = 0.0
    eta_cutoff: float = 0.0  # units of 1e-4
    epsilon_cutoff: float = 0.0  # units of 1e-4
    smoothing_factor: float = 0.0
    smoothing_curve: float = 1.0
    dynatemp_min: float = 0.0
    dynatemp_max: float = 0.0
    dynatemp_exponent: float = 1.0
    xtc_threshold: float = 0.1
    xtc_probability: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_sequence_breaker_ids: frozenset[int] = frozenset()
    no_repeat_ngram_size: int = 0
    nsigma: float = 0.0

    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    seed: int | None = None
    # Samples returned; best_of >= n are generated (the n with the highest cumulative logprob are kept).
    n: int = 1
    best_of: int = 1
    # Beam search instead of sampling (width = best_of); None: sampling.
    beam: BeamSettings | None = None
    logprobs: LogprobSettings = field(default_factory=LogprobSettings)
    # Structured output: the grammar the output must match (compiled by grammar/compiler.py).
    constraint: Constraint | None = None
    # Logits processors run each step after the grammar mask, in order: a custom one (built-in
    # name or serialized), then the thinking budget's.
    logit_processors: tuple[ProcessorCall, ...] = ()
    thinking_budget: int | None = None

    @property
    def greedy(self) -> bool:
        # As in Aphrodite, temperature 0 selects greedy sampling; dynatemp is then ignored.
        return self.temperature == 0.0

    @property
    def dynatemp_enabled(self) -> bool:
        return self.dynatemp_max > 0.0 or self.dynatemp_min > 0.0
