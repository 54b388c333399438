"""The thinking budget: at most N tokens inside the thinking block, then a forced clean close.

A request's thinking block is open
- from output token 0 when the prompt leaves one open (the chat template pre-filled the start
  tag: the prompt's last start tag comes after its last end tag), or
- from the token after the first start tag the model generates itself.
Once `budget` tokens were generated inside the open block, the next step forces a newline and
the one after it the end tag; when the last token already ends in a newline only the end tag
is forced. After the end tag (forced or the model's own) nothing is forced again, so the model
answers freely. Budget 0 closes the block at once.

The decision reads only the request's token ids, so it needs no state: preemption, n > 1 and
streaming need nothing special, and the forced tokens are ordinary output tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from services.engine.processors.builtins import BuiltinProcessor
from turnout.errors import InvalidArgument

NEG_INF = float("-inf")


@dataclass(frozen=True)
class ThinkTokens:
    start: int
    end: int
    newline: int
    # Tokens whose text ends in a newline (after one of them only the end tag is forced).
    newline_ending: frozenset[int]


def _open_in_prompt(prompt: Sequence[int], tokens: ThinkTokens) -> bool:
    for token in reversed(prompt):
        if token == tokens.end:
            return False
        if token == tokens.start:
            return True
    return False


def forced_token(prompt: Sequence[int], output: Sequence[int], budget: int, tokens: ThinkTokens) -> int | None:
    """The token the budget forces next, or None when the model is free."""
    if _open_in_prompt(prompt, tokens):
        first = 0
    else:
        try:
            first = list(output).index(tokens.start) + 1
        except ValueError:
            return None  # no thinking block (yet)
    thinking = output[first:]
    if tokens.end in thinking or len(thinking) < budget:
        return None
    last = output[-1] if output else prompt[-1]
    return tokens.end if last in tokens.newline_ending else tokens.newline


class ThinkingBudget(BuiltinProcessor):
    name = "thinking_budget"

    def __init__(self, tokens: ThinkTokens) -> None:
        self.tokens = tokens

    def check(self, params: Mapping[str, Any], vocab_size: int) -> None:
        budget = params.get("thinking_budget")
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not float(budget).is_integer():
            raise InvalidArgument(f"custom_params.thinking_budget must be an integer, got {budget!r}")
        if budget < 0:
            raise InvalidArgument(f"thinking_budget must be >= 0, got {int(budget)}")

    def __call__(self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]]) -> torch.Tensor:
        rows, forced = [], []
        for row, params in enumerate(custom_param_list):
            req = params["__req__"]
            token = forced_token(req.origin_input_ids, req.output_ids, int(params["thinking_budget"]), self.tokens)
            if token is not None:
                rows.append(row)
                forced.append(token)
        if rows:
            index = torch.tensor(rows, device=logits.device)  # (F,)
            logits[index] = NEG_INF
            logits[index, torch.tensor(forced, device=logits.device)] = 0.0
        return logits
