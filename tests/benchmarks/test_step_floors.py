"""The floor arithmetic against counts made independently (published totals, per-token loops)."""

from __future__ import annotations

import pytest

from benchmarks.model_shapes import SHAPES
from benchmarks.step_floors import (
    Ceilings,
    attended_positions,
    decode_step_floor,
    prefill_floor,
    step_bytes,
    step_flops,
)

# About an H100's measured ceilings: 3 TB/s, 800 TFLOP/s.
H100ISH = Ceilings(bandwidth=3e12, matmul_rate=800e12)


@pytest.mark.parametrize(("query_len", "seq_len"), [(1, 1), (1, 129), (5, 5), (7, 20), (64, 2048)])
def test_attended_positions_counts_each_new_token_causally(query_len: int, seq_len: int) -> None:
    first = seq_len - query_len
    assert attended_positions(query_len, seq_len) == sum(p + 1 for p in range(first, seq_len))


def test_decode_bytes_are_every_weight_but_the_embedding_plus_the_kv_read_and_written() -> None:
    shape = SHAPES["8b"]
    embedding = shape.vocab_size * shape.hidden_size
    # Published total of Llama-3.1-8B minus its (untied) embedding table: the LM head is read, the
    # embedding only gathers one row per token.
    weights = 2 * (8_030_261_248 - embedding)
    kv_per_token = 2 * 32 * 8 * 128 * 2
    assert step_bytes(shape, [1], [128], 2) == weights + kv_per_token * (128 + 1)
    assert step_bytes(shape, [1, 1], [10, 30], 2) == weights + kv_per_token * (40 + 2)


def test_tied_model_reads_its_embedding_as_the_lm_head() -> None:
    shape = SHAPES["1b"]
    assert step_bytes(shape, [1], [1], 2) - 2 * shape.kv_bytes_per_token(2) == 2 * 1_235_814_400


@pytest.mark.parametrize("key", ["tiny", "1b", "8b"])
def test_prefill_flops_equal_a_per_token_count(key: str) -> None:
    shape, length = SHAPES[key], 37
    per_layer_attention = [4 * shape.num_heads * shape.head_dim * (p + 1) for p in range(length)]
    expected = (
        2 * shape.matmul_params * length
        + 2 * shape.vocab_size * shape.hidden_size  # one sampled row
        + shape.num_layers * sum(per_layer_attention)
    )
    assert step_flops(shape, [length], [length], 1) == expected
    assert prefill_floor(shape, length, 2, H100ISH).flops == expected


def test_mixed_step_adds_its_sequences() -> None:
    shape = SHAPES["tiny"]
    mixed = step_flops(shape, [1, 16], [40, 16], 2)
    assert mixed == step_flops(shape, [1], [40], 1) + step_flops(shape, [16], [16], 1)


def test_8b_decode_is_memory_bound_and_a_long_prefill_compute_bound() -> None:
    shape = SHAPES["8b"]
    decode = decode_step_floor(shape, [128], 2, H100ISH)
    assert decode.bound == "memory"
    assert decode.seconds == pytest.approx(decode.bytes / 3e12)
    assert 4.9e-3 < decode.seconds < 5.1e-3  # ~15 GB of weights at 3 TB/s
    prefill = prefill_floor(shape, 2048, 2, H100ISH)
    assert prefill.bound == "compute"
    assert prefill.seconds == pytest.approx(prefill.flops / 800e12)
    # 2 * 6.98 B matmul params * 2048 tokens ~ 28.6 TFLOP, plus ~1.1 TFLOP of attention.
    assert 29e12 < prefill.flops < 31e12


def test_a_large_decode_batch_turns_compute_bound() -> None:
    shape = SHAPES["8b"]
    assert decode_step_floor(shape, [16] * 16, 2, H100ISH).bound == "memory"
    assert decode_step_floor(shape, [16] * 1024, 2, H100ISH).bound == "compute"
