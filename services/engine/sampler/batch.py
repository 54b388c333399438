"""One sampling call's batch: which rows are greedy, which stages any row needs, and every
per-row number the stages read, moved to the logits' device in one (N, F) table.

Stage flags are decided on the Python settings, never on tensors, so a stage no row uses costs
nothing. Greedy rows (temperature 0) get temperature 1 and are left out of the truncation and
drawing stages; they still see bias, penalties and masks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.engine.sampler.types import SamplerRow
from services.engine.sampling_params import SamplingSettings

# eta_cutoff and epsilon_cutoff are given in units of 1e-4 (Aphrodite's convention).
CUTOFF_UNIT = 1e-4

# Columns of the per-row table, in order. Each holds the setting's effective value; "off" is the
# neutral value, and each stage either treats it as an exact no-op or masks off-rows itself.
_COLUMNS = (
    "temperature",  # 1.0 for greedy rows, so dividing leaves them untouched
    "dynatemp_min",
    "dynatemp_max",
    "dynatemp_exponent",
    "top_k",  # 0: off (also when k >= the vocabulary size)
    "top_p",
    "min_p",
    "top_a",
    "tfs",
    "eta_cutoff",  # already multiplied by CUTOFF_UNIT
    "epsilon_cutoff",  # already multiplied by CUTOFF_UNIT
    "typical_p",
    "smoothing_factor",
    "smoothing_curve",
    "xtc_threshold",
    "xtc_probability",
    "nsigma",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "dynatemp_on",  # 1.0 where a non-greedy row uses dynamic temperature
)
_INDEX = {name: i for i, name in enumerate(_COLUMNS)}


def _row_values(s: SamplingSettings, vocab_size: int) -> list[float]:
    return [
        1.0 if s.greedy else s.temperature,
        s.dynatemp_min,
        s.dynatemp_max,
        s.dynatemp_exponent,
        float(s.top_k if s.top_k < vocab_size else 0),
        s.top_p,
        s.min_p,
        s.top_a,
        s.tfs,
        s.eta_cutoff * CUTOFF_UNIT,
        s.epsilon_cutoff * CUTOFF_UNIT,
        s.typical_p,
        s.smoothing_factor,
        s.smoothing_curve,
        s.xtc_threshold,
        s.xtc_probability,
        s.nsigma,
        s.repetition_penalty,
        s.frequency_penalty,
        s.presence_penalty,
        1.0 if s.dynatemp_enabled and not s.greedy else 0.0,
    ]


@dataclass(frozen=True)
class ParamTable:
    """Per-row numbers, (rows, F) float32 on the logits' device; `col` gives one as (rows, 1)."""

    values: torch.Tensor  # (rows, F)

    def col(self, name: str) -> torch.Tensor:
        i = _INDEX[name]
        return self.values[:, i : i + 1]  # (rows, 1)

    def select(self, rows: torch.Tensor) -> ParamTable:
        return ParamTable(self.values.index_select(0, rows))


@dataclass(frozen=True)
class TruncationPlan:
    """Which truncation/shaping stages any random (non-greedy) row uses."""

    nsigma: bool
    top_k: int  # the largest top_k in use; 0: no row uses top-k
    top_p: bool
    min_p: bool
    top_a: bool
    tfs: bool
    eta: bool
    epsilon: bool
    typical: bool
    smoothing: bool
    xtc: bool

    @property
    def needs_sorted(self) -> bool:
        """top-p and tfs read the distribution in descending order."""
        return self.top_p or self.tfs

    @property
    def any_tail(self) -> bool:
        """Some tail-truncation stage (truncation.py) runs."""
        return any((self.nsigma, self.top_k > 0, self.top_p, self.min_p, self.top_a, self.tfs, self.eta, self.epsilon))

    @staticmethod
    def of(settings: Sequence[SamplingSettings], vocab_size: int) -> TruncationPlan:
        return TruncationPlan(
            nsigma=any(s.nsigma > 0.0 for s in settings),
            top_k=max((s.top_k for s in settings if s.top_k < vocab_size), default=0),
            top_p=any(s.top_p < 1.0 for s in settings),
            min_p=any(s.min_p > 0.0 for s in settings),
            top_a=any(s.top_a > 0.0 for s in settings),
            tfs=any(s.tfs < 1.0 for s in settings),
            eta=any(s.eta_cutoff > 0.0 for s in settings),
            epsilon=any(s.epsilon_cutoff > 0.0 for s in settings),
            typical=any(s.typical_p < 1.0 for s in settings),
            smoothing=any(s.smoothing_factor != 0.0 for s in settings),
            xtc=any(s.xtc_probability > 0.0 for s in settings),
        )


class SamplerBatch:
    """Everything `sample()` decides once per call from the rows' settings."""

    def __init__(self, rows: Sequence[SamplerRow], vocab_size: int, device: torch.device) -> None:
        self.rows = rows
        self.vocab_size = vocab_size
        self.device = device
        self.settings = [r.settings for r in rows]
        self.greedy_rows = [i for i, s in enumerate(self.settings) if s.greedy]
        self.random_rows = [i for i, s in enumerate(self.settings) if not s.greedy]

        s = self.settings
        self.uses_bias = any(x.logit_bias for x in s)
        self.uses_repetition_penalty = any(x.repetition_penalty != 1.0 for x in s)
        self.uses_frequency_presence = any(x.frequency_penalty != 0.0 or x.presence_penalty != 0.0 for x in s)
        self.uses_dry = any(x.dry_multiplier > 0.0 for x in s)
        self.uses_no_repeat_ngram = any(x.no_repeat_ngram_size > 0 for x in s)
        self.uses_bad_words = any(x.bad_words_ids for x in s)
        self.uses_allowed = any(x.allowed_token_ids is not None for x in s)
        self.uses_suppressed = any(len(r.suppressed_ids) > 0 for r in rows)
        self.wants_logprobs = any(r.want_logprobs for r in rows)
        self.uses_temperature = any(not x.greedy and (x.temperature != 1.0 or x.dynatemp_enabled) for x in s)
        self.uses_dynatemp = any(not x.greedy and x.dynatemp_enabled for x in s)
        self.truncation = TruncationPlan.of([s[i] for i in self.random_rows], vocab_size)
        self._table: ParamTable | None = None

    @property
    def plain_greedy(self) -> bool:
        """Every row is greedy and nothing edits the logits: one argmax does it."""
        return not self.random_rows and not (
            self.uses_bias
            or self.uses_repetition_penalty
            or self.uses_frequency_presence
            or self.uses_dry
            or self.uses_no_repeat_ngram
            or self.uses_bad_words
            or self.uses_allowed
            or self.uses_suppressed
            or self.wants_logprobs
        )

    @property
    def table(self) -> ParamTable:
        """All rows' numbers, built and moved to the device once per call (on first use)."""
        if self._table is None:
            host = torch.tensor([_row_values(s, self.vocab_size) for s in self.settings], dtype=torch.float32)
            self._table = ParamTable(host.to(self.device))  # (N, F)
        return self._table

    def index(self, rows: Sequence[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.long, device=self.device)  # (len(rows),)
