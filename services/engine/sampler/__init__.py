"""The engine's batched sampler: `sample(logits, rows)` turns a step's logits into one token per
row, applying every request's sampling settings vectorised over the batch (see sampler.py for
the stage order)."""

from __future__ import annotations

from services.engine.sampler.sampler import sample
from services.engine.sampler.types import LogitsHook, SamplerOutput, SamplerRow

__all__ = ["LogitsHook", "SamplerOutput", "SamplerRow", "sample"]
