"""Small built-in processors, chosen by name (`custom_logit_processor="deterministic_token"`).

Each also checks its `custom_params` up front (`check`), so a bad parameter is refused with
INVALID_ARGUMENT instead of failing the request at its first step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from turnout.custom_logit_processor import CustomLogitProcessor
from turnout.errors import InvalidArgument

NEG_INF = float("-inf")


def token_param(params: Mapping[str, Any], key: str, vocab_size: int, processor: str) -> int:
    """A token id parameter (Struct numbers arrive as floats)."""
    value = params.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise InvalidArgument(f"custom_params.{key} must be a token id (an integer) for {processor}, got {value!r}")
    if not 0 <= value < vocab_size:
        raise InvalidArgument(
            f"custom_params.{key}: token id {int(value)} is out of range for a vocabulary of {vocab_size}"
        )
    return int(value)


class BuiltinProcessor(CustomLogitProcessor):
    name = ""

    def check(self, params: Mapping[str, Any], vocab_size: int) -> None:
        """Raise InvalidArgument when `params` cannot work with this processor."""


class DeterministicToken(BuiltinProcessor):
    """Always samples `custom_params["token_id"]`."""

    name = "deterministic_token"

    def check(self, params: Mapping[str, Any], vocab_size: int) -> None:
        token_param(params, "token_id", vocab_size, self.name)

    def __call__(self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]]) -> torch.Tensor:
        tokens = torch.tensor([int(p["token_id"]) for p in custom_param_list], device=logits.device)  # (R,)
        rows = torch.arange(logits.shape[0], device=logits.device)
        logits.fill_(NEG_INF)
        logits[rows, tokens] = 0.0
        return logits


class DisallowedTokens(BuiltinProcessor):
    """Never samples any of `custom_params["token_ids"]`."""

    name = "disallowed_tokens"

    def check(self, params: Mapping[str, Any], vocab_size: int) -> None:
        ids = params.get("token_ids")
        if not isinstance(ids, list):
            raise InvalidArgument(f"custom_params.token_ids must be a list of token ids for {self.name}")
        for i in range(len(ids)):
            token_param({"token_id": ids[i]}, "token_id", vocab_size, self.name)

    def __call__(self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]]) -> torch.Tensor:
        for row, params in enumerate(custom_param_list):
            ids = [int(t) for t in params["token_ids"]]
            if ids:
                logits[row, torch.tensor(ids, device=logits.device)] = NEG_INF
        return logits
