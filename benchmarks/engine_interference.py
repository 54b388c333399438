"""What another process's work does to one decode stream on the engine's cores (docs/benchmarks.md, "The
ceiling after the two changes above"): the engine's decode in-process, one stream, timed alone and while
a second process spins for `--burn-us` at random intervals around `--period-us` (the other services'
work per token, arriving at random moments of the step), the two taking turns.

    python -m benchmarks.engine_interference [--model DIR] [--tokens 64] [--rounds 6]
        [--burn-us 300] [--period-us 3000]

On two cores a spinner that takes ~9% of one core slowed the default model's decode by a fifth: the
engine's OpenMP threads meet at the end of every op, so one that loses its core holds the other.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import time
from collections.abc import Sequence
from multiprocessing.synchronize import Event
from pathlib import Path

from services.engine.llm import LLM
from turnout.default_model import default_model_dir

PROMPT = "The history of the city of Paris begins"


def spin(burn_us: int, period_us: int, started: Event, stop: Event) -> None:
    """Sleep a random 0.5-1.5x `period_us`, then keep a core busy for `burn_us`, until `stop`."""
    rng = random.Random()
    started.set()
    while not stop.is_set():
        time.sleep(rng.uniform(0.5, 1.5) * period_us * 1e-6)
        end = time.perf_counter() + burn_us * 1e-6
        while time.perf_counter() < end:
            pass


def ms_per_token(llm: LLM, tokens: int, rounds: int) -> list[float]:
    params = {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        llm.generate([PROMPT], params)
        times.append((time.perf_counter() - started) / tokens * 1e3)
    return times


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: the default model)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6, help="requests per measurement")
    parser.add_argument("--turns", type=int, default=2, help="measurements of each, taking turns")
    parser.add_argument("--burn-us", type=int, default=300)
    parser.add_argument("--period-us", type=int, default=3000)
    args = parser.parse_args(argv)
    llm = LLM(args.model or default_model_dir())
    ms_per_token(llm, args.tokens, 1)  # warm-up
    print(f"| one stream, {args.tokens} tokens | ms per token, median of {args.rounds} requests |")
    print("| --- | --- |")
    for _ in range(args.turns):
        print(f"| alone | {statistics.median(ms_per_token(llm, args.tokens, args.rounds)):.2f} |")
        # Forked: the child runs only `spin` (no torch), and starts at once instead of importing this module.
        context = multiprocessing.get_context("fork")
        started, stop = context.Event(), context.Event()
        spinner = context.Process(target=spin, args=(args.burn_us, args.period_us, started, stop))
        spinner.start()
        started.wait()
        try:
            median = statistics.median(ms_per_token(llm, args.tokens, args.rounds))
        finally:
            stop.set()
            spinner.join()
        print(f"| another process spinning {args.burn_us} µs every ~{args.period_us} µs | {median:.2f} |")


if __name__ == "__main__":
    main()
