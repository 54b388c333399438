"""The least time a model step can take on a device: bytes over bandwidth, FLOPs over matmul rate.

A step runs B sequences; sequence b brings q_b new tokens and has s_b tokens in the
KV cache once they are stored (the layout of attention/context.py). Counted, for a
model of `ModelShape`:

    bytes  = every weight the step multiplies through, read once
             (layers' matrices and norms + the LM head matrix; the embedding rows
              gathered are negligible and left out)
           + K/V read by attention: s_b tokens of every layer, per sequence
           + K/V written: q_b tokens of every layer, per sequence
    FLOPs  = 2 * matmul params * T               (T = sum of q_b: every new token)
           + 2 * vocab * hidden * sampled rows   (the LM head, only on sampled rows)
           + 4 * layers * heads * head_dim * (positions attended, summed over new tokens)
             where new token i of b (at position s_b - q_b + i) attends to s_b - q_b + i + 1
             positions: QK^T and PV each cost 2 * head_dim per position and head.

Activations (hidden states between kernels) are left out: at these sizes they are a
few percent of the weights. The floor is the larger of bytes / bandwidth and
FLOPs / matmul rate; `bound` says which. Both ceilings are measured
(`hardware_floors`), not datasheet figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.model_shapes import ModelShape


@dataclass(frozen=True)
class Ceilings:
    """What the device sustains, measured: bytes per second (read + written) and FLOP per second."""

    bandwidth: float
    matmul_rate: float


@dataclass(frozen=True)
class StepFloor:
    bytes: int
    flops: int
    memory_seconds: float
    compute_seconds: float

    @property
    def seconds(self) -> float:
        return max(self.memory_seconds, self.compute_seconds)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_seconds >= self.compute_seconds else "compute"


def attended_positions(query_len: int, seq_len: int) -> int:
    """Positions attended by a sequence's query_len new tokens, the last at position seq_len - 1:
    sum over i < query_len of (seq_len - query_len + i + 1)."""
    cached = seq_len - query_len
    return query_len * cached + query_len * (query_len + 1) // 2


def step_bytes(shape: ModelShape, query_lens: list[int], seq_lens: list[int], element_bytes: int) -> int:
    """Fewest bytes a step moves: weights once, each sequence's cached K/V read, new K/V written."""
    weights = (shape.non_embedding_params + shape.lm_head_params) * element_bytes
    kv = shape.kv_bytes_per_token(element_bytes)
    return weights + kv * (sum(seq_lens) + sum(query_lens))


def step_flops(shape: ModelShape, query_lens: list[int], seq_lens: list[int], sampled_rows: int) -> int:
    """FLOPs of a step: the layers' matmuls for every new token, the LM head for sampled rows,
    and causal attention of every new token over its sequence's positions so far."""
    tokens = sum(query_lens)
    matmuls = 2 * shape.matmul_params * tokens
    lm_head = 2 * shape.lm_head_params * sampled_rows
    positions = sum(attended_positions(q, s) for q, s in zip(query_lens, seq_lens, strict=True))
    attention = 4 * shape.num_layers * shape.num_heads * shape.head_dim * positions
    return matmuls + lm_head + attention


def step_floor(
    shape: ModelShape,
    query_lens: list[int],
    seq_lens: list[int],
    sampled_rows: int,
    element_bytes: int,
    ceilings: Ceilings,
) -> StepFloor:
    """The floor of any step (prefill, decode or mixed)."""
    moved = step_bytes(shape, query_lens, seq_lens, element_bytes)
    flops = step_flops(shape, query_lens, seq_lens, sampled_rows)
    return StepFloor(moved, flops, moved / ceilings.bandwidth, flops / ceilings.matmul_rate)


def decode_step_floor(shape: ModelShape, seq_lens: list[int], element_bytes: int, ceilings: Ceilings) -> StepFloor:
    """One decode step of len(seq_lens) sequences, each bringing one new token and sampling one:
    memory-bound until the batch is large (the weights are read once for the whole batch,
    each sequence's K/V once for itself)."""
    ones = [1] * len(seq_lens)
    return step_floor(shape, ones, seq_lens, len(seq_lens), element_bytes, ceilings)


def prefill_floor(shape: ModelShape, prompt_len: int, element_bytes: int, ceilings: Ceilings) -> StepFloor:
    """Prefill of one prompt in one step, sampling its first token (time to first token):
    2 * matmul params * prompt_len + causal attention 2 * layers * heads * head_dim * L(L+1),
    compute-bound from a few hundred tokens on."""
    return step_floor(shape, [prompt_len], [prompt_len], 1, element_bytes, ceilings)
