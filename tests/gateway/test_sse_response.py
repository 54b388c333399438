"""SSEResponse's ASGI messages: the frame with [DONE] ends the body itself (one write with the chunked
body's end), and a source without [DONE] still ends with an empty last part."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from starlette.types import Message

from gateway import sse


async def _events(*texts: str) -> AsyncGenerator[dict[str, Any], None]:
    for text in texts:
        yield {"text": text}


async def _messages(response: sse.SSEResponse) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await response(scope={"type": "http", "asgi": {"spec_version": "2.3"}}, receive=receive, send=send)
    return sent


async def test_the_done_frame_is_the_last_part_of_the_body() -> None:
    closed: list[bool] = []
    response = sse.SSEResponse(sse.frames(_events("a", "b")), on_close=lambda: closed.append(True))
    messages = await _messages(response)
    assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 200
    bodies = [(m["body"], m["more_body"]) for m in messages[1:]]
    assert bodies == [
        (b'data: {"text":"a"}\n\n', True),
        (b'data: {"text":"b"}\n\n', True),
        (sse.DONE, False),  # no empty part after it
    ]
    assert closed == [True]


async def test_a_source_without_done_ends_with_an_empty_part() -> None:
    async def typed() -> AsyncGenerator[dict[str, Any], None]:
        yield {"type": "response.completed"}

    messages = await _messages(sse.SSEResponse(sse.typed_frames(typed()), on_close=lambda: None))
    bodies = [(m["body"], m["more_body"]) for m in messages[1:]]
    assert bodies == [(b'event: response.completed\ndata: {"type":"response.completed"}\n\n', True), (b"", False)]
