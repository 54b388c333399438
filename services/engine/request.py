"""What the engine's core takes and gives back: plain dataclasses, no protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from services.engine.logprobs import PositionLogprobs
from services.engine.pooling import PoolingSettings
from services.engine.sampling_params import SamplingSettings


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    input_ids: tuple[int, ...]
    sampling: SamplingSettings
    # The compiled grammar (xgrammar.CompiledGrammar) of a request with a constraint, once compiled
    # off the step loop; LLMEngine.add_request compiles it itself when missing.
    grammar: Any = field(default=None, compare=False, repr=False)
    # The LoRA adapter to run it with: a loaded adapter's name or the path it was loaded from
    # (None: the base model).
    lora_name: str | None = None
    # Set: pool the prompt's hidden states and generate nothing (sampling.max_new_tokens is 0; pooling.py).
    pooling: PoolingSettings | None = None
    # Hand out the final hidden state of every computed position with the outputs (SGLang).
    return_hidden_states: bool = False


@dataclass(frozen=True)
class Finish:
    kind: Literal["stop", "length", "abort"]
    # For "stop": the stop token id that matched, and whether it is one of the model's EOS ids.
    matched_token_id: int | None = None
    eos: bool = False
    # For "abort": why.
    message: str = ""


# Not frozen: one is built per sample per step, and a frozen dataclass's __init__ (object.__setattr__
# per field) took 1.8 µs against 0.6 here. Treat it as immutable all the same: once handed to the
# event loop, the step thread never touches it again.
@dataclass(slots=True)
class EngineOutput:
    """New tokens of one sample of a request; `finish` is set on the sample's last output."""

    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    finish: Finish | None = field(default=None)
    # Which sample (0 .. best_of-1).
    index: int = 0
    # One per token id, when output logprobs were asked for.
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    # On sample 0's first output, when prompt logprobs were asked for.
    input_logprobs: list[PositionLogprobs] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    # The request's last output: every sample has finished.
    request_finished: bool = False
    # The pooled prompt, on the only output of a pooling request that completed.
    embedding: list[float] | None = None
    # With return_hidden_states: the hidden states of the positions computed since the last output.
    hidden_states: list[list[float]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish is not None


@dataclass(frozen=True)
class LoadReport:
    running: int
    waiting: int
    kv_tokens_used: int
    kv_tokens_capacity: int
