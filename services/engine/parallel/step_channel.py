"""Rank 0 tells the other ranks what to compute; they compute the same on their shards.

One scheduler, on rank 0 (as SGLang's TP workers and vLLM's driver worker): each message is a
broadcast of a fixed-size header, then of its payload, from rank 0 to every rank:

    header (HEADER_LEN,) int64       [kind, a, b, c, d, 0, ...]
    STEP     a=T tokens, b=B sequences, c=block-table width W, d=S sampled rows
             payload (3T + 2B + 1 + B*W + S,) int64:
             [input_ids T | positions T | slot_mapping T | query_start_loc B+1 | seq_lens B |
              block_tables B*W | sample_rows S]
    LOGITS   a=N rows, b=hidden: payload (N, hidden) in the model's dtype, final hidden states
             whose logits rank 0 wants outside a step (prompt log-probabilities)
    SHUTDOWN no payload: the workers leave their loop

Messages go out in the order rank 0 runs them, and every rank then runs the same forward, so
the collectives inside the model pair up. Tensors stay on the device (NCCL broadcasts device
tensors): rank 0 never waits for the device to send a step; a worker reads the header on the host.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

import torch

from services.engine.attention.backend import AttentionBackend
from services.engine.attention.context import ForwardContext
from services.engine.model_runner import Batch
from services.engine.parallel.group import TensorParallel

HEADER_LEN = 8


class Kind(enum.IntEnum):
    SHUTDOWN = 0
    STEP = 1
    LOGITS = 2


@dataclass(frozen=True)
class StepMessage:
    """What a worker needs of one step: the batch tensors, and which rows to compute logits for."""

    input_ids: torch.Tensor  # (T,)
    context: ForwardContext
    sample_rows: torch.Tensor  # (S,)


@dataclass(frozen=True)
class LogitsMessage:
    hidden: torch.Tensor  # (N, hidden)


Message = StepMessage | LogitsMessage | None  # None: shut down


class StepChannel:
    def __init__(self, tp: TensorParallel, dtype: torch.dtype) -> None:
        self.tp = tp
        self.dtype = dtype

    def _header(self, kind: Kind, *values: int) -> None:
        header = [int(kind), *values] + [0] * (HEADER_LEN - 1 - len(values))
        self.tp.broadcast(torch.tensor(header, dtype=torch.int64).to(self.tp.device))

    # -- rank 0 ---------------------------------------------------------------

    def send_step(self, batch: Batch) -> None:
        ctx = batch.context
        tables = ctx.block_tables  # (B, W)
        parts = [
            batch.input_ids,
            ctx.positions,
            ctx.slot_mapping,
            ctx.query_start_loc,
            ctx.seq_lens,
            tables.flatten(),
            batch.sample_rows,
        ]
        self._header(Kind.STEP, batch.input_ids.numel(), ctx.num_sequences, tables.shape[1], batch.sample_rows.numel())
        self.tp.broadcast(torch.cat([p.to(torch.int64) for p in parts]))

    def send_logits(self, hidden: torch.Tensor) -> None:
        self._header(Kind.LOGITS, hidden.shape[0], hidden.shape[1])
        self.tp.broadcast(hidden.to(self.dtype).contiguous())

    def send_shutdown(self) -> None:
        self._header(Kind.SHUTDOWN)

    # -- the other ranks ------------------------------------------------------

    def receive(self, backend: AttentionBackend) -> Message:
        """The next message from rank 0 (blocks until it comes); a step's context runs on `backend`."""
        header = self.tp.broadcast(torch.zeros(HEADER_LEN, dtype=torch.int64, device=self.tp.device)).tolist()
        kind = Kind(header[0])
        if kind == Kind.SHUTDOWN:
            return None
        if kind == Kind.LOGITS:
            rows, width = header[1], header[2]
            hidden = torch.empty(rows, width, dtype=self.dtype, device=self.tp.device)
            return LogitsMessage(self.tp.broadcast(hidden))
        tokens, seqs, width, sampled = header[1:5]
        payload = torch.empty(3 * tokens + 2 * seqs + 1 + seqs * width + sampled, dtype=torch.int64)
        payload = self.tp.broadcast(payload.to(self.tp.device))
        ids, positions, slots, starts, seq_lens, tables, rows = payload.split(
            [tokens, tokens, tokens, seqs + 1, seqs, seqs * width, sampled]
        )
        starts_cpu = starts.tolist()
        context = ForwardContext(
            backend=backend,
            positions=positions,
            slot_mapping=slots,
            query_start_loc=starts,
            seq_lens=seq_lens,
            block_tables=tables.view(seqs, width),
            query_lens_cpu=[b - a for a, b in itertools.pairwise(starts_cpu)],
            seq_lens_cpu=seq_lens.tolist(),
        )
        return StepMessage(ids, context, rows)
