"""Which logits processors a request may use, and the one place a processor spec is turned into
an instance (called from sampling_validation).

- A built-in's name (`thinking_budget`, `deterministic_token`, `disallowed_tokens`): always
  allowed; its parameters are checked up front.
- Anything else is a processor serialized with `CustomLogitProcessor.to_str()`: client code,
  refused unless the engine runs with `--enable-custom-logit-processor`.

The thinking budget needs the model's think tags (`--think-start-token` / `--think-end-token`,
looked up in the served model's vocabulary); a model without them refuses it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.engine.processors.builtins import BuiltinProcessor, DeterministicToken, DisallowedTokens
from services.engine.processors.thinking_budget import ThinkingBudget, ThinkTokens
from services.engine.vocab import ModelVocab
from turnout.custom_logit_processor import CustomLogitProcessor
from turnout.errors import InvalidArgument

DISABLED_MESSAGE = (
    "The server is not configured to enable custom logit processor. "
    "Please set `--enable-custom-logit-processor` to enable this feature."
)


@dataclass(frozen=True)
class ProcessorCall:
    """One processor a request runs each step, with its parameters (`custom_params`)."""

    processor: CustomLogitProcessor = field(compare=False)
    params: Mapping[str, Any] = field(default_factory=dict, compare=False)


class ProcessorCatalog:
    def __init__(
        self,
        vocab: ModelVocab | None,
        *,
        allow_serialized: bool = False,
        think_start_token: str = "<think>",
        think_end_token: str = "</think>",
    ) -> None:
        self.vocab = vocab
        self.allow_serialized = allow_serialized
        self.think_start_token = think_start_token
        self.think_end_token = think_end_token
        self._builtins: dict[str, BuiltinProcessor] = {p.name: p for p in (DeterministicToken(), DisallowedTokens())}
        self._thinking: ThinkingBudget | None = None
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self.vocab.vocab_size if self.vocab is not None else 0

    def thinking_budget(self, budget: int) -> ProcessorCall:
        if budget < 0:
            raise InvalidArgument(f"thinking_budget must be >= 0, got {budget}")
        return ProcessorCall(self._thinking_processor(), {"thinking_budget": budget})

    def custom(self, spec: str, params: Mapping[str, Any]) -> ProcessorCall:
        """A named built-in or a serialized processor, with its parameters checked where we can."""
        if not spec:
            raise InvalidArgument("custom_logit_processor must not be empty")
        if spec == ThinkingBudget.name:
            processor: CustomLogitProcessor = self._thinking_processor()
        else:
            processor = self._builtins.get(spec) or self._deserialize(spec)
        if isinstance(processor, BuiltinProcessor):
            processor.check(params, self.vocab_size)
        return ProcessorCall(processor, dict(params))

    def _deserialize(self, spec: str) -> CustomLogitProcessor:
        if not self.allow_serialized:
            raise InvalidArgument(DISABLED_MESSAGE)
        try:
            return CustomLogitProcessor.from_str(spec)
        except Exception as exc:  # a malformed string can fail in json, hex, dill or the constructor
            known = ", ".join(sorted([*self._builtins, ThinkingBudget.name]))
            raise InvalidArgument(
                f"custom_logit_processor is neither a built-in ({known}) nor a processor serialized with "
                f"CustomLogitProcessor.to_str(): {type(exc).__name__}: {exc}"
            ) from None

    def _thinking_processor(self) -> ThinkingBudget:
        with self._lock:
            if self._thinking is None:
                self._thinking = ThinkingBudget(self._think_tokens())
            return self._thinking

    def _think_tokens(self) -> ThinkTokens:
        if self.vocab is None:
            raise InvalidArgument("thinking_budget is not available: the engine has no tokenizer for this model")
        start = self.vocab.token_id(self.think_start_token)
        end = self.vocab.token_id(self.think_end_token)
        if start is None or end is None:
            raise InvalidArgument(
                f"thinking_budget is not supported by this model: its vocabulary has no "
                f"{self.think_start_token!r} / {self.think_end_token!r} tokens (engine flags --think-start-token / "
                "--think-end-token)"
            )
        return ThinkTokens(start, end, self.vocab.newline_id, self.vocab.newline_ending_ids)
