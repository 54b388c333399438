"""Thinking budget and custom logit processor fields -> `SamplingParams`.

The budget has many spellings: Turnout's `thinking_budget`, `max_thinking_tokens`,
vLLM's `thinking_token_budget`, SGLang's `custom_params.thinking_budget` and,
last, OpenAI's `reasoning_effort` levels. Two spellings that disagree are a 400;
the engine checks the value and whether the model has thinking tokens at all.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import invalid_request
from gateway.protocol import SamplingFields
from turnout.v1 import common_pb2

# reasoning_effort -> thinking budget in tokens; "high" leaves thinking unbounded.
EFFORT_BUDGETS: dict[str, int | None] = {"none": 0, "minimal": 256, "low": 1024, "medium": 4096, "high": None}

_ALIASES = ("thinking_budget", "max_thinking_tokens", "thinking_token_budget")


def thinking_budget(
    body: SamplingFields, custom_params: dict[str, Any] | None, reasoning_effort: str | None = None, prefix: str = ""
) -> int | None:
    given = {f"{prefix}{name}": getattr(body, name) for name in _ALIASES if getattr(body, name) is not None}
    if custom_params and custom_params.get("thinking_budget") is not None:
        value = custom_params["thinking_budget"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise invalid_request(
                f"'{prefix}custom_params.thinking_budget' must be a non-negative integer, got {value!r}",
                f"{prefix}custom_params",
            )
        given[f"{prefix}custom_params.thinking_budget"] = value
    if len(set(given.values())) > 1:
        spelled = ", ".join(f"'{name}'={value}" for name, value in given.items())
        raise invalid_request(
            f"the thinking budget is given more than once and disagrees: {spelled}", next(iter(given))
        )
    if given:
        return next(iter(given.values()))
    if reasoning_effort is None:
        return None
    if reasoning_effort not in EFFORT_BUDGETS:
        levels = ", ".join(f"'{level}'" for level in EFFORT_BUDGETS)
        raise invalid_request(
            f"'reasoning_effort' must be one of {levels}, got {reasoning_effort!r}", "reasoning_effort"
        )
    return EFFORT_BUDGETS[reasoning_effort]


def apply_thinking(
    sp: common_pb2.SamplingParams,
    budget: int | None,
    custom_logit_processor: str | None,
    custom_params: dict[str, Any] | None,
) -> None:
    if budget is not None:
        sp.thinking_budget = budget
    params = dict(custom_params or {})
    if custom_logit_processor is None:
        # SGLang's custom_params.thinking_budget without a processor: the budget field carries it.
        params.pop("thinking_budget", None)
    else:
        sp.custom_logit_processor = custom_logit_processor
    if params:
        sp.custom_params.update(params)
