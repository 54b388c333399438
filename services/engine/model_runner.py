"""Builds one step's batch tensors, runs the model, returns the logits to sample from.

Only sequences whose computed tokens reach their last token this step get
logits (a prefill chunk that ends mid-prompt produces none).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.engine.attention.backend import AttentionBackend
from services.engine.attention.context import ForwardContext
from services.engine.block_manager import BlockManager
from services.engine.scheduler import ScheduledSequence
from services.engine.sequence import Sequence


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # (T,)
    context: ForwardContext
    # Rows of the flattened batch whose logits are sampled, and their sequences.
    sample_rows: torch.Tensor  # (N,)
    sample_seqs: list[Sequence]


class ModelRunner:
    def __init__(
        self, model: torch.nn.Module, backend: AttentionBackend, block_size: int, device: torch.device
    ) -> None:
        self.model = model
        self.backend = backend
        self.block_size = block_size
        self.device = device

    def build_batch(self, scheduled: list[ScheduledSequence], block_manager: BlockManager) -> Batch:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        sample_rows: list[int] = []
        sample_seqs: list[Sequence] = []
        for item in scheduled:
            seq, start, count = item.seq, item.seq.num_computed_tokens, item.num_new_tokens
            end = start + count
            table = block_manager.block_table(seq.seq_id)
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            query_start.append(query_start[-1] + count)
            seq_lens.append(end)
            tables.append(table)
            if end == seq.num_tokens:
                sample_rows.append(query_start[-1] - 1)
                sample_seqs.append(seq)
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]

        def tensor(values: list[int] | list[list[int]]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        context = ForwardContext(
            backend=self.backend,
            positions=tensor(positions),
            slot_mapping=tensor(slots),
            query_start_loc=tensor(query_start),
            seq_lens=tensor(seq_lens),
            block_tables=tensor(padded),
            query_lens_cpu=[item.num_new_tokens for item in scheduled],
            seq_lens_cpu=seq_lens,
        )
        return Batch(tensor(input_ids), context, tensor(sample_rows), sample_seqs)

    @torch.inference_mode()
    def run(self, batch: Batch) -> torch.Tensor:
        """Logits (N, vocab) float32 for batch.sample_seqs, in that order."""
        hidden = self.model(batch.input_ids, batch.context.positions, batch.context)  # (T, hidden)
        if not batch.sample_seqs:
            return torch.empty(0, device=self.device)
        return self.model.compute_logits(hidden[batch.sample_rows])  # type: ignore[operator]
