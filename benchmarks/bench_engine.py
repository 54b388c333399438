"""Engine benchmarks on this machine (CPU or GPU), all measured in one run so ratios compare:

1. throughput: N requests (random prompt lengths, fixed output length, ignore_eos, greedy)
   through our engine vs Hugging Face `transformers.generate` in static batches;
2. shared prefix: requests sharing a long prefix, prefix caching on vs off;
3. scheduler overhead: time per step outside the model forward, at a given number of
   running requests;
4. sampling: the throughput workload with every sampler on (and logprobs) vs greedy;
5. LoRA: the throughput workload spread over 4 adapters (seeded random, rank 8, every projection,
   made with `peft`) vs the base model alone.

    python -m benchmarks.bench_engine [--model PATH] [--requests 64] [--output-len 128]

Prints a Markdown table (the format of docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from benchmarks.hf_baseline import generate_batch
from services.engine.config import EngineConfig
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import LoadedModel, load_model
from services.engine.model_runner import Batch, StepLogits
from services.engine.request import EngineRequest
from services.engine.sampling_validation import Limits, resolve
from turnout.gc_heap import frozen_heap
from turnout.v1 import common_pb2


def make_prompts(
    count: int, low: int, high: int, seed: int, vocab: int, prefix: list[int] | None = None
) -> list[list[int]]:
    rng = random.Random(seed)
    return [(prefix or []) + [rng.randrange(3, vocab) for _ in range(rng.randint(low, high))] for _ in range(count)]


# Every sampler of docs/sampling.md on at once (dynamic temperature stands in for temperature), with
# logprobs: the heaviest per-step sampling work a request can ask for.
ALL_SAMPLERS = {
    "top_p": 0.9,
    "top_k": 50,
    "min_p": 0.02,
    "frequency_penalty": 0.3,
    "presence_penalty": 0.3,
    "repetition_penalty": 1.1,
    "logit_bias": {5: 1.0, 6: -1.0},
    "typical_p": 0.95,
    "tfs": 0.95,
    "top_a": 0.05,
    "eta_cutoff": 3.0,
    "epsilon_cutoff": 3.0,
    "smoothing_factor": 0.3,
    "dynatemp_min": 0.5,
    "dynatemp_max": 1.2,
    "xtc_threshold": 0.1,
    "xtc_probability": 0.5,
    "dry_multiplier": 0.8,
    "no_repeat_ngram_size": 4,
    "nsigma": 2.0,
    "seed": 0,
}


def engine_requests(
    engine: LLMEngine,
    prompts: list[list[int]],
    output_len: int,
    tag: str,
    sampling: dict[str, object] | None = None,
    logprobs: common_pb2.LogprobOptions | None = None,
) -> list[EngineRequest]:
    info = engine.loaded.info
    requests = []
    for i, p in enumerate(prompts):
        fields = {"temperature": 0.0, **(sampling or {}), "max_new_tokens": output_len, "ignore_eos": True}
        if "seed" in fields:
            fields["seed"] = i  # one seed per request, so requests differ but repeat across runs
        params = common_pb2.SamplingParams(**fields)  # type: ignore[arg-type]
        limits = Limits(len(p), info.max_context_length, info.vocab_size)
        requests.append(
            EngineRequest(f"{tag}{i}", tuple(p), resolve(params, info.generation_defaults, limits, logprobs))
        )
    return requests


def run_engine(engine: LLMEngine, requests: list[EngineRequest]) -> tuple[float, int, list[tuple[float, float, int]]]:
    """Seconds, generated tokens, and per step (total s, forward s, running sequences)."""
    forward_time = 0.0
    original: Callable[[Batch], StepLogits] = engine.runner.run

    def timed(batch: Batch) -> StepLogits:
        nonlocal forward_time
        start = time.perf_counter()
        logits = original(batch)
        if logits.sample.is_cuda:
            torch.cuda.synchronize()
        forward_time += time.perf_counter() - start
        return logits

    engine.runner.run = timed  # type: ignore[method-assign]
    steps: list[tuple[float, float, int]] = []
    generated = 0
    with frozen_heap():  # as the engine service runs (turnout/gc_heap.py)
        for request in requests:
            engine.add_request(request)
        start = time.perf_counter()
        while engine.has_work():
            forward_time = 0.0
            step_start = time.perf_counter()
            running = len(engine.scheduler.running)
            outputs = engine.step()
            steps.append((time.perf_counter() - step_start, forward_time, running))
            generated += sum(len(o.output.token_ids) for o in outputs)
        seconds = time.perf_counter() - start
    engine.runner.run = original  # type: ignore[method-assign,assignment]
    return seconds, generated, steps


def run_transformers(
    model_dir: Path,
    prompts: list[list[int]],
    output_len: int,
    batch_size: int,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[float, int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    torch.nn.Module.to(model, device).eval()  # transformers' own `to` stub confuses mypy
    generate_batch(model, prompts[:2], 4)  # warm-up, untimed (as the engine's in main())
    generated = 0
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        generated += generate_batch(model, prompts[i : i + batch_size], output_len).output_tokens
    return time.perf_counter() - start, generated


def run_transformers_apart(
    model_dir: Path,
    prompts: list[list[int]],
    output_len: int,
    batch_size: int,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[float, int]:
    """run_transformers in a fresh process: the baseline as its users run it, not under the
    process-wide settings this process took for the engine (services/engine/malloc_tuning.py: its
    batch-64 run went 206.8 tok/s in the engine's process, 184.1 in its own, runs minutes apart)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_transformers, model_dir, prompts, output_len, batch_size, device, dtype).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(32, 256))
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--hf-batch-sizes", type=int, nargs="+", default=[16, 64], help="static batch sizes tried")
    parser.add_argument("--prefix-requests", type=int, default=32)
    parser.add_argument("--prefix-len", type=int, default=512)
    parser.add_argument("--overhead-running", type=int, default=32)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--only-samplers", action="store_true", help="run only the sampler comparison (4.)")
    parser.add_argument("--only-lora", action="store_true", help="run only the LoRA comparison (5.)")
    args = parser.parse_args()

    if args.model is None:
        from turnout.default_model import prepare_default_model

        args.model = prepare_default_model()
    config = EngineConfig(model=args.model, max_running_requests=max(args.requests, args.overhead_running))
    loaded = load_model(config)
    vocab = loaded.vocab_size
    rows: list[tuple[str, str]] = [
        ("model", f"{args.model.name} ({loaded.info.dtype}, {loaded.device})"),
        ("threads", str(torch.get_num_threads())),
    ]

    low, high = args.prompt_len
    prompts = make_prompts(args.requests, low, high, seed=0, vocab=vocab)
    if args.only_samplers:
        rows += sampler_rows(config, loaded, prompts, args.output_len)
        print_table(rows)
        return
    if args.only_lora:
        rows += lora_rows(config, loaded, prompts, args.output_len)
        print_table(rows)
        return

    # 1. Throughput. A warm-up of other prompts first, untimed (first calls allocate the KV cache's
    # pages and start the thread pool: the first run of a fresh engine measured 8-15% slower than a
    # second one), its cached blocks dropped so the timed prompts find nothing of it.
    engine = LLMEngine(config, loaded)
    warm_up = make_prompts(8, low, high, seed=99, vocab=vocab)
    run_engine(engine, engine_requests(engine, warm_up, 16, "w"))
    engine.block_manager.reset_prefix_cache()
    ours_s, ours_tokens, _ = run_engine(engine, engine_requests(engine, prompts, args.output_len, "t"))
    ours_tps = ours_tokens / ours_s
    rows.append(
        (
            f"turnout: {args.requests} requests, prompts {args.prompt_len[0]}-{args.prompt_len[1]}, "
            f"{args.output_len} out",
            f"{ours_tokens} tokens in {ours_s:.1f} s = **{ours_tps:.1f} tok/s**",
        )
    )
    if not args.skip_transformers:
        best = 0.0
        for batch_size in args.hf_batch_sizes:
            hf_s, hf_tokens = run_transformers_apart(
                args.model, prompts, args.output_len, batch_size, loaded.device, loaded.dtype
            )
            best = max(best, hf_tokens / hf_s)
            rows.append(
                (
                    f"transformers.generate, static batches of {batch_size}",
                    f"{hf_tokens} tokens in {hf_s:.1f} s = **{hf_tokens / hf_s:.1f} tok/s**",
                )
            )
        rows.append(("throughput ratio turnout / best transformers", f"**{ours_tps / best:.2f}x**"))

    # 2. Shared prefix: prefix caching on vs off.
    prefix = make_prompts(1, args.prefix_len, args.prefix_len, seed=1, vocab=vocab)[0]
    shared = make_prompts(args.prefix_requests, 8, 24, seed=2, vocab=vocab, prefix=prefix)
    timings = {}
    for caching in (True, False):
        engine = LLMEngine(
            EngineConfig(model=args.model, enable_prefix_caching=caching, max_running_requests=args.prefix_requests),
            loaded,
        )
        timings[caching], _, _ = run_engine(engine, engine_requests(engine, shared, 16, "p"))
    rows.append(
        (
            f"shared prefix: {args.prefix_requests} requests, {args.prefix_len}-token prefix, 16 out",
            f"cache on {timings[True]:.1f} s, off {timings[False]:.1f} s = "
            f"**{timings[False] / timings[True]:.2f}x** faster",
        )
    )

    # 3. Scheduler overhead at N running decodes.
    engine = LLMEngine(EngineConfig(model=args.model, max_running_requests=args.overhead_running), loaded)
    overhead_prompts = make_prompts(args.overhead_running, 64, 64, seed=3, vocab=vocab)
    _, _, steps = run_engine(engine, engine_requests(engine, overhead_prompts, 32, "o"))
    decode = [(total, fwd) for total, fwd, running in steps if running == args.overhead_running]
    total = sum(t for t, _ in decode)
    outside = sum(t - f for t, f in decode)
    rows.append(
        (
            f"step time outside the forward, {args.overhead_running} running ({len(decode)} decode steps)",
            f"{1000 * outside / max(len(decode), 1):.1f} ms of {1000 * total / max(len(decode), 1):.1f} ms"
            f" = **{100 * outside / max(total, 1e-9):.1f}%**",
        )
    )

    # 4. The full sampler vs greedy on the throughput workload.
    rows += sampler_rows(config, loaded, prompts, args.output_len)
    # 5. Four LoRA adapters vs the base model.
    rows += lora_rows(config, loaded, prompts, args.output_len)
    print_table(rows)


def lora_rows(
    config: EngineConfig, loaded: LoadedModel, prompts: list[list[int]], output_len: int, adapters: int = 4
) -> list[tuple[str, str]]:
    """Throughput of the requests spread round-robin over `adapters` LoRA adapters (all on the device
    at once) vs the same requests on the base model, one run: each twice, alternating, the better
    of each kept (on a shared machine one run alone swings by 10-20%)."""
    import dataclasses
    import tempfile

    from tests.lora_adapters import build_lora_adapter

    with tempfile.TemporaryDirectory() as folder:
        paths = tuple(
            (f"a{i}", build_lora_adapter(config.model, Path(folder) / f"a{i}", seed=i, rank=8)) for i in range(adapters)
        )
        lora_config = dataclasses.replace(
            config, enable_lora=True, lora_modules=paths, max_loras=adapters, max_lora_rank=8
        )
        results = {"base": 0.0, "lora": 0.0}
        for name in ("base", "lora", "base", "lora"):
            engine = LLMEngine(lora_config if name == "lora" else config, loaded)
            requests = engine_requests(engine, prompts, output_len, "l")
            if name == "lora":
                requests = [dataclasses.replace(r, lora_name=f"a{i % adapters}") for i, r in enumerate(requests)]
            seconds, tokens, _ = run_engine(engine, requests)
            results[name] = max(results[name], tokens / seconds)
    ratio = results["lora"] / results["base"]
    return [
        (
            f"{adapters} LoRA adapters (rank 8, all projections) vs the base model, {len(prompts)} requests, "
            f"{output_len} out",
            f"{results['lora']:.1f} vs {results['base']:.1f} tok/s = **{ratio:.2f}x**",
        )
    ]


def sampler_rows(
    config: EngineConfig, loaded: LoadedModel, prompts: list[list[int]], output_len: int
) -> list[tuple[str, str]]:
    """Throughput with every sampler on (and top-5 logprobs) vs greedy, same requests, one run."""
    logprobs = common_pb2.LogprobOptions(return_logprob=True, top_logprobs_num=5)
    results = {}
    for name, sampling, options in (("greedy", None, None), ("all samplers", ALL_SAMPLERS, logprobs)):
        engine = LLMEngine(config, loaded)
        seconds, tokens, _ = run_engine(engine, engine_requests(engine, prompts, output_len, "s", sampling, options))
        results[name] = tokens / seconds
    ratio = results["all samplers"] / results["greedy"]
    return [
        (
            f"all samplers + top-5 logprobs vs greedy, {len(prompts)} requests, {output_len} out",
            f"{results['all samplers']:.1f} vs {results['greedy']:.1f} tok/s = **{ratio:.2f}x**",
        )
    ]


def print_table(rows: list[tuple[str, str]]) -> None:
    print("| measurement | result |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
