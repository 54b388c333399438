"""Where a decode step's time goes: N requests prefilled, then decode steps timed and profiled.

For each batch size in `--requests` (default: the issue's 16-way step and the batch-1 step):
the step's wall time, then torch.profiler over `--steps` steps split into time inside torch ops
(top-level ops: what kernels and their dispatch cost) and time outside them (Python: scheduler,
batch building, sampler glue, per-layer bookkeeping), and the top ops by self time.
`--mixed` also measures a step that carries a new prompt's prefill chunk among the decodes.

    python -m benchmarks.profile_decode [--model PATH] [--requests 16,1] [--dtype float32] [--mixed]

For a sampling profile of the same steps (Python lines, no profiler overhead):

    python -m benchmarks.profile_decode --py-spy [--requests 16]

runs this script again under `py-spy record` (installed into the peers' cache venv when missing)
and prints the functions where most samples land.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_engine import engine_requests, make_prompts
from benchmarks.py_spy import py_spy
from services.engine.config import EngineConfig
from services.engine.llm_engine import LLMEngine


def prefilled_engine(
    model: Path, requests: int, dtype: str, prompt_len: tuple[int, int], attention_backend: str = "auto"
) -> LLMEngine:
    """An engine with `requests` requests whose prompts are all computed: every next step decodes."""
    # A 256-token budget: a mixed step is the running decodes plus one ~190-token prefill chunk.
    config = EngineConfig(
        model=model,
        dtype=dtype,
        attention_backend=attention_backend,
        max_running_requests=requests + 4,
        max_num_batched_tokens=256,
    )
    engine = LLMEngine(config)
    prompts = make_prompts(requests, *prompt_len, seed=0, vocab=engine.loaded.vocab_size)
    for request in engine_requests(engine, prompts, 400, "x"):
        engine.add_request(request)
    while engine.scheduler.waiting or any(
        s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running
    ):
        engine.step()
    return engine


def timed_steps_ms(engine: LLMEngine, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return 1000 * (time.perf_counter() - start) / steps


def sampled_steps(engine: LLMEngine, steps: int) -> None:
    """The steps py-spy's samples are kept from (found by this function's name in their stacks)."""
    for _ in range(steps):
        engine.step()


def profile_steps(engine: LLMEngine, steps: int, top: int) -> None:
    """Per-step split of torch.profiler's view: inside top-level torch ops vs outside them."""
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    wall_us = 1e6 * (time.perf_counter() - start)
    # Top-level ops only (no enclosing op), so nested ops (linear -> addmm) are counted once.
    inside_us = sum(e.cpu_time_total for e in prof.events() if e.cpu_parent is None)
    print(f"  profiled: {wall_us / 1000 / steps:.1f} ms/step (profiler overhead included)")
    print(f"  inside torch ops: {inside_us / 1000 / steps:.1f} ms/step = {100 * inside_us / wall_us:.0f}%")
    outside_us = wall_us - inside_us
    print(f"  outside (Python): {outside_us / 1000 / steps:.1f} ms/step = {100 * outside_us / wall_us:.0f}%")
    total_self = sum(e.self_cpu_time_total for e in prof.key_averages())
    print(f"  top ops by self time (share of all op self time, {total_self / 1000 / steps:.1f} ms/step):")
    for event in sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]:
        share = 100 * event.self_cpu_time_total / total_self
        per_step = event.self_cpu_time_total / 1000 / steps
        print(f"    {event.key:<50} {per_step:8.2f} ms/step {share:5.1f}%  calls/step {event.count / steps:.0f}")


def measure(args: argparse.Namespace, requests: int) -> None:
    prompt_len = (32, 256) if requests > 1 else (128, 128)
    engine = prefilled_engine(args.model, requests, args.dtype, prompt_len, args.attention_backend)
    timed_steps_ms(engine, 3)  # warm up
    step_ms = timed_steps_ms(engine, args.steps)
    rate = requests * 1000 / step_ms
    what = f"{requests}-way decode step, {args.dtype}, {args.attention_backend} attention"
    print(f"{what}: {step_ms:.1f} ms ({rate:.0f} tok/s)")
    if args.no_torch_profiler:
        sampled_steps(engine, args.steps * 4)
        return
    profile_steps(engine, args.steps, args.top)
    if args.mixed:
        decode_ms = timed_steps_ms(engine, args.steps)
        long_prompts = make_prompts(4, 800, 800, seed=1, vocab=engine.loaded.vocab_size)
        for request in engine_requests(engine, long_prompts, 4, "y"):
            engine.add_request(request)
        mixed_ms = timed_steps_ms(engine, args.steps)
        print(f"  decode-only step {decode_ms:.0f} ms; mixed step (+ prefill chunk) {mixed_ms:.0f} ms", end="")
        print(f" = {mixed_ms / decode_ms:.2f}x")


def run_py_spy(args: argparse.Namespace, argv: list[str]) -> None:
    """This script again under `py-spy record`, then where the samples landed (leaf Python frames)."""
    child = [a for a in argv if a != "--py-spy"] + ["--no-torch-profiler"]
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "stacks.txt"
        record = [str(py_spy()), "record", "--format", "raw", "--rate", "100", "--output", str(raw), "--"]
        subprocess.run([*record, sys.executable, "-m", "benchmarks.profile_decode", *child], check=True)
        leaves: collections.Counter[str] = collections.Counter()
        for line in raw.read_text().splitlines():
            stack, _, samples = line.rpartition(" ")
            if "sampled_steps" in stack:
                leaves[stack.split(";")[-1]] += int(samples)
    total = sum(leaves.values())
    print(f"py-spy: {total} samples of decode steps (all batch sizes); top leaf Python frames:")
    for frame, count in leaves.most_common(args.top):
        print(f"  {100 * count / total:5.1f}%  {frame}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--requests", default="16,1", help="comma-separated decode batch sizes")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--attention-backend", default="auto", help="as the engine's flag (auto: cpu kernel)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=12, help="rows of the op / frame tables")
    parser.add_argument("--mixed", action="store_true", help="also time a decode step carrying a prefill chunk")
    parser.add_argument("--py-spy", action="store_true", help="sample with py-spy instead of torch.profiler")
    parser.add_argument("--no-torch-profiler", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.py_spy:
        run_py_spy(args, argv)
        return
    if args.model is None:
        from turnout.default_model import prepare_default_model

        args.model = prepare_default_model()
    for batch in args.requests.split(","):
        measure(args, int(batch))


if __name__ == "__main__":
    main()
