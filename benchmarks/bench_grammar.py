"""Per-step cost of grammar masking: decode steps with N running JSON-schema-constrained requests
vs N unconstrained ones (default model, greedy, the same prompts), and the mask's own cost
(bitmask fill for the N matchers, and its application to the (N, V) logits) measured alone.

The schema asks for an array of at least 64 integers, so no constrained request can finish
while it is measured; the unconstrained ones run with ignore_eos. Only steps with all N running
in decode are timed.

    python -m benchmarks.bench_grammar [--requests 32] [--steps 20] [--model PATH] [--threads 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from services.engine.config import EngineConfig
from services.engine.grammar.bitmask import GrammarMask
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import load_model
from services.engine.request import EngineRequest
from services.engine.sampling_validation import resolve
from turnout.default_model import prepare_default_model
from turnout.v1 import common_pb2

SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9999}, "minItems": 64}


def decode_ms(engine: LLMEngine, prompts: list[list[int]], params: common_pb2.SamplingParams, steps: int) -> float:
    """Median ms per decode step with every request running."""
    for i, prompt in enumerate(prompts):
        settings = resolve(params, common_pb2.SamplingParams(), engine.limits(len(prompt)))
        grammar = engine.grammars.compile(settings.constraint) if settings.constraint is not None else None
        engine.add_request(EngineRequest(f"r{i}", tuple(prompt), settings, grammar))
    while any(seq.num_output_tokens == 0 for seq in engine.scheduler.running + engine.scheduler.waiting):
        engine.step()  # prefill
    times = []
    for _ in range(steps + 2):
        assert len(engine.scheduler.running) == len(prompts), "a request finished or was preempted while measured"
        start = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times[2:])


def mask_ms(engine: LLMEngine, reps: int) -> tuple[float, float]:
    """Median ms to fill the running requests' bitmask, and to apply it to (N, V) logits."""
    states = [seq.grammar for seq in engine.scheduler.running]
    mask = GrammarMask(states)
    logits = torch.randn(len(states), engine.loaded.vocab_size, device=engine.loaded.device)
    fills, applies = [], []
    for _ in range(reps):
        start = time.perf_counter()
        bitmask = mask.fill(len(states), logits.shape[-1])
        fills.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        mask.apply(logits, bitmask)
        if logits.is_cuda:
            torch.cuda.synchronize()
        applies.append((time.perf_counter() - start) * 1000)
    return statistics.median(fills), statistics.median(applies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model or prepare_default_model()
    config = EngineConfig(model=model, num_kv_blocks=1024)
    loaded = load_model(config)
    prompts = [[1, 504, 3575, 282, 4649, 314, 100 + i, 28, 253, 1342] for i in range(args.requests)]
    plain = common_pb2.SamplingParams(max_new_tokens=512, temperature=0.0, ignore_eos=True)
    schema = common_pb2.SamplingParams(max_new_tokens=512, temperature=0.0, json_schema=json.dumps(SCHEMA))
    # Two alternating rounds on fresh engines; the faster of each kind counts (the machine is shared).
    plain_ms = grammar_ms = float("inf")
    for _ in range(2):
        plain_ms = min(plain_ms, decode_ms(LLMEngine(config, loaded), prompts, plain, args.steps))
        constrained = LLMEngine(config, loaded)
        grammar_ms = min(grammar_ms, decode_ms(constrained, prompts, schema, args.steps))
    fill, apply = mask_ms(constrained, 50)
    device = loaded.device.type
    print(f"model {model.name}, {device}, {torch.get_num_threads()} threads, {args.requests} running, decode steps")
    print("| measurement | ms |")
    print("| --- | --- |")
    print(f"| decode step, {args.requests} unconstrained (greedy) | {plain_ms:.1f} |")
    print(f"| decode step, {args.requests} JSON-schema constrained (greedy) | {grammar_ms:.1f} |")
    print(f"| ratio constrained / unconstrained | {grammar_ms / plain_ms:.2f}x |")
    print(f"| bitmask fill, {args.requests} matchers | {fill:.2f} |")
    print(f"| bitmask apply to ({args.requests}, {loaded.vocab_size}) logits | {apply:.2f} |")


if __name__ == "__main__":
    main()
