"""The layers that split one model over a tensor-parallel group (Megatron-LM's scheme, as in vLLM).

    column-parallel  qkv_proj, gate_up_proj   each rank holds its rows of every fused part
                                              (its heads of q, k and v; its rows of gate and up):
                                              a plain MergedLinear of the local sizes, no collective
    row-parallel     o_proj, down_proj        each rank holds its input columns; partial sums
                                              all-reduced, then the (whole) bias added once
    vocab-parallel   embed_tokens, lm_head    each rank holds vocab rows [start, end): masked
                                              lookup + all-reduce; local logits all-gathered

`shard_dims` on a module says which dimension of each of its parameters is split over the
ranks; the loader (weights.py) reads only this rank's part of each checkpoint tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.models.layers import Linear, LMHead
from services.engine.parallel.group import TensorParallel

if TYPE_CHECKING:
    from services.engine.lora.batch import LoraBatch


class RowParallelLinear(Linear):
    """y = all_reduce(x_local @ W_local.T) + b: x (T, in/N) holds this rank's input columns."""

    shard_dims = {"weight": 1}  # the bias is whole on every rank

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallel) -> None:
        super().__init__(in_features // tp.world_size, out_features, bias=bias)
        self.tp = [tp]  # a list keeps the group out of the module's attributes torch inspects

    def forward(self, x: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        """x (T, in/N) -> (T, out), the same on every rank. `lora` is never set under tensor parallelism
        (EngineConfig refuses --enable-lora with it): its term would need the all-reduce too."""
        # (T, out): this rank's share of the sum
        partial = self.cpu_weight.linear(x, None) if self.cpu_weight is not None else F.linear(x, self.weight)
        out = self.tp[0].all_reduce(partial)
        return out + self.bias if self.bias is not None else out


class VocabParallelEmbedding(nn.Module):
    """Rows [start, end) of the embedding: ids outside them look up zeros, and the sum over the
    ranks is every id's row. The vocabulary is padded to a multiple of the group (zero rows)."""

    shard_dims = {"weight": 0}

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel) -> None:
        super().__init__()
        self.start, self.end = tp.shard(vocab_size)
        self.weight = nn.Parameter(torch.empty(self.end - self.start, hidden_size))
        self.tp = [tp]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (T,) -> (T, hidden), the same on every rank."""
        mine = (input_ids >= self.start) & (input_ids < self.end)  # (T,)
        local = torch.where(mine, input_ids - self.start, 0)
        hidden = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)  # (T, hidden)
        return self.tp[0].all_reduce(hidden)


class ParallelLMHead(LMHead):
    """Logits of this rank's vocab rows, all-gathered: every rank gets the whole (N, vocab) row, so
    the sampler on rank 0 is the single-device one. Tied: the rows are the embedding's own shard."""

    shard_dims = {"weight": 0}

    def __init__(
        self, hidden_size: int, vocab_size: int, tied_to: VocabParallelEmbedding | None, tp: TensorParallel
    ) -> None:
        start, end = tp.shard(vocab_size)
        super().__init__(hidden_size, end - start, tied_to)  # type: ignore[arg-type]
        self.vocab_size = vocab_size
        self.tp = [tp]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (N, hidden) -> logits (N, vocab) float32."""
        local = super().forward(hidden)  # (N, vocab / world_size, padded)
        return self.tp[0].all_gather_last(local)[:, : self.vocab_size]
