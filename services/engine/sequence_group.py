"""The samples of one request: sample 0 computes the prompt, the others are forked from it.

A request asking for `best_of` samples (n, or more for best_of) starts as one
sequence. When its prefill completes, the same logits give every sample its
first token; samples 1.. then join the running batch on sample 0's full
prompt blocks (BlockManager.fork), so the prompt is computed and stored once.
A beam-search request instead keeps its beams in `beams` (beam_search.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.engine.request import EngineRequest
from services.engine.sequence import Sequence

if TYPE_CHECKING:
    from services.engine.beam_search import BeamSearch


@dataclass(eq=False)
class SequenceGroup:
    request: EngineRequest
    priority: int = 0
    seqs: list[Sequence] = field(default_factory=list)
    # Set by whoever must stop the request (cancellation); the step loop finishes it at the next step.
    abort_message: str | None = None
    # A beam-search request's search (beam_search.py), which owns its beams; None: samples.
    beams: BeamSearch | None = None

    def __post_init__(self) -> None:
        if not self.seqs:
            self.seqs = [Sequence(self.request, priority=self.priority)]

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_samples(self) -> int:
        return self.request.sampling.best_of

    def needs_fork(self, seq: Sequence) -> bool:
        """Whether seq is sample 0 about to sample its first token, with more samples to start."""
        if self.beams is not None:
            return False
        return seq.index == 0 and seq.num_output_tokens == 0 and len(self.seqs) < self.num_samples

    def fork(self) -> list[Sequence]:
        """Create samples 1 .. best_of-1 (without blocks: the scheduler gives them sample 0's)."""
        children = [self.seqs[0].fork(i) for i in range(len(self.seqs), self.num_samples)]
        self.seqs += children
        return children

    @property
    def unfinished(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.is_finished]

    @property
    def is_finished(self) -> bool:
        return len(self.seqs) == self.num_samples and not self.unfinished
