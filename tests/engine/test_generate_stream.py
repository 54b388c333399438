"""Engine.GenerateStream: many requests over one stream, each answered exactly as its Generate call.

Driven through the servicer itself (the gRPC transport adds nothing these tests check; the router's
side runs it over gRPC in tests/router)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from services.engine.engine_loop import EngineLoop
from services.engine.model_loader import LoadedModel
from services.engine.service import EngineServicer
from tests.engine.test_engine_loop import engine, loaded
from tests.router.conftest import eventually
from turnout import carried_streams
from turnout.v1 import common_pb2, engine_pb2

__all__ = ["engine", "loaded"]  # the fixtures, re-used

PROMPT = list(range(1, 12))
# Generous: a busy machine slows every step, never the outcome.
WAIT_S = 60.0


def _request(request_id: str, max_new_tokens: int = 6, **params: Any) -> engine_pb2.EngineGenerateRequest:
    return engine_pb2.EngineGenerateRequest(
        request_id=request_id,
        input_ids=PROMPT,
        sampling_params=common_pb2.SamplingParams(
            temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True, **params
        ),
    )


class _Caller:
    """One GenerateStream call: commands in through a queue, every message out collected."""

    def __init__(self, servicer: EngineServicer) -> None:
        self._commands: asyncio.Queue[engine_pb2.EngineStreamCommands | None] = asyncio.Queue()
        self.messages: list[engine_pb2.EngineStreamOutputs] = []
        self.by_request: dict[str, list[engine_pb2.EngineStreamItem]] = {}
        self.task = asyncio.create_task(self._run(servicer))

    def send(self, **command: Any) -> None:
        self._commands.put_nowait(engine_pb2.EngineStreamCommands(items=[engine_pb2.EngineStreamCommand(**command)]))

    def close(self) -> None:
        self._commands.put_nowait(None)

    async def ended(self, request_id: str) -> common_pb2.StreamEnd:
        deadline = time.monotonic() + WAIT_S
        while not any(item.HasField("end") for item in self.by_request.get(request_id, [])):
            assert not self.task.done(), "the stream ended first"
            assert time.monotonic() < deadline, f"{request_id} did not end within {WAIT_S} s"
            await asyncio.sleep(0.01)
        return self.by_request[request_id][-1].end

    async def _requests(self) -> AsyncIterator[engine_pb2.EngineStreamCommands]:
        while (command := await self._commands.get()) is not None:
            yield command

    async def _run(self, servicer: EngineServicer) -> None:
        async for message in servicer.GenerateStream(self._requests(), None):  # type: ignore[arg-type]
            self.messages.append(message)
            for item in message.items:
                self.by_request.setdefault(item.request_id, []).append(item)


async def _until_idle(engine: EngineLoop) -> None:
    """Until no request runs (an aborted one is dropped at the engine's next step)."""
    await eventually(lambda: engine.load().running == 0, WAIT_S)


async def _alone(servicer: EngineServicer, request: engine_pb2.EngineGenerateRequest) -> list[Any]:
    return [r async for r in servicer.Generate(request, None)]  # type: ignore[arg-type]


def _tokens(responses: list[engine_pb2.EngineGenerateResponse]) -> list[int]:
    parts = [p for r in responses for p in (r, *r.batch)]
    return [t for p in parts for t in (p.chunk.token_ids if p.HasField("chunk") else p.complete.token_ids)]


async def test_requests_share_one_stream_and_get_what_generate_gives(engine: EngineLoop, loaded: LoadedModel) -> None:
    servicer = EngineServicer(loaded, engine, engine.engine.config)
    alone = _tokens(await _alone(servicer, _request("solo", 8)))
    caller = _Caller(servicer)
    for name in ("a", "b", "c"):
        caller.send(generate=_request(name, 8))
    for name in ("a", "b", "c"):
        end = await caller.ended(name)
        assert end.code == grpc.StatusCode.OK.value[0]
        responses = [item.response for item in caller.by_request[name][:-1]]
        assert _tokens(responses) == alone  # greedy: the same ids as its own call
        assert responses[-1].WhichOneof("kind") == "complete" or responses[-1].batch[-1].HasField("complete")
    # One engine step's outputs of the three requests travel together.
    assert any(len({item.request_id for item in m.items}) > 1 for m in caller.messages)
    caller.close()
    await asyncio.wait_for(caller.task, 30)  # the caller closed its side: the stream ends


async def test_a_refused_request_ends_with_its_status_and_spares_the_others(
    engine: EngineLoop, loaded: LoadedModel
) -> None:
    servicer = EngineServicer(loaded, engine, engine.engine.config)
    caller = _Caller(servicer)
    caller.send(generate=_request("good", 200))
    caller.send(generate=_request("bad", 4, top_p=7.0))
    caller.send(generate=_request("good", 4))  # an id already running on this stream
    bad = await caller.ended("bad")
    assert bad.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "top_p" in bad.details
    await caller.ended("good")
    while len(ends := [item.end for item in caller.by_request["good"] if item.HasField("end")]) < 2:
        await asyncio.sleep(0.01)
    # The duplicate is refused; the first "good" runs on to its end, untouched.
    duplicate, first = ends
    assert duplicate.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "already in use" in duplicate.details
    assert first.code == 0
    responses = [item.response for item in caller.by_request["good"] if item.HasField("response")]
    assert len(_tokens(responses)) == 200
    # The stream goes on for new requests.
    caller.send(generate=_request("after", 3))
    assert (await caller.ended("after")).code == 0
    caller.close()
    await asyncio.wait_for(caller.task, 30)


async def test_abort_stops_one_request_and_frees_the_engine(engine: EngineLoop, loaded: LoadedModel) -> None:
    servicer = EngineServicer(loaded, engine, engine.engine.config)
    caller = _Caller(servicer)
    caller.send(generate=_request("long", 3000))
    caller.send(generate=_request("short", 4))
    while not caller.by_request.get("long"):
        await asyncio.sleep(0.01)
    caller.send(abort=engine_pb2.AbortRequest(request_id="long"))
    assert (await caller.ended("short")).code == 0
    await _until_idle(engine)  # "long" was aborted, not left running
    assert not any(item.HasField("end") for item in caller.by_request["long"])
    caller.close()
    await asyncio.wait_for(caller.task, 30)


async def test_closing_the_stream_aborts_its_requests(engine: EngineLoop, loaded: LoadedModel) -> None:
    servicer = EngineServicer(loaded, engine, engine.engine.config)
    caller = _Caller(servicer)
    caller.send(generate=_request("long", 3000))
    while not caller.by_request.get("long"):
        await asyncio.sleep(0.01)
    caller.task.cancel()  # the router went away: its call is cancelled
    await asyncio.gather(caller.task, return_exceptions=True)
    await _until_idle(engine)


async def test_draining_refuses_new_requests_and_ends_the_stream_once_idle(
    engine: EngineLoop, loaded: LoadedModel
) -> None:
    servicer = EngineServicer(loaded, engine, engine.engine.config)
    caller = _Caller(servicer)
    caller.send(generate=_request("running", 40))
    while not caller.by_request.get("running"):
        await asyncio.sleep(0.01)
    servicer.drain()
    caller.send(generate=_request("late", 4))
    late = await caller.ended("late")
    assert late.code == grpc.StatusCode.UNAVAILABLE.value[0] and "shutting down" in late.details
    assert (await caller.ended("running")).code == 0  # the running request finishes
    await asyncio.wait_for(caller.task, 30)  # then the stream ends, with the caller's side still open


async def test_outputs_past_the_message_budget_are_split_and_an_oversized_one_ends_its_request_alone(
    engine: EngineLoop, loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    servicer = EngineServicer(loaded, engine, engine.engine.config)
    # A budget that one step's one-token items of every request together pass (16 x 32 bytes), that one
    # request's whole output fits in even when its reader lagged for all of it and got it as one item
    # (8 outputs: ~150 bytes), and that one prompt's hidden states do not (~3 KB).
    monkeypatch.setattr(carried_streams, "MESSAGE_BUDGET", 400)
    parts: list[int] = []  # messages each write was split into
    split = carried_streams.ResponseStreams.split

    def counted(stream: Any, outputs: Any) -> Any:
        messages = list(split(stream, outputs))
        parts.append(len(messages))
        return iter(messages)

    monkeypatch.setattr(carried_streams.ResponseStreams, "split", counted)
    caller = _Caller(servicer)
    names = [f"r{i:02}" for i in range(16)]
    for name in names:
        caller.send(generate=_request(name, 8))
    big_request = _request("big", 8)
    big_request.return_hidden_states = True  # 11 prompt positions of 64 floats in its first output
    caller.send(generate=big_request)
    for name in names:
        assert (await caller.ended(name)).code == 0
        responses = [item.response for item in caller.by_request[name][:-1]]
        assert len(_tokens(responses)) == 8  # every output arrived
    big = await caller.ended("big")
    assert big.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and "bytes a message may carry" in big.details
    # Every message within the budget, but the one that ends "big".
    assert all(m.ByteSize() <= 400 for m in caller.messages if m.items[0].request_id != "big")
    assert max(parts) > 1  # some write was split
    caller.close()
    await asyncio.wait_for(caller.task, 30)
