"""SGLang's `return_hidden_states` shapes, from the rows the engine sends: the final hidden state
(after the last norm, before the LM head) of every position a request computed, in order: the
prompt's positions, then the input of each decode step (the last generated token is never fed
back, so it has none)."""

from __future__ import annotations

from typing import Any


def sglang_hidden_states(rows: list[list[float]], prompt_tokens: int) -> list[Any]:
    """SGLang's `meta_info.hidden_states`: the prompt's rows as one (prompt_tokens, hidden) list, then
    one row per decode step (the input of the step): max(1, completion tokens) entries."""
    return [rows[:prompt_tokens], *rows[prompt_tokens:]] if rows else []


def last_hidden_state(rows: list[list[float]], prompt_tokens: int) -> list[Any]:
    """What SGLang's OpenAI routes put on a choice: the last decode step's row ([] when none)."""
    states = sglang_hidden_states(rows, prompt_tokens)
    return states[-1] if len(states) > 1 else []
