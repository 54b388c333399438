"""One request's state inside the engine.

The whole scheduler follows from one rule: a sequence has `num_tokens` tokens
(prompt + generated) and `num_computed_tokens` of them have K/V in the cache.
Prefill, chunked prefill, prefix-cache hits, decode and recompute after
preemption are all "compute the next tokens until the two counts meet":

    token_ids:  [ prompt ............................ | output ....... ]
                [ cached (hit) | computed ... | to compute ]
                0              ^num_cached    ^num_computed_tokens  ^num_tokens

After a step that brings num_computed_tokens up to num_tokens the model has
produced logits for the last token, and the sampled token is appended (so in
decode, num_computed_tokens trails num_tokens by exactly one).

A sampled token may still be on the device (see step_sampler.PendingSample):
until its step is collected, its place holds placeholder(row), a negative id
naming its row in that step's token tensor. The counts are already right, so
the scheduler can schedule the next decode at once, and ModelRunner.build_batch
swaps placeholders for the tokens on the device. Only the newest token can be
one, and only one step's at a time: the engine collects a step before it
commits the next, and committing is when full blocks are hashed into the
prefix cache, so a placeholder is never hashed.
"""

from __future__ import annotations

import enum
import functools
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from services.engine.logprobs import PositionLogprobs
from services.engine.pooling import HiddenStateLog, PoolingState
from services.engine.request import EngineRequest, Finish

if TYPE_CHECKING:
    from services.engine.grammar.state import GrammarState
    from services.engine.lora.adapter import LoraAdapter

_arrival = itertools.count()


def placeholder(row: int) -> int:
    """The stand-in id of the token at `row` of a launched step's token tensor (real ids are >= 0)."""
    return -(row + 1)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One sample of a request. Sample 0 computes the prompt; the others are forked from it (see fork())."""

    request: EngineRequest
    priority: int = 0
    index: int = 0
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Prompt tokens found in the prefix cache when first admitted (reported as cached_tokens).
    num_cached_tokens: int = 0
    status: Status = Status.WAITING
    finish: Finish | None = None
    # Set when this sample must stop (its stop string matched, or its whole request was aborted);
    # finished at the next step.
    abort_message: str | None = None
    # Output tokens not yet handed to the caller.
    num_emitted: int = 0
    num_preemptions: int = 0
    arrival: int = field(default_factory=lambda: next(_arrival))
    generator: torch.Generator | None = None
    # Log-probabilities of output tokens not yet handed to the caller (when asked for).
    pending_logprobs: list[PositionLogprobs] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    # Prompt log-probabilities gathered so far (sample 0 only), for positions prompt_start.. in order.
    prompt_logprobs: list[PositionLogprobs] = field(default_factory=list)
    # The grammar matcher of a constrained request (one per sample); None: unconstrained.
    grammar: GrammarState | None = None
    # The LoRA adapter the request resolved when it was added (None: the base model); kept for the
    # request's whole life, even if the adapter is unloaded meanwhile (lora/manager.py).
    lora: LoraAdapter | None = None
    # The pooling in progress of a pooling request (pooling.py); None: it generates.
    pooling: PoolingState | None = None
    # The hidden states of a request with return_hidden_states (pooling.py); None: not asked for.
    hidden_log: HiddenStateLog | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.request.input_ids)
        if self.request.pooling is not None and self.pooling is None:
            self.pooling = PoolingState(self.request.pooling)
        if self.request.return_hidden_states and self.hidden_log is None:
            self.hidden_log = HiddenStateLog()
        seed = self.request.sampling.seed
        if seed is not None:
            # Sample i of a seeded request draws from seed + i (as vLLM), so samples differ yet repeat.
            self.generator = torch.Generator(device="cpu").manual_seed((seed + self.index) % 2**64)

    @functools.cached_property
    def seq_id(self) -> str:
        """Unique across requests: the request id cannot contain the part after the last '#'. Read for
        every running sequence at every step (block tables), so built once: request and index never change."""
        return f"{self.request.request_id}#{self.index}"

    def fork(self, index: int) -> Sequence:
        """A new sample of the same request after this one's prefill: the prompt only, nothing computed."""
        return Sequence(
            self.request,
            priority=self.priority,
            index=index,
            num_cached_tokens=self.num_cached_tokens,
            grammar=self.grammar.fresh() if self.grammar is not None else None,
            lora=self.lora,
        )

    @property
    def cache_salt(self) -> int | None:
        """What besides its tokens its K/V depend on, for the prefix cache: its adapter (BlockKey.salt)."""
        return self.lora.uid if self.lora is not None else None

    @property
    def prompt_logprob_start(self) -> int | None:
        """First prompt position whose log-probability this sequence must still produce; None when done."""
        start = self.request.sampling.logprobs.prompt_start
        if start is None or self.index != 0:
            return None
        # Position 0 has no log-probability: nothing comes before it.
        first = max(start, 1)
        produced = first + len(self.prompt_logprobs)
        return produced if produced < self.num_prompt_tokens else None

    @property
    def needs_every_prompt_position(self) -> bool:
        """Whether it needs the hidden state of prompt positions a prefix-cache hit would skip (prompt
        log-probabilities, mean or first pooling, hidden states): then it computes the whole prompt."""
        pooling = self.pooling is not None and self.pooling.settings.needs_every_position
        return pooling or self.hidden_log is not None or self.prompt_logprob_start is not None

    # These two are read for every running sequence several times a step, so each is computed once
    # (cached_property: later reads are an attribute's): `request` and its input ids never change.
    @functools.cached_property
    def prefill_only(self) -> bool:
        """Generates nothing (max_new_tokens 0: pooling, or SGLang's prompt scoring): it ends the step its
        prompt is fully computed, and samples no token."""
        return self.request.sampling.max_new_tokens == 0

    @functools.cached_property
    def num_prompt_tokens(self) -> int:
        return len(self.request.input_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_tokens_to_compute(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def max_total_tokens(self) -> int:
        """Tokens the sequence may hold at most: prompt + max_new_tokens."""
        return self.num_prompt_tokens + self.request.sampling.max_new_tokens

    @property
    def is_ending(self) -> bool:
        """Ends at the engine's next postprocess whatever it computes: it was aborted, or its newest token
        (maybe a placeholder) is the last max_new_tokens allows. It computes nothing more (scheduler.py).
        A prefill-only sequence holds no output token: the engine ends it once its prompt is computed."""
        if self.abort_message is not None:
            return True
        return not self.prefill_only and self.num_output_tokens >= self.request.sampling.max_new_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
