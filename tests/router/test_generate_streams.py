"""Inference.GenerateStream on the router's side: each carried stream runs the Generate handler and
ends with its call's status; refusals, cancel and draining. (The gateway's side, over gRPC, is in
tests/gateway/test_generate_carrier.py.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from services.router.generate_streams import GenerateStreams
from turnout.v1 import inference_pb2

WAIT_S = 60.0


async def _handler(
    request: inference_pb2.GenerateRequest, context: Any
) -> AsyncIterator[inference_pb2.GenerateResponse]:
    """Counts to the request's max_new_tokens, one chunk each; "slow" waits until cancelled."""
    if request.request_id == "refused":
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "the router is full")
    if request.request_id == "broken":
        raise RuntimeError("a bug")
    for i in range(request.sampling_params.max_new_tokens):
        yield inference_pb2.GenerateResponse(chunk=inference_pb2.GenerateChunk(token_ids=[i]))
    if request.request_id == "slow":
        await asyncio.sleep(3600)


class _Caller:
    """One GenerateStream call: commands in through a queue, every answer collected per stream."""

    def __init__(self, streams: GenerateStreams) -> None:
        self._messages: asyncio.Queue[inference_pb2.GenerateStreamRequest | None] = asyncio.Queue()
        self.by_stream: dict[int, list[inference_pb2.GenerateStreamAnswer]] = {}
        self.task = asyncio.create_task(self._run(streams))

    def send(self, *commands: inference_pb2.GenerateStreamCommand) -> None:
        self._messages.put_nowait(inference_pb2.GenerateStreamRequest(items=commands))

    def close(self) -> None:
        self._messages.put_nowait(None)

    async def ended(self, stream_id: int) -> Any:
        deadline = time.monotonic() + WAIT_S
        while not any(a.HasField("end") for a in self.by_stream.get(stream_id, [])):
            assert not self.task.done(), "the carrier ended first"
            assert time.monotonic() < deadline, f"stream {stream_id} did not end within {WAIT_S} s"
            await asyncio.sleep(0.01)
        return self.by_stream[stream_id][-1].end

    async def _requests(self) -> AsyncIterator[inference_pb2.GenerateStreamRequest]:
        while (message := await self._messages.get()) is not None:
            yield message

    async def _run(self, streams: GenerateStreams) -> None:
        async for message in streams.serve(self._requests(), None):
            for answer in message.items:
                self.by_stream.setdefault(answer.stream_id, []).append(answer)


def _generate(stream_id: int, request_id: str, tokens: int = 3) -> inference_pb2.GenerateStreamCommand:
    request = inference_pb2.GenerateRequest(request_id=request_id)
    request.sampling_params.max_new_tokens = tokens
    return inference_pb2.GenerateStreamCommand(stream_id=stream_id, generate=request)


async def test_each_stream_gets_its_handlers_responses_then_its_calls_status() -> None:
    caller = _Caller(GenerateStreams(_handler))
    caller.send(_generate(1, "a", 3), _generate(2, "refused"), _generate(3, "broken"), _generate(4, "b", 2))
    assert (await caller.ended(1)).code == 0
    assert [list(a.response.chunk.token_ids) for a in caller.by_stream[1][:-1]] == [[0], [1], [2]]
    refused = await caller.ended(2)
    assert (refused.code, refused.details) == (grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], "the router is full")
    broken = await caller.ended(3)
    assert broken.code == grpc.StatusCode.INTERNAL.value[0] and "RuntimeError" in broken.details
    assert (await caller.ended(4)).code == 0 and len(caller.by_stream[4]) == 3
    # A stream id still running is refused on its own; the running stream goes on.
    caller.send(_generate(5, "slow", 1))
    await _until(lambda: 5 in caller.by_stream)
    caller.send(_generate(5, "again"))
    duplicate = await caller.ended(5)
    assert duplicate.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "stream id 5" in duplicate.details
    # A command that neither starts nor cancels is refused for its stream id, naming what is missing.
    caller.send(inference_pb2.GenerateStreamCommand(stream_id=6))
    empty = await caller.ended(6)
    assert empty.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "`generate` or `cancel`" in empty.details
    caller.send(inference_pb2.GenerateStreamCommand(stream_id=5, cancel=True))
    caller.close()
    await asyncio.wait_for(caller.task, WAIT_S)  # the cancelled stream sent no end; the carrier ended


async def test_draining_refuses_new_streams_and_ends_the_carrier_once_idle() -> None:
    streams = GenerateStreams(_handler)
    caller = _Caller(streams)
    caller.send(_generate(1, "slow", 1))
    await _until(lambda: 1 in caller.by_stream)
    streams.drain()
    caller.send(_generate(2, "late"))
    late = await caller.ended(2)
    assert late.code == grpc.StatusCode.UNAVAILABLE.value[0] and late.details == "router is shutting down"
    assert not caller.task.done()  # stream 1 still runs
    caller.send(inference_pb2.GenerateStreamCommand(stream_id=1, cancel=True))
    await asyncio.wait_for(caller.task, WAIT_S)  # idle: the carrier ends with the caller's side still open


async def _until(condition: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
