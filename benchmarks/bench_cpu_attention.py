"""The CPU attention kernels on steps with prompt chunks: paged_prefill's tiles against
paged_decode run once per token (what such steps used before), same inputs, same process.

    python -m benchmarks.bench_cpu_attention [--threads 2] [--repeats 10]

Two steps of the default model's attention shape (9 query heads, 3 KV heads of 64, blocks of
16, one layer): 14 whole prompts of 32-256 tokens (bench_engine's throughput workload), and 12
chunks of 128 tokens after a cached 512-token prefix (bench_peers' shared-prefix workload).
Prints a Markdown table: ms per layer, GFLOP/s of the causal products, and the ratio.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 16


@dataclass(frozen=True)
class Step:
    name: str
    chunks: list[tuple[int, int]]  # (new tokens, cached tokens before them) per sequence


def default_steps(scale: float = 1.0) -> list[Step]:
    rng = random.Random(0)
    prompts = [(max(1, int(rng.randint(32, 256) * scale)), 0) for _ in range(14)]
    prefix = [(max(1, int(128 * scale)), int(512 * scale))] * 12
    return [Step("14 whole prompts of 32-256 tokens", prompts), Step("12 chunks of 128 after a 512 prefix", prefix)]


def inputs(step: Step, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A paged cache with every sequence's blocks scattered, and the step's queries."""
    generator = torch.Generator().manual_seed(0)
    blocks = [(n + c + BLOCK - 1) // BLOCK for n, c in step.chunks]
    k_cache = torch.randn(sum(blocks), BLOCK, KV_HEADS, DIM, generator=generator).to(dtype)
    v_cache = torch.randn(sum(blocks), BLOCK, KV_HEADS, DIM, generator=generator).to(dtype)
    order = torch.randperm(sum(blocks), generator=generator)
    tables = torch.zeros(len(blocks), max(blocks), dtype=torch.int64)
    used = 0
    for b, count in enumerate(blocks):
        tables[b, :count] = order[used : used + count]
        used += count
    counts = torch.tensor([n for n, _ in step.chunks])
    return {
        "q": torch.randn(int(counts.sum()), HEADS, DIM, generator=generator).to(dtype),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "tables": tables,
        "seq_lens": torch.tensor([n + c for n, c in step.chunks]),
        "query_start_loc": torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]),
        "row_tables": tables.repeat_interleave(counts, dim=0).contiguous(),
        "row_lens": torch.cat([torch.arange(c + 1, c + n + 1) for n, c in step.chunks]),
    }


def causal_flops(step: Step) -> float:
    """Q.K and P.V multiply-adds of every query head over the positions it sees."""
    return sum(HEADS * DIM * 4 * n * (2 * c + n + 1) / 2 for n, c in step.chunks)


def best_seconds(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def measure(kernels: ModuleType, step: Step, dtype: torch.dtype, repeats: int) -> dict[str, float]:
    x = inputs(step, dtype)
    scale = DIM**-0.5
    per_token = best_seconds(
        lambda: kernels.paged_decode(x["q"], x["k_cache"], x["v_cache"], x["row_tables"], x["row_lens"], scale),
        repeats,
    )
    tiled = best_seconds(
        lambda: kernels.paged_prefill(
            x["q"], x["k_cache"], x["v_cache"], x["tables"], x["seq_lens"], x["query_start_loc"], scale
        ),
        repeats,
    )
    return {"per_token_s": per_token, "tiled_s": tiled, "flops": causal_flops(step)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the steps (tests)")
    args = parser.parse_args(argv)
    from services.engine.cpu_kernels import load

    kernels = load()
    if kernels is None:
        raise SystemExit("the CPU kernels could not be built here")
    torch.set_num_threads(args.threads)
    print(f"threads: {args.threads}\n")
    print("| step | dtype | paged_decode per token, ms | paged_prefill, ms | GFLOP/s (before -> after) | speed-up |")
    print("| --- | --- | --- | --- | --- | --- |")
    for step in default_steps(args.scale):
        for dtype in (torch.bfloat16, torch.float32):
            r = measure(kernels, step, dtype, args.repeats)
            before, after = r["flops"] / r["per_token_s"] / 1e9, r["flops"] / r["tiled_s"] / 1e9
            print(
                f"| {step.name} | {str(dtype).removeprefix('torch.')} | {r['per_token_s'] * 1e3:.2f} | "
                f"{r['tiled_s'] * 1e3:.2f} | {before:.0f} -> {after:.0f} | {r['per_token_s'] / r['tiled_s']:.2f}x |"
            )


if __name__ == "__main__":
    main()
