"""The batch metadata one model forward needs, passed explicitly down to every attention layer.

A step runs B sequences at once. Each contributes its *new* tokens (a prefill
chunk, or one decode token); all new tokens are flattened into one dimension T:

    tokens:  [ seq 0 new tokens | seq 1 new tokens | ... | seq B-1 new tokens ]
    index:    0 .. q0-1           q0 .. q0+q1-1               .. T-1
    query_start_loc = [0, q0, q0+q1, ..., T]                      (B+1,)

Sequence b has seq_lens[b] tokens in the cache once this step's K/V are stored:
its cached prefix (seq_lens[b] - q_b tokens, computed in earlier steps or hit in
the prefix cache) followed by its q_b new tokens. New token i of sequence b sits
at position seq_lens[b] - q_b + i and attends to cache positions 0 .. that one
(causal).

Paged layout: the cache of each layer is (num_blocks, block_size, num_kv_heads,
head_dim) for K and the same for V. block_tables[b, j] is the physical block
holding positions j*block_size .. (j+1)*block_size-1 of sequence b (rows padded
with 0 past the sequence's blocks). slot_mapping[t] = block * block_size + offset
is where new token t's K/V go.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from services.engine.attention.backend import AttentionBackend
from services.engine.lora.batch import LoraBatch


@dataclass
class ForwardContext:
    backend: AttentionBackend
    positions: torch.Tensor  # (T,) int64, position of every new token in its sequence
    slot_mapping: torch.Tensor  # (T,) int64, cache slot of every new token
    query_start_loc: torch.Tensor  # (B+1,) int64, offsets of each sequence's new tokens
    seq_lens: torch.Tensor  # (B,) int64, cached + new tokens per sequence
    block_tables: torch.Tensor  # (B, max_blocks_per_seq) int64, padded with 0
    # Host copies of the lengths, so backends can plan without a device sync.
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    # Values a backend derives from this batch once and reuses in every layer (gather indices,
    # host-side lists), so no layer repeats the work or a device-to-host copy.
    scratch: dict[str, Any] = field(default_factory=dict)
    # The adapter slot of every new token, grouped for the LoRA matmuls; None when no token has one.
    lora: LoraBatch | None = None

    @property
    def num_sequences(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def is_decode_only(self) -> bool:
        """Every sequence brings exactly one new token."""
        return all(q == 1 for q in self.query_lens_cpu)

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (T, Hq, D), k/v (T, Hkv, D) of the new tokens -> attention output (T, Hq, D)."""
        return self.backend.forward(layer, q, k, v, self)
