"""Kernel micro-benchmarks: the real kernels run on model-shaped inputs (in Triton's interpreter
on CPU), their bytes and FLOPs are counted as documented, and a device Triton cannot run on gives
a note instead of numbers."""

from __future__ import annotations

import pytest
import torch

from benchmarks.kernel_benches import (
    KernelShapes,
    add_rms_norm_bytes,
    bench_kernels,
    extend_flops,
    paged_decode_bytes,
    store_kv_bytes,
)
from benchmarks.model_shapes import SHAPES
from services.engine.kernels import triton_runs_on

SHAPE = SHAPES["tiny"]
SIZES = KernelShapes(batch=3, context=40, token_counts=(5, 17), prompt=24, block_size=16)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

needs_triton = pytest.mark.skipif(not triton_runs_on(DEVICE), reason="Triton cannot run here (no TRITON_INTERPRET=1)")


@needs_triton
def test_every_kernel_is_timed_against_its_floor() -> None:
    results = bench_kernels(SHAPE, SIZES, torch.float32, DEVICE, bandwidth=1e9, matmul_rate=1e12, repeats=2)

    names = [r.name.split(":")[0] for r in results]
    assert names == ["paged_decode", "extend_attention", *["kv_store"] * 2, *["fused_add_rms_norm"] * 2]
    assert [r.note for r in results] == [None] * 6
    width = 3  # ceil(40 / 16) blocks per sequence
    assert [r.bytes for r in results if r.flops is None] == [
        paged_decode_bytes(SHAPE, [40] * 3, width, 4),
        store_kv_bytes(SHAPE, 5, 4),
        store_kv_bytes(SHAPE, 17, 4),
        add_rms_norm_bytes(SHAPE, 5, 4),
        add_rms_norm_bytes(SHAPE, 17, 4),
    ]
    for r in results:
        assert r.seconds is not None and r.seconds > 0
        floor = r.flops / 1e12 if r.flops is not None else r.bytes / 1e9
        assert r.floor_seconds == floor
        assert r.fraction_of_floor == floor / r.seconds
    (extend,) = [r for r in results if r.flops is not None]
    assert extend.flops == extend_flops(SHAPE, 24)


def test_byte_and_flop_counts() -> None:
    # q + out: 2 * 3 * 4 * 16 floats; K and V: 2 * 100 positions * 2 heads * 16; tables and lens: 8 * 3 * (3 + 1).
    assert paged_decode_bytes(SHAPE, [40, 40, 20], 3, 4) == 4 * (2 * 3 * 4 * 16 + 2 * 100 * 2 * 16) + 8 * 3 * 4
    assert store_kv_bytes(SHAPE, 5, 2) == 2 * 4 * 5 * 2 * 16 + 8 * 5
    assert add_rms_norm_bytes(SHAPE, 5, 2) == 2 * (4 * 5 * 64 + 64)
    # 3 tokens: 6 causal (query, key) pairs, QK^T and PV at 2 FLOPs per multiply-add, 4 heads of 16.
    assert extend_flops(SHAPE, 3) == 6 * 4 * 4 * 16


def test_a_device_triton_cannot_run_on_gives_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    results = bench_kernels(SHAPE, SIZES, torch.float32, torch.device("cpu"), 1e9, 1e12, repeats=2)
    assert [r.seconds for r in results] == [None] * 6
    assert all(r.note and "need a CUDA device" in r.note for r in results)
    assert all(r.bytes > 0 for r in results)
