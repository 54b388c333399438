"""CPU cost of the gateway's streaming path per token, in-process (docs/benchmarks.md, "The gateway's
events per token"): the router's batched messages → `Generation` → the OpenAI chunks → SSE frames,
with no HTTP and no gRPC (the messages are parsed before the clock starts, as gRPC hands them over).

One sample of `--tokens` one-token chunks (4 characters each), `--per-message` responses per router
message (the router batches what is ready: 1 is a stream that keeps up, more one that lags), read to the
end `--rounds` times; the thread's CPU time per token, best of `--repeats`.

    python -m benchmarks.bench_gateway_events [--api completions|chat] [--tokens 256]
        [--per-message 1 8] [--rounds 200] [--repeats 3] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import time
from collections.abc import Sequence

from gateway import sse
from gateway.generation import Generation
from gateway.openai_format import Head, View, chat_chunks, completion_chunks
from turnout.v1 import inference_pb2

APIS = {"completions": completion_chunks, "chat": chat_chunks}


class _Replay:
    """A carried Generate call that has received `messages` already."""

    def __init__(self, messages: Sequence[inference_pb2.GenerateResponse]) -> None:
        self._messages = list(messages)

    async def read(self) -> inference_pb2.GenerateResponse | None:
        return self._messages.pop(0) if self._messages else None

    def has_ready(self) -> bool:
        return False  # each message arrives as it is read: the writes of a stream that keeps up

    def cancel(self) -> None:
        pass


def router_messages(tokens: int, per_message: int) -> list[inference_pb2.GenerateResponse]:
    """A first response, then `tokens` chunks and the sample's end, `per_message` responses a message."""
    first = inference_pb2.GenerateResponse()
    first.chunk.prompt_tokens = 64
    responses = []
    for i in range(tokens):
        response = inference_pb2.GenerateResponse()
        chunk = response.chunk
        chunk.text, chunk.prompt_tokens, chunk.completion_tokens = " tok", 64, i + 1
        chunk.token_ids.append(1000 + i)
        chunk.last = i == tokens - 1
        responses.append(response)
    end = inference_pb2.GenerateResponse()
    end.complete.finish_reason.length.SetInParent()
    responses.append(end)
    messages = [first]
    for k in range(0, len(responses), per_message):
        message, *batch = responses[k : k + per_message]
        message.batch.extend(batch)
        messages.append(message)
    # Parsed from the wire, as the gateway gets them.
    return [inference_pb2.GenerateResponse.FromString(m.SerializeToString()) for m in messages]


async def stream(api: str, messages: list[inference_pb2.GenerateResponse]) -> list[bytes]:
    """The socket writes of one SSE response."""
    generation = Generation([_Replay(messages[1:])], [messages[0]], [1], time.monotonic())
    chunks = APIS[api](Head(id="cmpl-1", created=1, model="model"), View(), generation, False)
    return [data async for data in sse.frames(chunks, generation.ready)]


async def cpu_per_token(api: str, tokens: int, per_message: int, rounds: int, profile: bool) -> float:
    await stream(api, router_messages(tokens, per_message))
    inputs = [router_messages(tokens, per_message) for _ in range(rounds)]
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    started = time.thread_time()
    for messages in inputs:
        await stream(api, messages)
    elapsed = time.thread_time() - started
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    return elapsed / (rounds * tokens)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=sorted(APIS), default="completions")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--per-message", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile one repeat (slower; for where, not how much)")
    args = parser.parse_args(argv)
    print(f"| {args.api}: responses per router message | CPU µs per token (best of {args.repeats}) |")
    print("| --- | --- |")
    for per_message in args.per_message:
        best = min(
            asyncio.run(cpu_per_token(args.api, args.tokens, per_message, args.rounds, args.profile and r == 0))
            for r in range(args.repeats)
        )
        print(f"| {per_message} | {best * 1e6:.2f} |")


if __name__ == "__main__":
    main()
