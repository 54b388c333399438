"""The grammar as a sampler hook: fill the constrained rows' token bitmasks, apply them.

Runs at stage 4 (after the built-in bans, before the logits processors and temperature), so
log-probabilities are those of the masked distribution. Only constrained rows are filled
(xgrammar's BatchGrammarMatcher, in parallel) and masked (`indices`); the other rows are not
touched. The bitmask is (N, ceil(V / 32)) int32 over the model's vocab_size, which can exceed
the tokenizer's: ids past the tokenizer are never allowed.

A row left with no allowed token (say allowed_token_ids and the grammar share no token) is
reported in `failed`, and its logits are reset so the sampler stays well-defined; the engine
finishes that sequence with an Abort naming the problem.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from services.engine.grammar.state import GrammarState
from services.engine.sampler.types import SamplerRow

NEG_INF = float("-inf")


@functools.cache
def _batch_matcher() -> Any:
    import xgrammar as xgr

    return xgr.BatchGrammarMatcher(max_threads="auto")


class GrammarMask:
    def __init__(self, states: Sequence[GrammarState | None]) -> None:
        self.rows = [i for i, s in enumerate(states) if s is not None]
        self.matchers = [s.matcher for s in states if s is not None]
        # Row -> why it cannot continue.
        self.failed: dict[int, str] = {}

    def fill(self, num_rows: int, vocab_size: int) -> torch.Tensor:
        """(N, ceil(V / 32)) int32 CPU bitmask; unconstrained rows allow everything."""
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(num_rows, vocab_size)  # all bits set
        _batch_matcher().batch_fill_next_token_bitmask(self.matchers, bitmask, indices=self.rows)
        return bitmask

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        import xgrammar as xgr

        xgr.apply_token_bitmask_inplace(
            logits, bitmask.to(logits.device, non_blocking=True), indices=self.rows, vocab_size=logits.shape[-1]
        )

    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplerRow]) -> None:
        self.apply(logits, self.fill(logits.shape[0], logits.shape[-1]))
        index = torch.tensor(self.rows, device=logits.device)  # (C,)
        alive = (logits.index_select(0, index) > NEG_INF).any(dim=-1).tolist()  # (C,)
        for row, ok in zip(self.rows, alive, strict=True):
            if not ok:
                self.failed[row] = (
                    "the grammar allows no token here that the request's other settings (allowed_token_ids, "
                    "logit_bias, min_tokens, bad words) permit"
                )
                logits[row] = 0.0
