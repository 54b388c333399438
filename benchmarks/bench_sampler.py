"""Cost of the batched sampler on this machine: ms per `sample()` call for N rows over a V-wide
vocabulary, (a) every row plain greedy (the single-argmax fast path), (b) every sampler on
(penalties, bias, DRY, n-gram and bad-word guards, bans, dynatemp, all truncation samplers,
XTC, logprobs), half the rows seeded, and (c) temperature + top-p alone, the common OpenAI-style
request, which needs a full sort of the vocabulary (no top-k to narrow it first).

    python -m benchmarks.bench_sampler [--rows 64] [--vocab 49152] [--history 512] [--iters 20] [--threads 0]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import torch

from services.engine.sampler import SamplerRow, sample
from services.engine.sampling_params import SamplingSettings

EVERYTHING = {
    "temperature": 0.8,
    "top_k": 200,
    "top_p": 0.95,
    "min_p": 0.02,
    "frequency_penalty": 0.3,
    "presence_penalty": 0.2,
    "repetition_penalty": 1.1,
    "typical_p": 0.95,
    "tfs": 0.98,
    "top_a": 0.1,
    "eta_cutoff": 3.0,
    "epsilon_cutoff": 3.0,
    "smoothing_factor": 0.3,
    "smoothing_curve": 1.5,
    "dynatemp_min": 0.5,
    "dynatemp_max": 1.5,
    "xtc_threshold": 0.1,
    "xtc_probability": 0.5,
    "dry_multiplier": 0.8,
    "no_repeat_ngram_size": 4,
    "nsigma": 2.0,
}


def make_rows(count: int, vocab: int, history: int, kind: str, seed: int) -> list[SamplerRow]:
    rng = random.Random(seed)
    rows = []
    greedy = kind == "greedy"
    for i in range(count):
        tokens = [rng.randrange(vocab) for _ in range(history)]
        if greedy:
            settings = SamplingSettings(max_new_tokens=1000, temperature=0.0)
        elif kind == "top_p":
            settings = SamplingSettings(max_new_tokens=1000, temperature=0.8, top_p=0.95)
        else:
            settings = SamplingSettings(
                max_new_tokens=1000,
                logit_bias=((1, 2.0), (2, -3.0)),
                bad_words_ids=((tokens[-1], 5), (7,)),
                dry_sequence_breaker_ids=frozenset({0}),
                allowed_token_ids=None if i % 4 else frozenset(range(0, vocab, 2)),
                **EVERYTHING,  # type: ignore[arg-type]
            )
        rows.append(
            SamplerRow(
                settings=settings,
                token_ids=tokens,
                num_prompt_tokens=history // 2,
                generator=torch.Generator().manual_seed(i) if i % 2 and not greedy else None,
                suppressed_ids=[3, 4] if kind == "everything" else [],
                want_logprobs=kind == "everything",
            )
        )
    return rows


def time_ms(call: Callable[[], object], iters: int) -> float:
    call()  # warm-up
    start = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - start) * 1000.0 / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--history", type=int, default=512, help="prompt + output tokens per row")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    logits = torch.randn(args.rows, args.vocab, device=args.device) * 3.0  # (N, V)
    print(
        f"sample(): N={args.rows}, V={args.vocab}, history={args.history}, device={args.device}, "
        f"threads={torch.get_num_threads()}"
    )
    for name, kind in (("all greedy", "greedy"), ("every sampler on", "everything"), ("top-p only", "top_p")):
        rows = make_rows(args.rows, args.vocab, args.history, kind, seed=1)
        ms = time_ms(lambda rows=rows: sample(logits, rows), args.iters)  # type: ignore[misc]
        print(f"  {name:<18} {ms:8.2f} ms/call")


if __name__ == "__main__":
    main()
