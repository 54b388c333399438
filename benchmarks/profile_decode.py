"""Where a decode step's time goes: N requests prefilled, then a few decode steps under torch.profiler,
then the cost of a step that also carries a new prompt's prefill chunk (mixed batch).

python -m benchmarks.profile_decode [--model PATH] [--requests 64]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_engine import engine_requests, make_prompts
from services.engine.config import EngineConfig
from services.engine.llm_engine import LLMEngine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if args.model is None:
        from turnout.default_model import prepare_default_model

        args.model = prepare_default_model()
    # A 256-token budget: a mixed step is the running decodes plus one ~190-token prefill chunk.
    engine = LLMEngine(
        EngineConfig(model=args.model, max_running_requests=args.requests + 4, max_num_batched_tokens=256)
    )
    prompts = make_prompts(args.requests, 32, 256, seed=0, vocab=engine.loaded.vocab_size)
    for request in engine_requests(engine, prompts, 400, "x"):
        engine.add_request(request)
    start = time.perf_counter()
    while engine.scheduler.waiting or any(
        s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running
    ):
        engine.step()
    print(f"prefill: {time.perf_counter() - start:.1f} s")
    for _ in range(3):  # warm up
        engine.step()
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    print(f"decode step: {1000 * (time.perf_counter() - start) / args.steps:.0f} ms")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            engine.step()
    print(f"per-step totals over {args.steps} steps:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))

    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    decode_ms = 1000 * (time.perf_counter() - start) / args.steps
    long_prompts = make_prompts(4, 800, 800, seed=1, vocab=engine.loaded.vocab_size)
    for request in engine_requests(engine, long_prompts, 4, "y"):
        engine.add_request(request)
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    mixed_ms = 1000 * (time.perf_counter() - start) / args.steps
    print(f"decode-only step {decode_ms:.0f} ms; mixed step (+ prefill chunk) {mixed_ms:.0f} ms", end="")
    print(f" = {mixed_ms / decode_ms:.2f}x")


if __name__ == "__main__":
    main()
