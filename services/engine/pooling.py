"""Pooling: a prompt's final hidden states (after the last norm, before the LM head) into one vector.

A pooling request is prefill-only (max_new_tokens 0): it goes through the same
scheduler, chunked prefill and prefix cache as any other request, and ends the
step its prompt is fully computed, with the pooled vector instead of tokens.

Which positions each type needs, and what that means for the prefix cache:

    last   position num_prompt - 1 only. A prefix-cache hit never covers the
           block of a prompt's last token (BlockManager.match_prefix), so the
           request takes cache hits like any other.
    mean   every position 0 .. num_prompt - 1. Cached blocks hold K/V, not
           hidden states, so the request takes no cache hit and computes the
           whole prompt (as prompt log-probabilities do); it still publishes its
           full blocks for later requests.
    first  position 0 (CLS), likewise without a cache hit.

Chunked prefill folds each chunk's rows into a float32 running value as the
chunk is computed; `next_position` records how far it got, so a sequence
preempted and recomputed never folds a position twice.

A request with return_hidden_states (SGLang) keeps every row instead
(`HiddenStateLog`): each prompt position (so, like mean pooling, no cache hit),
then the input position of each decode step, handed out with its outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from services.engine.model_runner import Batch, StepLogits
    from services.engine.sequence import Sequence

PoolingType = Literal["last", "mean", "first"]


@dataclass(frozen=True)
class PoolingSettings:
    type: PoolingType = "last"
    # Divide by the L2 norm after truncating to `dimensions`.
    normalize: bool = True
    # Keep the first `dimensions` values (Matryoshka); None: all of them. Validated <= hidden size.
    dimensions: int | None = None

    @property
    def needs_every_position(self) -> bool:
        """Whether the pooled positions may lie in cached blocks (so no prefix-cache hit is taken)."""
        return self.type != "last"


@dataclass
class PoolingState:
    """One sequence's pooling in progress."""

    settings: PoolingSettings
    # First prompt position not folded in yet.
    next_position: int = 0
    # float32 (hidden,): the sum of the folded rows (mean) or the chosen row (last, first).
    value: torch.Tensor | None = None

    def wanted(self, start: int, end: int, num_prompt: int) -> tuple[int, int] | None:
        """The positions [first, last) of the chunk [start, end) to fold in, or None."""
        kind = self.settings.type
        if kind == "last":
            first, last = num_prompt - 1, num_prompt
        elif kind == "first":
            first, last = 0, 1
        else:
            first, last = 0, num_prompt
        first, last = max(first, start, self.next_position), min(last, end)
        return (first, last) if first < last else None

    def fold(self, rows: torch.Tensor, first: int) -> None:
        """rows (count, hidden): the hidden states of positions first .. first+count-1."""
        assert first == self.next_position or self.settings.type != "mean", "mean folds positions in order"
        rows = rows.float()
        part = rows.sum(dim=0) if self.settings.type == "mean" else rows[-1]
        self.value = part if self.value is None or self.settings.type != "mean" else self.value + part
        self.next_position = first + len(rows)

    def result(self, num_prompt: int) -> list[float]:
        assert self.value is not None, "the prompt was computed before the result is read"
        vector = self.value / num_prompt if self.settings.type == "mean" else self.value  # (hidden,)
        return finish_vector(vector, self.settings).tolist()


@dataclass
class HiddenStateLog:
    """The final hidden states of every position a sequence computes, until its next output takes them."""

    next_position: int = 0
    # (count, hidden) blocks of rows in position order, not yet handed out.
    pending: list[torch.Tensor] = field(default_factory=list)

    def wanted(self, start: int, end: int, num_prompt: int) -> tuple[int, int] | None:
        first = max(start, self.next_position)
        return (first, end) if first < end else None

    def fold(self, rows: torch.Tensor, first: int) -> None:
        self.pending.append(rows)
        self.next_position = first + len(rows)

    def take(self) -> list[list[float]]:
        """The rows since the last take, as float32 lists (waits for the device)."""
        if not self.pending:
            return []
        rows, self.pending = torch.cat(self.pending).float(), []
        return rows.tolist()  # type: ignore[no-any-return]


def finish_vector(vector: torch.Tensor, settings: PoolingSettings) -> torch.Tensor:
    """Truncate to settings.dimensions, then L2-normalise when asked: (hidden,) -> (dimensions,)."""
    if settings.dimensions is not None:
        vector = vector[: settings.dimensions]
    if settings.normalize:
        vector = torch.nn.functional.normalize(vector, dim=0)
    return vector


@dataclass(frozen=True)
class PoolRows:
    """Rows first_row .. first_row+count-1 of the flattened batch hold seq's prompt positions
    first_position .. first_position+count-1, which its pooling folds in."""

    seq: Sequence
    first_row: int
    count: int
    first_position: int


def pool_rows(seq: Sequence, start: int, end: int, first_row: int) -> PoolRows | None:
    """The rows of seq's chunk [start, end) (whose row 0 is first_row) that its pooling or its hidden
    state log needs."""
    keeper = seq.pooling or seq.hidden_log
    if keeper is None:
        return None
    span = keeper.wanted(start, end, seq.num_prompt_tokens)
    if span is None:
        return None
    first, last = span
    return PoolRows(seq, first_row + first - start, last - first, first)


def fold_pooling(batch: Batch, logits: StepLogits) -> None:
    """Fold the step's pooled rows into their sequences' pooling or hidden state log (Batch.pool_rows order)."""
    if logits.pool_hidden is None:
        return
    offset = 0
    for part in batch.pool_rows:
        keeper = part.seq.pooling or part.seq.hidden_log
        if keeper is not None and not part.seq.is_finished:  # not aborted while its step ran
            keeper.fold(logits.pool_hidden[offset : offset + part.count], part.first_position)
        offset += part.count
