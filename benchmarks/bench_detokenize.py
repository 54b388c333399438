"""CPU cost of detokenizing, in-process (docs/benchmarks.md, "tokenizers' DecodeStream"):

(a) `IncrementalDetokenizer.push` per token, one id per push, on its two paths taking turns:
    `tokenizers`' DecodeStream (what the tokenizer service runs) and the Python windows alone
    (the reference the fast path is tested against);
(b) the tokenizer service's whole `Detokenize` handler per token (`TokenizerServicer`, no gRPC):
    S sequences x T one-token steps at once, each sequence starting from a short prompt.

The text is this repository's docs/architecture.md plus some multi-byte characters, encoded with
the model's tokenizer (default: the default model's).

    python -m benchmarks.bench_detokenize [--model DIR] [--tokens 3000] [--rounds 4]
        [--sequences 256] [--steps 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from services.tokenizer.detokenizer import IncrementalDetokenizer
from services.tokenizer.service import TokenizerServicer
from services.tokenizer.text_tokenizer import TextTokenizer
from turnout.v1 import tokenizer_pb2

TEXT = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
# Characters byte-level BPE splits across tokens, so a push sometimes holds half of one back.
MULTIBYTE = " héllo wörld 日本語のテキスト 🎉🎉 done"
PROMPT_TOKENS = 8


def sample_ids(tokenizer: TextTokenizer, count: int) -> list[int]:
    """`count` ids of real text (repeated if the text is shorter)."""
    ids = tokenizer.encode(TEXT.read_text() + MULTIBYTE, add_special_tokens=False)
    while len(ids) < count + PROMPT_TOKENS:
        ids = ids + ids
    return ids[: count + PROMPT_TOKENS]


def push_us_per_token(tokenizer: TextTokenizer, ids: Sequence[int], *, decode_stream: bool) -> tuple[float, str]:
    """Seconds of CPU per pushed id, in µs, and the text (to check both paths agree)."""
    prompt, out = ids[:PROMPT_TOKENS], ids[PROMPT_TOKENS:]
    started = time.process_time()
    detokenizer = IncrementalDetokenizer(tokenizer.backend, prompt, decode_stream=decode_stream)
    text = "".join(detokenizer.push([token]) for token in out) + detokenizer.flush()
    return (time.process_time() - started) / len(out) * 1e6, text


async def _one_sequence(servicer: TokenizerServicer, key: int, ids: Sequence[int], steps: int) -> None:
    start = (key * steps) % max(1, len(ids) - steps - PROMPT_TOKENS)
    prompt, out = ids[start : start + PROMPT_TOKENS], ids[start + PROMPT_TOKENS : start + PROMPT_TOKENS + steps]

    async def requests() -> AsyncIterator[tokenizer_pb2.DetokenizeRequest]:
        yield tokenizer_pb2.DetokenizeRequest(
            start=tokenizer_pb2.DetokenizeStart(request_id=str(key), prompt_ids=prompt)
        )
        for i, token in enumerate(out):
            last = i == len(out) - 1
            yield tokenizer_pb2.DetokenizeRequest(tokens=tokenizer_pb2.DetokenizeTokens(token_ids=[token], last=last))

    async for _ in servicer.Detokenize(requests(), None):  # type: ignore[arg-type]  # no context: never aborted
        pass


async def handler_us_per_token(servicer: TokenizerServicer, ids: Sequence[int], sequences: int, steps: int) -> float:
    """CPU µs per token of the Detokenize handler, `sequences` streams of `steps` one-token steps together."""
    started = time.process_time()
    await asyncio.gather(*(_one_sequence(servicer, key, ids, steps) for key in range(sequences)))
    return (time.process_time() - started) / (sequences * steps) * 1e6


def _spread(values: list[float]) -> str:
    return f"min {min(values):6.2f}  median {statistics.median(values):6.2f}  max {max(values):6.2f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a model folder (default: the default model)")
    parser.add_argument("--tokens", type=int, default=3000, help="ids pushed per round in (a)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each measurement")
    parser.add_argument("--sequences", type=int, default=256, help="sequences at once in (b)")
    parser.add_argument("--steps", type=int, default=64, help="one-token steps per sequence in (b)")
    args = parser.parse_args(argv)
    for name in ("tokens", "rounds", "sequences", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.model is None:
        from turnout.default_model import prepare_default_model

        args.model = prepare_default_model()
    tokenizer = TextTokenizer(args.model)
    ids = sample_ids(tokenizer, max(args.tokens, args.steps * 4))

    print(f"(a) IncrementalDetokenizer.push, one id per push, {args.tokens} ids, µs of CPU per token")
    times: dict[bool, list[float]] = {True: [], False: []}
    texts: dict[bool, str] = {}
    pushed = ids[: args.tokens + PROMPT_TOKENS]
    for _ in range(args.rounds):
        for decode_stream in (False, True):  # taking turns: the machine's drift lands on both
            spent, texts[decode_stream] = push_us_per_token(tokenizer, pushed, decode_stream=decode_stream)
            times[decode_stream].append(spent)
    print(f"  Python windows      {_spread(times[False])}")
    print(f"  DecodeStream        {_spread(times[True])}")
    if texts[True] != texts[False]:
        raise SystemExit("the two paths gave different text: a bug, not a measurement")

    servicer = TokenizerServicer(tokenizer)
    spent_handler = [
        asyncio.run(handler_us_per_token(servicer, ids, args.sequences, args.steps)) for _ in range(args.rounds)
    ]
    print(f"(b) Detokenize handler, {args.sequences} sequences x {args.steps} one-token steps, µs of CPU per token")
    print(f"  handler             {_spread(spent_handler)}")


if __name__ == "__main__":
    main()
