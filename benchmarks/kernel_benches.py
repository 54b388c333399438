"""Micro-benchmarks of the CUDA path's Triton kernels against their floors.

The K/V store, paged decode and fused add + RMSNorm are memory-bound: their floor is the
fewest bytes they must move (every input read once, every output written once) over the
measured bandwidth. Extend (prefill) attention is compute-bound: its floor is its causal
attention FLOPs over the measured matmul rate. Inputs are model-shaped (the 8B model's heads,
a decode batch of 64 x 2048 positions, a 2048-token prompt) and random, never zeros; the KV
cache is a real paged pool with shuffled block tables.

On a device Triton cannot run on, each result carries a note instead of numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmarks.hardware_floors import median_seconds
from benchmarks.model_shapes import ModelShape
from services.engine.kernels import triton_runs_on


@dataclass(frozen=True)
class KernelResult:
    name: str
    bytes: int
    seconds: float | None = None
    floor_seconds: float | None = None
    note: str | None = None  # why it was not measured
    # Set for compute-bound kernels, whose floor is flops / matmul rate instead of bytes / bandwidth.
    flops: int | None = None

    @property
    def achieved_bandwidth(self) -> float | None:
        return self.bytes / self.seconds if self.seconds else None

    @property
    def achieved_flop_rate(self) -> float | None:
        return self.flops / self.seconds if self.seconds and self.flops else None

    @property
    def fraction_of_floor(self) -> float | None:
        return self.floor_seconds / self.seconds if self.seconds and self.floor_seconds else None


@dataclass(frozen=True)
class KernelShapes:
    """Sizes the kernels are timed at: a decode batch (sequences x positions each), token counts
    for the per-token kernels (a decode batch's and a prefill budget's), the paged block size."""

    batch: int
    context: int
    token_counts: tuple[int, ...]
    prompt: int = 2048  # extend attention: one prompt of this many tokens
    block_size: int = 16


def _unavailable(device: torch.device) -> str | None:
    if triton_runs_on(device):
        return None
    return f"not measured: Triton kernels need a CUDA device, or TRITON_INTERPRET=1 on CPU ({device})"


def paged_decode_bytes(shape: ModelShape, seq_lens: list[int], width: int, element_bytes: int) -> int:
    """q read and output written (B, Hq, D); K and V of every cached position read; block tables
    (B, width) and seq_lens (B,) int64 read."""
    batch = len(seq_lens)
    q_and_out = 2 * batch * shape.num_heads * shape.head_dim * element_bytes
    kv = 2 * sum(seq_lens) * shape.num_kv_heads * shape.head_dim * element_bytes
    return q_and_out + kv + 8 * batch * (width + 1)


def store_kv_bytes(shape: ModelShape, tokens: int, element_bytes: int) -> int:
    """k and v (T, Hkv, D) read, the same written into the cache; slot_mapping (T,) int64 read."""
    return 4 * tokens * shape.num_kv_heads * shape.head_dim * element_bytes + 8 * tokens


def extend_flops(shape: ModelShape, prompt: int) -> int:
    """Causal attention of one prompt with nothing cached: QK^T and PV, 2 FLOPs per multiply-add
    each, over the prompt * (prompt + 1) / 2 (query, key) pairs the mask keeps, every query head."""
    pairs = prompt * (prompt + 1) // 2
    return 4 * pairs * shape.num_heads * shape.head_dim


def add_rms_norm_bytes(shape: ModelShape, tokens: int, element_bytes: int) -> int:
    """x and residual (T, hidden) read, normed and summed written; the weight (hidden,) read."""
    return (4 * tokens + 1) * shape.hidden_size * element_bytes


def _paged_pool(
    shape: ModelShape, shapes: KernelShapes, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's K/V pools holding batch x context positions (+ the zero block), shuffled block
    tables (B, W) and seq_lens (B,)."""
    blocks_per_seq = -(-shapes.context // shapes.block_size)
    num_blocks = shapes.batch * blocks_per_seq
    pool = (num_blocks + 1, shapes.block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(pool, dtype=dtype, device=device)
    v_cache = torch.randn(pool, dtype=dtype, device=device)
    k_cache[num_blocks].zero_()
    v_cache[num_blocks].zero_()
    order = torch.randperm(num_blocks, device=device)
    block_tables = order.view(shapes.batch, blocks_per_seq).to(torch.int64)  # (B, W)
    seq_lens = torch.full((shapes.batch,), shapes.context, dtype=torch.int64, device=device)
    return k_cache, v_cache, block_tables, seq_lens


def bench_paged_decode(
    shape: ModelShape, shapes: KernelShapes, dtype: torch.dtype, device: torch.device, bandwidth: float, repeats: int
) -> KernelResult:
    name = f"paged_decode: {shapes.batch} sequences x {shapes.context} positions"
    element = torch.tensor([], dtype=dtype).element_size()
    width = -(-shapes.context // shapes.block_size)
    moved = paged_decode_bytes(shape, [shapes.context] * shapes.batch, width, element)
    note = _unavailable(device)
    if note is not None:
        return KernelResult(name, moved, note=note)
    from services.engine.kernels.paged_decode import paged_decode

    k_cache, v_cache, block_tables, seq_lens = _paged_pool(shape, shapes, dtype, device)
    q = torch.randn(shapes.batch, shape.num_heads, shape.head_dim, dtype=dtype, device=device)  # (B, Hq, D)
    scale = shape.head_dim**-0.5
    seconds = median_seconds(
        lambda: paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale), device, warmup=3, repeats=repeats
    )
    return KernelResult(name, moved, seconds, moved / bandwidth)


def bench_store_kv(
    shape: ModelShape,
    shapes: KernelShapes,
    tokens: int,
    dtype: torch.dtype,
    device: torch.device,
    bandwidth: float,
    repeats: int,
) -> KernelResult:
    name = f"kv_store: {tokens} tokens"
    element = torch.tensor([], dtype=dtype).element_size()
    moved = store_kv_bytes(shape, tokens, element)
    note = _unavailable(device)
    if note is not None:
        return KernelResult(name, moved, note=note)
    from services.engine.kernels.kv_store import kv_store

    k_cache, v_cache, _, _ = _paged_pool(shape, shapes, dtype, device)
    num_slots = (k_cache.shape[0] - 1) * shapes.block_size  # the zero block is never a target
    if tokens > num_slots:
        raise ValueError(f"kv_store: {tokens} tokens do not fit a pool of {num_slots} slots")
    slot_mapping = torch.randperm(num_slots, device=device)[:tokens]  # (T,) distinct slots
    k = torch.randn(tokens, shape.num_kv_heads, shape.head_dim, dtype=dtype, device=device)  # (T, Hkv, D)
    v = torch.randn_like(k)
    seconds = median_seconds(
        lambda: kv_store(k, v, k_cache, v_cache, slot_mapping, num_slots), device, warmup=3, repeats=repeats
    )
    return KernelResult(name, moved, seconds, moved / bandwidth)


def bench_add_rms_norm(
    shape: ModelShape, tokens: int, dtype: torch.dtype, device: torch.device, bandwidth: float, repeats: int
) -> KernelResult:
    name = f"fused_add_rms_norm: {tokens} tokens x {shape.hidden_size}"
    element = torch.tensor([], dtype=dtype).element_size()
    moved = add_rms_norm_bytes(shape, tokens, element)
    note = _unavailable(device)
    if note is not None:
        return KernelResult(name, moved, note=note)
    from services.engine.kernels.rms_norm import fused_add_rms_norm

    x = torch.randn(tokens, shape.hidden_size, dtype=dtype, device=device)  # (T, hidden)
    residual = torch.randn_like(x)
    weight = torch.randn(shape.hidden_size, dtype=dtype, device=device)
    seconds = median_seconds(
        lambda: fused_add_rms_norm(x, residual, weight, shape.rms_norm_eps), device, warmup=3, repeats=repeats
    )
    return KernelResult(name, moved, seconds, moved / bandwidth)


def bench_extend(
    shape: ModelShape, shapes: KernelShapes, dtype: torch.dtype, device: torch.device, matmul_rate: float, repeats: int
) -> KernelResult:
    """One prompt of shapes.prompt tokens, nothing cached (its K/V already stored, as the backend
    does before attending)."""
    prompt = shapes.prompt
    name = f"extend_attention: one {prompt}-token prompt"
    element = torch.tensor([], dtype=dtype).element_size()
    moved = (2 * prompt * shape.num_heads + 2 * prompt * shape.num_kv_heads) * shape.head_dim * element
    flops = extend_flops(shape, prompt)
    note = _unavailable(device)
    if note is not None:
        return KernelResult(name, moved, note=note, flops=flops)
    from services.engine.kernels.extend_attention import extend_attention

    blocks = -(-prompt // shapes.block_size)
    pool = (blocks + 1, shapes.block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(pool, dtype=dtype, device=device)
    v_cache = torch.randn(pool, dtype=dtype, device=device)
    block_tables = torch.randperm(blocks, device=device).view(1, blocks)  # (1, W) int64
    query_start_loc = torch.tensor([0, prompt], dtype=torch.int64, device=device)
    seq_lens = torch.tensor([prompt], dtype=torch.int64, device=device)
    q = torch.randn(prompt, shape.num_heads, shape.head_dim, dtype=dtype, device=device)  # (T, Hq, D)
    scale = shape.head_dim**-0.5
    seconds = median_seconds(
        lambda: extend_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale),
        device,
        warmup=3,
        repeats=repeats,
    )
    return KernelResult(name, moved, seconds, flops / matmul_rate, flops=flops)


def bench_kernels(
    shape: ModelShape,
    shapes: KernelShapes,
    dtype: torch.dtype,
    device: torch.device,
    bandwidth: float,
    matmul_rate: float,
    repeats: int,
) -> list[KernelResult]:
    """Every kernel at the given sizes, in one list (measured, or with the note why not)."""
    results = [bench_paged_decode(shape, shapes, dtype, device, bandwidth, repeats)]
    results.append(bench_extend(shape, shapes, dtype, device, matmul_rate, repeats))
    results += [bench_store_kv(shape, shapes, t, dtype, device, bandwidth, repeats) for t in shapes.token_counts]
    results += [bench_add_rms_norm(shape, t, dtype, device, bandwidth, repeats) for t in shapes.token_counts]
    return results
