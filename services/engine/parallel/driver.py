"""Rank 0's model runner: each forward it runs is first sent to the other ranks (step_channel.py),
which run the same forward on their shards, so the collectives inside the model pair up."""

from __future__ import annotations

import torch

from services.engine.model_runner import Batch, ModelRunner, StepLogits
from services.engine.parallel.step_channel import StepChannel


class DriverRunner(ModelRunner):
    channel: StepChannel

    def run(self, batch: Batch) -> StepLogits:
        self.channel.send_step(batch)
        return super().run(batch)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self.channel.send_logits(hidden)
        return super().compute_logits(hidden)
