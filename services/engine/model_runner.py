"""Builds one step's batch tensors, runs the model, returns the logits to sample from.

Only sequences whose computed tokens reach their last token this step get
logits (a prefill chunk that ends mid-prompt produces none; a prefill-only
request never does). The rows a pooling request pools, or a hidden-states
request keeps (pooling.py), come back as hidden states, like the rows of prompt
log-probabilities. A token whose
sampling is still pending (a placeholder, see sequence.py) is taken from the
previous step's token tensor on the device: building a batch never waits for
the device. With decode graphs (cuda_graphs.py), a decode-only batch they fit
replays a CUDA graph instead of running the model eagerly; any other batch runs
eagerly.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence as Sequence_
from dataclasses import dataclass, field

import torch

from services.engine.attention.backend import AttentionBackend
from services.engine.attention.context import ForwardContext
from services.engine.block_manager import BlockManager
from services.engine.cuda_graphs import DecodeGraphs
from services.engine.lora.batch import LoraBatch
from services.engine.lora.manager import LoraManager
from services.engine.pooling import PoolRows, pool_rows
from services.engine.scheduler import ScheduledSequence
from services.engine.sequence import Sequence


@dataclass(frozen=True)
class PromptLogprobRows:
    """Rows first_row .. first_row+count-1 of the flattened batch predict prompt tokens
    first_target .. first_target+count-1 of seq (prompt log-probabilities)."""

    seq: Sequence
    first_row: int
    count: int
    first_target: int


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # (T,)
    context: ForwardContext
    # Rows of the flattened batch whose logits are sampled, and their sequences.
    sample_rows: torch.Tensor  # (N,)
    sample_seqs: list[Sequence]
    prompt_rows: list[PromptLogprobRows]
    pool_rows: list[PoolRows] = field(default_factory=list)


@dataclass(frozen=True)
class StepLogits:
    sample: torch.Tensor  # (N, V) float32, rows of Batch.sample_seqs
    # (sum of PromptLogprobRows.count, hidden) final hidden states, in Batch.prompt_rows order.
    prompt_hidden: torch.Tensor | None
    # (sum of PoolRows.count, hidden) final hidden states, in Batch.pool_rows order.
    pool_hidden: torch.Tensor | None = None


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        block_size: int,
        device: torch.device,
        graphs: DecodeGraphs | None = None,
        lora: LoraManager | None = None,
    ) -> None:
        self.model = model
        self.backend = backend
        self.block_size = block_size
        self.device = device
        self.graphs = graphs
        self.lora = lora

    def build_batch(
        self,
        scheduled: list[ScheduledSequence],
        block_manager: BlockManager,
        pending_tokens: torch.Tensor | None = None,  # (N,) the pending step's tokens, when there is one
    ) -> Batch:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        query_lens: list[int] = []
        seq_lens: list[int] = []
        tables: list[Sequence_[int]] = []
        sample_rows: list[int] = []
        sample_seqs: list[Sequence] = []
        prompt_rows: list[PromptLogprobRows] = []
        pooled: list[PoolRows] = []
        token_slots: list[int] = []  # the LoRA slot of every token, -1: base model
        row = 0  # first row of the item's tokens in the flattened batch
        for item in scheduled:
            seq, count = item.seq, item.num_new_tokens
            start = seq.num_computed_tokens
            end = start + count
            table = block_manager.table(seq.seq_id)
            if count == 1:  # a decode: most items of most steps
                input_ids.append(seq.token_ids[start])
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                input_ids += seq.token_ids[start:end]
                positions += range(start, end)
                slots += _slots(table, start, end, bs)
            if self.lora is not None:
                token_slots += [self.lora.slot_of(seq.seq_id)] * count
            next_row = row + count
            query_start.append(next_row)
            query_lens.append(count)
            seq_lens.append(end)
            tables.append(table)
            if seq.pooling is not None or seq.hidden_log is not None:
                pool = pool_rows(seq, start, end, row)
                if pool is not None:
                    pooled.append(pool)
            if end == len(seq.token_ids) and not seq.prefill_only:
                sample_rows.append(next_row - 1)
                sample_seqs.append(seq)
            target = seq.prompt_logprob_start
            if target is not None:
                # Position p's logits predict token p + 1.
                first, last = max(start, target - 1), min(end, seq.num_prompt_tokens - 1)
                if first < last:
                    prompt_rows.append(PromptLogprobRows(seq, row + first - start, last - first, first + 1))
            row = next_row
        # One host buffer and one copy to the device for every index tensor of the step.
        (ids, pos, slot_mapping, starts, lens, sample), block_tables = _int64_on(
            self.device, [input_ids, positions, slots, query_start, seq_lens, sample_rows], tables
        )
        context = ForwardContext(
            backend=self.backend,
            positions=pos,
            slot_mapping=slot_mapping,
            query_start_loc=starts,
            seq_lens=lens,
            block_tables=block_tables,
            query_lens_cpu=query_lens,
            seq_lens_cpu=seq_lens,
            lora=LoraBatch.of(token_slots, self.device),
        )
        if min(input_ids) < 0:
            if pending_tokens is None:
                raise ValueError("the batch holds pending tokens (placeholders) but no pending_tokens were given")
            # placeholder(row) = -(row + 1): the token at that row of the pending step's tensor.
            rows = (-ids - 1).clamp_(min=0)  # (T,)
            ids = torch.where(ids < 0, pending_tokens[rows], ids)
        return Batch(ids, context, sample, sample_seqs, prompt_rows, pooled)

    @torch.inference_mode()
    def run(self, batch: Batch) -> StepLogits:
        """Logits for batch.sample_seqs, in that order, and the hidden states of prompt-logprob and pool rows."""
        # The graphs were captured without LoRA terms: a step with adapter tokens runs eagerly.
        graphed = (
            self.graphs is not None and not batch.prompt_rows and not batch.pool_rows and batch.context.lora is None
        )
        if graphed and self.graphs is not None and self.graphs.fits(batch.context):
            return self._run_graph(batch, self.graphs)
        hidden = self.model(batch.input_ids, batch.context.positions, batch.context)  # (T, hidden)
        prompt_hidden = _rows(hidden, batch.prompt_rows)
        pool_hidden = _rows(hidden, batch.pool_rows)
        if not batch.sample_seqs:
            return StepLogits(torch.empty(0, device=self.device), prompt_hidden, pool_hidden)
        logits = self.model.compute_logits(hidden[batch.sample_rows])  # type: ignore[operator]
        return StepLogits(logits, prompt_hidden, pool_hidden)

    def _run_graph(self, batch: Batch, graphs: DecodeGraphs) -> StepLogits:
        logits = graphs.run(batch.input_ids, batch.context)  # (B, V), row b = sequence b
        if not batch.sample_seqs:
            return StepLogits(torch.empty(0, device=self.device), None)
        if len(batch.sample_seqs) < len(logits):
            # A one-token prefill chunk that ends mid-prompt has a row but samples nothing.
            logits = logits[batch.sample_rows]
        return StepLogits(logits, None)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)  # type: ignore[operator,no-any-return]


def _rows(hidden: torch.Tensor, parts: list[PromptLogprobRows] | list[PoolRows]) -> torch.Tensor | None:
    """hidden (T, hidden) -> the rows the parts name, in order: (sum of counts, hidden); None for no parts."""
    if not parts:
        return None
    rows = [r for part in parts for r in range(part.first_row, part.first_row + part.count)]
    return hidden[torch.tensor(rows, device=hidden.device)]


def _slots(table: Sequence_[int], start: int, end: int, block_size: int) -> list[int]:
    """The cache slots of positions start .. end-1 under the block table: block * block_size + offset,
    one run of consecutive slots per block."""
    slots: list[int] = []
    while start < end:
        index = start // block_size
        stop = min(end, (index + 1) * block_size)
        shift = (table[index] - index) * block_size  # slot of position p in this block: shift + p
        slots += range(shift + start, shift + stop)
        start = stop
    return slots


def _int64_on(
    device: torch.device, parts: list[list[int]], tables: list[Sequence_[int]]
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The lists as int64 tensors on the device, one (len,) tensor per part, and the block tables as one
    (B, W) tensor padded with 0 to the longest (W), all views of one buffer copied in one go.

    A Python list goes into an `array` at a few ns per int and the tensor shares its memory: torch.tensor()
    on lists costs several times more, per call and per element (docs/benchmarks.md, issue 15). On CUDA the
    buffer is pinned and the copy non-blocking, so it queues behind the device's work instead of waiting for
    it. Each part starts at an even index: the views keep the 16-byte alignment kernels specialise on."""
    flat: list[int] = []
    starts: list[int] = []
    for part in parts:
        starts.append(len(flat))
        flat += part
        if len(flat) % 2:
            flat.append(0)
    width = max(map(len, tables))
    padding = [0] * width
    first_table = len(flat)
    for table in tables:
        flat += table
        if len(table) < width:
            flat += padding[len(table) :]
    host = torch.frombuffer(array("q", flat), dtype=torch.int64)
    if device.type == "cuda":
        host = torch.empty_like(host, pin_memory=True).copy_(host)
    values = host.to(device, non_blocking=True)
    views = [values[start : start + len(part)] for start, part in zip(starts, parts, strict=True)]
    return views, values[first_table : first_table + len(tables) * width].view(len(tables), width)
