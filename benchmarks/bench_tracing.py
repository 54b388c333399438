"""What tracing costs: the same streams through a real `turnout serve` stack with tracing off
(the default) and on (`OTEL_TRACES_EXPORTER=console`, spans written to the stack's log).

Like bench_router's overhead rows: `--concurrency` streams at once (throughput, median time to
first token), then one stream at a time (median TTFT, where per-request costs are not hidden by
batching). Prompts are random token ids (each run its own: no prefix-cache hits), greedy,
ignore_eos. The two settings take turns, so drift on a shared machine hits both alike.

    python -m benchmarks.bench_tracing [--model PATH] [--concurrency 32] [--output-len 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_router import Run, Serve, make_prompts, sequential, through_gateway

SETTINGS = {"off": {}, "on": {"OTEL_TRACES_EXPORTER": "console"}}


def measure(args: argparse.Namespace, setting: str, round_: int) -> tuple[Run, Run]:
    saved = dict(os.environ)
    os.environ.pop("OTEL_TRACES_EXPORTER", None)
    os.environ.update(SETTINGS[setting])
    try:
        stack = Serve(args.model, 1, "cache_aware", args.log)  # the children inherit the environment
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        stack.wait_ready()
        asyncio.run(through_gateway(stack.url, make_prompts(8, args.prompt_len, seed=99), 8))
        seed = 100 * round_ + (0 if setting == "off" else 50)
        batch = asyncio.run(
            through_gateway(stack.url, make_prompts(args.concurrency, args.prompt_len, seed), args.output_len)
        )
        singles = make_prompts(args.single_requests, args.prompt_len, seed + 10)
        one = asyncio.run(sequential(lambda p: through_gateway(stack.url, p, args.single_output_len), singles))
    finally:
        stack.stop()
    return batch, one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--single-requests", type=int, default=20)
    parser.add_argument("--single-output-len", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs, alternating which goes first")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "turnout-bench-tracing.log")
    args = parser.parse_args()
    if args.model is None:
        from turnout.default_model import prepare_default_model

        args.model = prepare_default_model()
    print(f"model {args.model.name}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')} (stacks log to {args.log})")
    results: dict[str, list[tuple[Run, Run]]] = {"off": [], "on": []}
    for r in range(args.rounds):
        for setting in ("off", "on") if r % 2 == 0 else ("on", "off"):
            results[setting].append(measure(args, setting, r))
    print(f"\n| tracing | {args.concurrency} streams: throughput | median TTFT | 1 stream at a time: median TTFT |")
    print("| --- | --- | --- | --- |")
    for setting, runs in results.items():
        tp = statistics.median(b.throughput for b, _ in runs)
        ttft = statistics.median(b.median_ttft_ms for b, _ in runs)
        single = statistics.median(o.median_ttft_ms for _, o in runs)
        print(f"| {setting} | {tp:.1f} tok/s | {ttft:.0f} ms | {single:.1f} ms |", flush=True)


if __name__ == "__main__":
    main()
