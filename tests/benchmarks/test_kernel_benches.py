"""Kernel micro-benchmarks: the kernels are called with the agreed signatures and model-shaped
inputs, their bytes counted, and a kernel module not in the tree is a note, not a crash.

The kernel modules are stood in by torch functions here, so the measuring code is tested
whether or not the real kernels are merged."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

import pytest
import torch

from benchmarks.kernel_benches import (
    KernelShapes,
    add_rms_norm_bytes,
    bench_kernels,
    paged_decode_bytes,
    store_kv_bytes,
)
from benchmarks.model_shapes import SHAPES
from services.engine.kernels import triton_runs_on

SHAPE = SHAPES["tiny"]
SIZES = KernelShapes(batch=3, context=40, token_counts=(5, 17), block_size=16)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PACKAGE = "services.engine.kernels"

needs_triton = pytest.mark.skipif(not triton_runs_on(DEVICE), reason="Triton cannot run here (no TRITON_INTERPRET=1)")


def stand_in(monkeypatch: pytest.MonkeyPatch, module: str, name: str, fn: Callable[..., object]) -> None:
    fake = types.ModuleType(f"{PACKAGE}.{module}")
    setattr(fake, name, fn)
    monkeypatch.setitem(sys.modules, f"{PACKAGE}.{module}", fake)


@needs_triton
def test_kernels_get_model_shaped_inputs_and_are_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    hq, hkv, d = SHAPE.num_heads, SHAPE.num_kv_heads, SHAPE.head_dim
    width = 3  # ceil(40 / 16) blocks per sequence

    def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale):  # type: ignore[no-untyped-def]
        assert q.shape == (3, hq, d)
        assert k_cache.shape == v_cache.shape == (3 * width + 1, 16, hkv, d)
        assert block_tables.shape == (3, width) and block_tables.dtype == torch.int64
        assert sorted(block_tables.flatten().tolist()) == list(range(3 * width)), "every block once, zero block never"
        assert seq_lens.tolist() == [40, 40, 40]
        assert scale == d**-0.5
        assert not torch.equal(k_cache[0], torch.zeros_like(k_cache[0])), "timed on zeros"
        calls.append("decode")
        return torch.empty_like(q)

    def store_kv(k, v, k_cache, v_cache, slot_mapping):  # type: ignore[no-untyped-def]
        assert k.shape == v.shape == (len(slot_mapping), hkv, d)
        assert len(set(slot_mapping.tolist())) == len(slot_mapping)
        assert int(slot_mapping.max()) < (k_cache.shape[0] - 1) * 16, "wrote into the zero block"
        calls.append(f"store{len(slot_mapping)}")

    def fused_add_rms_norm(x, residual, weight, eps):  # type: ignore[no-untyped-def]
        assert x.shape == residual.shape and x.shape[1] == SHAPE.hidden_size
        assert weight.shape == (SHAPE.hidden_size,) and eps == SHAPE.rms_norm_eps
        calls.append(f"norm{x.shape[0]}")
        return x, residual

    stand_in(monkeypatch, "paged_decode", "paged_decode_attention", paged_decode_attention)
    stand_in(monkeypatch, "kv_store", "store_kv", store_kv)
    stand_in(monkeypatch, "rms_norm", "fused_add_rms_norm", fused_add_rms_norm)
    results = bench_kernels(SHAPE, SIZES, torch.float32, DEVICE, bandwidth=1e9, repeats=2)

    # 3 warm-up calls + 2 timed per kernel and size.
    assert calls == ["decode"] * 5 + ["store5"] * 5 + ["store17"] * 5 + ["norm5"] * 5 + ["norm17"] * 5
    assert [r.note for r in results] == [None] * 5
    assert [r.bytes for r in results] == [
        paged_decode_bytes(SHAPE, [40] * 3, width, 4),
        store_kv_bytes(SHAPE, 5, 4),
        store_kv_bytes(SHAPE, 17, 4),
        add_rms_norm_bytes(SHAPE, 5, 4),
        add_rms_norm_bytes(SHAPE, 17, 4),
    ]
    for r in results:
        assert r.seconds is not None and r.seconds > 0
        assert r.floor_seconds == r.bytes / 1e9
        assert r.fraction_of_floor == r.floor_seconds / r.seconds


def test_byte_counts() -> None:
    # q + out: 2 * 3 * 4 * 16 floats; K and V: 2 * 100 positions * 2 heads * 16; tables and lens: 8 * 3 * (3 + 1).
    assert paged_decode_bytes(SHAPE, [40, 40, 20], 3, 4) == 4 * (2 * 3 * 4 * 16 + 2 * 100 * 2 * 16) + 8 * 3 * 4
    assert store_kv_bytes(SHAPE, 5, 2) == 2 * 4 * 5 * 2 * 16 + 8 * 5
    assert add_rms_norm_bytes(SHAPE, 5, 2) == 2 * (4 * 5 * 64 + 64)


@needs_triton
def test_a_kernel_module_not_in_the_tree_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("paged_decode", "kv_store", "rms_norm"):
        monkeypatch.setitem(sys.modules, f"{PACKAGE}.{module}", None)  # import raises ModuleNotFoundError
    results = bench_kernels(SHAPE, SIZES, torch.float32, DEVICE, bandwidth=1e9, repeats=2)
    assert [r.seconds for r in results] == [None] * 5
    assert results[0].note == "not measured: services/engine/kernels/paged_decode.py is not in this tree yet"
    assert all(r.note and r.note.startswith("not measured") for r in results)
    assert all(r.bytes > 0 for r in results)
