"""A refusal from any stage ends the request with that refusal's status, every time.

The tokenizer refuses a Detokenize start (a bad stop regex, tool_choice auto without
a parser) by ending the stream; the router used to write the first tokens before
reading its answer, so about half the time the write hit the finished stream and the
caller saw INTERNAL ("RPC already finished", "Internal error from Core") instead.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc import aio

from tests.router.conftest import FakeTokenizer
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2, inference_pb2

REPEATS = 200


class RefusingTokenizer(FakeTokenizer):
    """Refuses every Detokenize start as soon as it reads it, as the real tokenizer refuses a bad one."""

    async def Detokenize(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        self.streams += 1
        async for _ in request_iterator:
            raise InvalidArgument("stop_regex '(' is not a valid regular expression")
        yield  # an async generator, like the real servicer


async def _outcomes(stub: Any, request: inference_pb2.GenerateRequest) -> Counter[str]:
    async def one() -> str:
        try:
            async for _ in stub.Generate(request):
                pass
        except aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return "OK"

    outcomes: Counter[str] = Counter()
    # A few at a time: concurrency makes the race likelier, as under real load.
    for _ in range(REPEATS // 10):
        outcomes.update(await asyncio.gather(*(one() for _ in range(10))))
    return outcomes


async def _all_cancelled(engine: Any) -> None:
    """Every call the engine received ends cancelled (the router's cancel reaches it in a moment)."""
    deadline = asyncio.get_running_loop().time() + 60
    while engine.cancelled < len(engine.received) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert engine.cancelled == len(engine.received)


async def test_a_refused_detokenize_start_is_the_outcome_200_of_200(make_cluster: Callable[..., Any]) -> None:
    cluster = await make_cluster(1, tokenizer_servicer=RefusingTokenizer())
    engine = cluster.engines[0]
    engine.hold = asyncio.Event()  # never set: the engine's streams end only when the router cancels them
    request = inference_pb2.GenerateRequest(text="hello", sampling_params=common_pb2.SamplingParams(max_new_tokens=2))
    outcomes = await _outcomes(cluster.inference, request)
    assert outcomes == Counter({"INVALID_ARGUMENT: stop_regex '(' is not a valid regular expression": REPEATS})
    # The engine starts while the tokenizer checks the start; the refusal ends its call.
    await _all_cancelled(engine)


async def test_a_refusal_ends_the_engine_call_at_once_not_after_the_prefill(make_cluster: Callable[..., Any]) -> None:
    cluster = await make_cluster(1, tokenizer_servicer=RefusingTokenizer())
    engine = cluster.engines[0]
    engine.token_delay_s = 600  # a prefill that would outlast the test
    request = inference_pb2.GenerateRequest(text="hello", sampling_params=common_pb2.SamplingParams(max_new_tokens=2))
    outcome = await asyncio.wait_for(_outcomes(cluster.inference, request), timeout=120)
    assert outcome == Counter({"INVALID_ARGUMENT: stop_regex '(' is not a valid regular expression": REPEATS})
    await _all_cancelled(engine)


async def test_the_tokenizers_refusal_wins_over_the_engines(make_cluster: Callable[..., Any]) -> None:
    # Both refuse; the engine, asked at the same time, may answer first. The outcome is the tokenizer's,
    # every time, as when the engine was asked only after the tokenizer had accepted the start.
    cluster = await make_cluster(1, tokenizer_servicer=RefusingTokenizer())
    cluster.engines[0].fail = grpc.StatusCode.INVALID_ARGUMENT
    request = inference_pb2.GenerateRequest(text="hello", sampling_params=common_pb2.SamplingParams(max_new_tokens=2))
    outcomes = await _outcomes(cluster.inference, request)
    assert outcomes == Counter({"INVALID_ARGUMENT: stop_regex '(' is not a valid regular expression": REPEATS})


async def test_an_engine_refusal_while_the_detokenize_stream_is_open_is_the_outcome(
    make_cluster: Callable[..., Any],
) -> None:
    cluster = await make_cluster(1)
    cluster.engines[0].fail = grpc.StatusCode.INVALID_ARGUMENT
    request = inference_pb2.GenerateRequest(text="hello", sampling_params=common_pb2.SamplingParams(max_new_tokens=2))
    outcomes = await _outcomes(cluster.inference, request)
    assert outcomes == Counter({"INVALID_ARGUMENT: engine0 fails on purpose": REPEATS})


async def test_concurrent_requests_with_the_same_id_both_run_under_unique_engine_ids(
    make_cluster: Callable[..., Any],
) -> None:
    cluster = await make_cluster(1)
    engine = cluster.engines[0]
    engine.hold = asyncio.Event()  # both streams stay open at once
    request = inference_pb2.GenerateRequest(
        text="hello", request_id="same", sampling_params=common_pb2.SamplingParams(max_new_tokens=2)
    )

    async def run() -> list[inference_pb2.GenerateResponse]:
        return [r async for r in cluster.inference.Generate(request)]

    both = asyncio.gather(run(), run())
    while engine.active < 2:
        await asyncio.sleep(0.01)
    engine.hold.set()
    first, second = await both
    assert [r.WhichOneof("kind") for r in first] == [r.WhichOneof("kind") for r in second]
    ids = [r.request_id for r in engine.received]
    assert len(set(ids)) == 2 and all(i.startswith("same-") for i in ids)
    assert [r.external_request_id for r in engine.received] == ["same", "same"]
