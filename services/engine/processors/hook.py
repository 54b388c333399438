"""Runs the step's logits processors as one sampler hook (stage 4, after the grammar mask).

Each row's processors run in the order its request lists them; within that, rows sharing a
processor are handed to it together, as SGLang does: `processor(logits[rows], params)` with
one parameter dict per row (its `custom_params` plus `__req__`). A processor that raises, or
returns a wrong shape, NaNs or a row with no finite logit, fails only the requests it was
called for: it is called again row by row so the rows that work keep their result, and the
rows that still fail are reported in `failed` (the engine finishes them with an Abort carrying
the message) and left as they were, so the step itself never fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from services.engine.processors.catalog import ProcessorCall
from services.engine.sampler.types import SamplerRow
from turnout.custom_logit_processor import RequestView


def uses_processors(row: SamplerRow) -> bool:
    return bool(row.settings.logit_processors)


class ProcessorHook:
    def __init__(self) -> None:
        # Row -> why its processor failed.
        self.failed: dict[int, str] = {}

    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplerRow]) -> None:
        depth = max(len(r.settings.logit_processors) for r in rows)
        views: dict[int, RequestView] = {}
        for stage in range(depth):
            # Rows sharing a processor object at this stage, each with its own parameters.
            groups: dict[int, list[tuple[int, ProcessorCall]]] = {}
            for i, row in enumerate(rows):
                chain = row.settings.logit_processors
                if stage < len(chain) and i not in self.failed:
                    groups.setdefault(id(chain[stage].processor), []).append((i, chain[stage]))
            for members in groups.values():
                self._run(logits, rows, members, views)

    def _run(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplerRow],
        members: list[tuple[int, ProcessorCall]],
        views: dict[int, RequestView],
    ) -> None:
        try:
            self._apply(logits, rows, members, views)
            return
        except Exception as exc:
            if len(members) == 1:
                self.failed[members[0][0]] = f"custom logit processor failed: {type(exc).__name__}: {exc}"
                return
        for member in members:  # isolate the failing rows
            self._run(logits, rows, [member], views)

    @staticmethod
    def _apply(
        logits: torch.Tensor,
        rows: Sequence[SamplerRow],
        members: list[tuple[int, ProcessorCall]],
        views: dict[int, RequestView],
    ) -> None:
        params: list[dict[str, Any]] = []
        for i, call in members:
            if i not in views:
                row = rows[i]
                views[i] = RequestView(list(row.token_ids[: row.num_prompt_tokens]), list(row.output_ids))
            params.append({**call.params, "__req__": views[i]})
        index = torch.tensor([i for i, _ in members], device=logits.device)  # (R,)
        sub = logits.index_select(0, index)  # (R, V), a copy: the processor cannot damage other rows
        out = members[0][1].processor(sub, params)
        if not isinstance(out, torch.Tensor) or out.shape != sub.shape:
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"it returned {shape}, expected logits of shape {tuple(sub.shape)}")
        out = out.to(device=logits.device, dtype=logits.dtype)
        if bool(torch.isnan(out).any()):
            raise ValueError("it returned NaN logits")
        if not bool((out > float("-inf")).any(dim=-1).all()):
            raise ValueError("it left no token with a finite logit")
        logits.index_copy_(0, index, out)
