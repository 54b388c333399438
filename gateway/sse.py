"""Server-sent events: `data: {json}\\n\\n` frames, a final `data: [DONE]`, errors as events.

Once a stream has started the status is 200 for good, so an error after that
becomes a `data: {"error": {...}}` event followed by `data: [DONE]`. The
Responses API's typed events (`typed_frames`) name each event's type in an
`event:` line and end without `[DONE]`, as OpenAI sends them; their source
turns its own errors into an `error` event.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.errors import to_http_error

DONE = b"data: [DONE]\n\n"


def encode(payload: dict[str, Any] | str) -> bytes:
    """A `data:` frame of `payload`, or of its JSON text when it comes encoded already."""
    if not isinstance(payload, str):
        payload = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + payload.encode() + b"\n\n"


def _nothing_ready() -> bool:
    return False


async def frames(
    events: AsyncGenerator[dict[str, Any], None] | AsyncGenerator[str, None],
    ready: Callable[[], bool] = _nothing_ready,
) -> AsyncGenerator[bytes, None]:
    """Encode `events` (objects, or their JSON text), turning an error into an error event; always ends
    with [DONE].

    The bytes are the same whatever `ready` says; it only decides the socket writes: while `ready()`
    (more events are already here) frames are gathered into one write, and the write goes out as soon
    as nothing more is ready, so no event waits for a later one."""
    pending: list[bytes] = []
    async with contextlib.aclosing(events):
        try:
            async for event in events:
                pending.append(encode(event))
                if not ready():
                    yield b"".join(pending)
                    pending.clear()
        except Exception as exc:
            pending.append(encode(to_http_error(exc).body()))
    pending.append(DONE)
    yield b"".join(pending)


async def typed_frames(events: AsyncGenerator[dict[str, Any], None]) -> AsyncGenerator[bytes, None]:
    """`event: {type}` + `data: {json}` per event (each has a `type`)."""
    async with contextlib.aclosing(events):
        async for event in events:
            yield b"event: " + event["type"].encode() + b"\n" + encode(event)


class SSEResponse(StreamingResponse):
    """A streaming response that always closes its source and calls `on_close`.

    Starlette cancels the sending task when the client disconnects; that task
    may be waiting in `send` rather than in the generator, in which case the
    generator would only be closed by the garbage collector. Closing it here
    and calling `on_close` (which cancels the gRPC calls) makes the stop
    immediate, and also covers a generator that never started.
    """

    def __init__(self, content: AsyncGenerator[bytes, None], on_close: Callable[[], None]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._source = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._source.aclose()
            finally:
                self._on_close()
