"""How a request reads its router calls: a one-prompt request in its own task, several prompts each
to the end, and what `ready()` tells the SSE writer about the next socket write."""

from __future__ import annotations

import asyncio

from gateway import sse
from gateway.batch_limit import gather_bounded
from gateway.generation import Generation
from turnout.carrier_client import CarriedCall
from turnout.v1 import common_pb2, inference_pb2


def _chunk(index: int, text: str, token: int) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(chunk=inference_pb2.GenerateChunk(index=index, text=text, token_ids=[token]))


def _complete(index: int) -> inference_pb2.GenerateResponse:
    finish = common_pb2.FinishReason(length=common_pb2.FinishReason.Length(length=3))
    return inference_pb2.GenerateResponse(complete=inference_pb2.GenerateComplete(index=index, finish_reason=finish))


def _generation(prompts: int) -> tuple[Generation, list[CarriedCall[inference_pb2.GenerateResponse]]]:
    calls: list[CarriedCall[inference_pb2.GenerateResponse]] = [CarriedCall(lambda: None) for _ in range(prompts)]
    firsts = [_chunk(0, f"p{p}:a", 1) for p in range(prompts)]
    return Generation(calls, firsts, [1] * prompts, started=0.0), calls


async def test_a_one_prompt_request_reads_its_call_in_its_own_task() -> None:
    generation, (call,) = _generation(1)
    tasks_before = len(asyncio.all_tasks())
    events = generation.events()
    seen: list[tuple[str, bool, int]] = []

    async def deliver_later() -> None:
        await asyncio.sleep(0)
        call.respond(_chunk(0, "b", 2))
        call.respond(_chunk(0, "c", 3))  # several at once: each is followed by something ready
        call.respond(_complete(0))
        call.end(common_pb2.StreamEnd())

    assert generation.ready() is False
    async for event in events:
        seen.append((event.text, generation.ready(), len(asyncio.all_tasks()) - tasks_before))
        if len(seen) == 1:
            later = asyncio.ensure_future(deliver_later())
    await later
    # No task was started to read the call (deliver_later's own had ended by the second event).
    assert [task_count for *_, task_count in seen] == [0, 0, 0, 0]
    # The end of the stream counts as ready too: the last write then carries [DONE] with it.
    assert [(text, ready) for text, ready, _ in seen] == [("p0:a", False), ("b", True), ("c", True), ("", True)]
    assert generation.samples[0].text == "p0:abc"


async def test_ready_events_of_one_call_go_out_in_one_write() -> None:
    generation, (call,) = _generation(1)
    call.respond(_chunk(0, "b", 2))
    call.respond(_complete(0))
    call.end(common_pb2.StreamEnd())

    async def texts():  # type: ignore[no-untyped-def]
        async for event in generation.events():
            yield {"text": event.text}

    writes = [frame async for frame in sse.frames(texts(), generation.ready)]
    # Everything had arrived: one write, byte for byte the events one after the other, then [DONE].
    assert writes == [b'data: {"text":"p0:a"}\n\ndata: {"text":"b"}\n\ndata: {"text":""}\n\ndata: [DONE]\n\n']


async def test_several_prompts_are_each_read_to_the_end() -> None:
    generation, calls = _generation(3)
    for p in (2, 0, 1):
        calls[p].respond(_complete(0))
        calls[p].end(common_pb2.StreamEnd())
    samples = await generation.collect()
    assert [s.text for s in samples] == ["p0:a", "p1:a", "p2:a"]
    assert all(s.finish_reason is not None for s in samples)


async def test_one_call_is_awaited_in_the_callers_task_and_a_batch_starts_no_idle_workers() -> None:
    caller = asyncio.current_task()
    base = len(asyncio.all_tasks())
    most: list[int] = []

    async def whose_task() -> asyncio.Task[object] | None:
        most.append(len(asyncio.all_tasks()) - base)
        await asyncio.sleep(0)
        return asyncio.current_task()

    assert await gather_bounded([whose_task()]) == [caller]
    assert most == [0]
    most.clear()
    workers = await gather_bounded([whose_task() for _ in range(3)])
    assert caller not in workers
    assert max(most) == 3  # a worker per call, not the fan-out limit's 8
