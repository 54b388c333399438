"""Custom logits processors, SGLang-compatible: subclass, serialize with `to_str()`, send it.

    from turnout.custom_logit_processor import CustomLogitProcessor

    class OnlyToken(CustomLogitProcessor):
        def __call__(self, logits, custom_param_list):
            for row, params in enumerate(custom_param_list):
                token = int(params["token_id"])
                logits[row, :] = float("-inf")
                logits[row, token] = 0.0
            return logits

    sampling_params = {"custom_logit_processor": OnlyToken.to_str(), "custom_params": {"token_id": 5}}

The engine calls a processor once per step with the logits rows of the requests using it
(after the grammar mask, before temperature) and one parameter dict per row: the request's
`custom_params` plus `"__req__"`, whose `origin_input_ids` and `output_ids` are the prompt
and the tokens generated so far. Edit the rows in place and return them.

A serialized processor is client code that the engine runs: engines refuse it unless started
with `--enable-custom-logit-processor`, which is for trusted clients only. Built-in processors
(`thinking_budget`, `deterministic_token`, `disallowed_tokens`) are chosen by name instead and
need no flag.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RequestView:
    """What a processor may read about its request (the `__req__` of each parameter dict)."""

    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)


class CustomLogitProcessor:
    def __call__(self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]]) -> torch.Tensor:
        """logits (R, V): one row per request using this processor this step; edit in place and return."""
        raise NotImplementedError

    @classmethod
    def to_str(cls) -> str:
        """JSON text holding the dill-serialized class (a class from the client's `__main__` travels by value).
        A classmethod, as SGLang's: `OnlyToken.to_str()` and `OnlyToken().to_str()` give the same text."""
        import dill

        return json.dumps({"callable": dill.dumps(cls, recurse=True).hex()})

    @classmethod
    def from_str(cls, text: str) -> CustomLogitProcessor:
        """The processor `to_str()` produced (one instance per distinct text)."""
        return _load(text)


@lru_cache(maxsize=64)
def _load(text: str) -> CustomLogitProcessor:
    import dill

    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("callable"), str):
        raise ValueError('expected a JSON object with a "callable" field (CustomLogitProcessor.to_str())')
    loaded = dill.loads(bytes.fromhex(data["callable"]))
    instance = loaded() if isinstance(loaded, type) else loaded
    if not callable(instance):
        raise ValueError(f"the serialized object ({type(instance).__name__}) is not callable")
    return instance  # type: ignore[no-any-return]
