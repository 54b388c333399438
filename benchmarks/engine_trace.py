"""Driving an LLMEngine over a list of requests and recording what every step did and took.

Each step's record holds its wall time and its batch: the new tokens and cached positions of
every sequence, and how many rows were sampled, which is what `step_floors` needs to say how
fast that step could have been.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from benchmarks.model_shapes import ModelShape
from benchmarks.step_floors import Ceilings, step_floor
from services.engine.block_manager import BlockManager
from services.engine.llm_engine import LLMEngine
from services.engine.model_runner import Batch
from services.engine.request import EngineRequest
from services.engine.scheduler import ScheduledSequence
from turnout.gc_heap import frozen_heap


@dataclass(frozen=True)
class StepRecord:
    seconds: float
    query_lens: list[int]  # new tokens per sequence
    seq_lens: list[int]  # cached + new tokens per sequence
    sampled: int  # rows whose logits were computed and sampled

    @property
    def is_decode(self) -> bool:
        return all(q == 1 for q in self.query_lens)

    def floor_seconds(self, shape: ModelShape, element_bytes: int, ceilings: Ceilings) -> float:
        return step_floor(shape, self.query_lens, self.seq_lens, self.sampled, element_bytes, ceilings).seconds


@dataclass
class Trace:
    seconds: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    # Prompt tokens found in the prefix cache (a benchmark's fresh prompts should find none).
    cached_tokens: int = 0
    steps: list[StepRecord] = field(default_factory=list)
    # Seconds from the start of the run to each request's first output token, by request id.
    first_token: dict[str, float] = field(default_factory=dict)

    @property
    def decode_steps(self) -> list[StepRecord]:
        return [s for s in self.steps if s.is_decode]

    def floor_seconds(self, shape: ModelShape, element_bytes: int, ceilings: Ceilings) -> float:
        """The sum of every step's floor: the least time the whole run could have taken."""
        return sum(s.floor_seconds(shape, element_bytes, ceilings) for s in self.steps)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_requests(engine: LLMEngine, requests: list[EngineRequest]) -> Trace:
    """Add every request at once, step until all finish; the engine is left empty and reusable."""
    device = engine.loaded.device
    trace = Trace(prompt_tokens=sum(len(r.input_ids) for r in requests))
    batches: list[Batch] = []
    original: Callable[[list[ScheduledSequence], BlockManager, torch.Tensor | None], Batch] = engine.runner.build_batch

    def recorded(
        scheduled: list[ScheduledSequence], block_manager: BlockManager, pending_tokens: torch.Tensor | None = None
    ) -> Batch:
        batch = original(scheduled, block_manager, pending_tokens)
        batches.append(batch)
        return batch

    engine.runner.build_batch = recorded  # type: ignore[method-assign]
    try:
        with frozen_heap():  # as the engine service runs (turnout/gc_heap.py)
            _synchronize(device)
            start = time.perf_counter()
            for request in requests:
                engine.add_request(request)
            step_start = time.perf_counter()
            while engine.has_work():
                # No device sync per step: it would stall the overlap of one step's CPU work with the
                # previous step's GPU work. A step's time is from the previous step's return to its own
                # (the engine reads its tokens back every step, so the two clocks stay within a step).
                outputs = engine.step()
                now = time.perf_counter()
                if batches:
                    batch = batches.pop()
                    ctx = batch.context
                    record = StepRecord(
                        now - step_start, list(ctx.query_lens_cpu), list(ctx.seq_lens_cpu), len(batch.sample_seqs)
                    )
                    trace.steps.append(record)
                step_start = now
                for out in outputs:
                    new = len(out.output.token_ids)
                    trace.output_tokens += new
                    if new and out.request_id not in trace.first_token:
                        trace.first_token[out.request_id] = now - start
                        trace.cached_tokens += out.output.cached_tokens
            _synchronize(device)
            trace.seconds = time.perf_counter() - start
            if trace.output_tokens and not trace.steps:
                raise RuntimeError("steps ran but no batch was recorded: does LLMEngine still call runner.build_batch?")
    finally:
        engine.runner.build_batch = original  # type: ignore[method-assign,assignment]
    return trace
