"""`--skip-forward`: the engine without its model's cost, for benchmarking the service path only.

Every step schedules, builds its batch, postprocesses and streams as always, but runs no forward
pass and no sampler: each sequence's next token is its newest token + 1 (modulo the vocabulary).
The ids are deterministic, so an `ignore_eos` request runs to max_new_tokens and two runs stream
the same ids; the text they decode to means nothing, and no log-probabilities are produced. What
is left is the cost of everything around the model: scheduling, the KV blocks, the step loop and
every hop after it (gateway, router, tokenizer), which docs/benchmarks.md measures with it
(`python -m benchmarks.bench_router --ceiling`). Never a way to serve a model.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence as Seq

import torch

from services.engine.model_runner import Batch, ModelRunner, StepLogits
from services.engine.sequence import Sequence, placeholder
from services.engine.step_sampler import PendingSample


class SkipForwardRunner(ModelRunner):
    """Builds batches as the real runner does (placeholders, block tables), then skips the model."""

    def run(self, batch: Batch) -> StepLogits:
        return StepLogits(torch.empty(0, device=self.device), None)


def launch_counting(seqs: Seq[Sequence], vocab_size: int, device: torch.device) -> PendingSample:
    """launch_sampling's stand-in: seqs[i]'s token is its newest one + 1; placeholders appended as there.
    Every newest token is real here (the engine collects a step before it launches the next)."""
    ids = array("q", [(seq.token_ids[-1] + 1) % vocab_size for seq in seqs])
    host = torch.frombuffer(ids, dtype=torch.int64) if ids else torch.empty(0, dtype=torch.int64)  # (N,)
    for row, seq in enumerate(seqs):
        seq.token_ids.append(placeholder(row))
    return PendingSample(list(seqs), host.to(device), host, [], None, None, {})
