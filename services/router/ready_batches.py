"""Everything a stream has ready, read in one go.

A gRPC stream hands its messages over one `read()` at a time, and the sender cannot tell that this
side lags: HTTP/2 flow control lets thousands of small messages pile up in the receive buffer first.
`ready_batches` keeps one task reading the stream into a queue while its consumer works; each time the
consumer asks, it gets every message received since it last asked (at least one, waiting for it
when there is none). Nothing is held back for a later message: a batch is what is already here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

T = TypeVar("T")

# Messages read ahead before the reader waits for the consumer (backpressure to the sender).
READ_AHEAD = 256


class _End:
    pass


async def ready_batches(source: AsyncIterator[T]) -> AsyncGenerator[list[T], None]:
    """`source`'s messages in order, in lists of those that were ready together; its error after the
    messages that came before it. Leaving early stops the reading task before returning, so whoever
    owns `source` may close it right after."""
    queue: asyncio.Queue[T | _End | BaseException] = asyncio.Queue(READ_AHEAD)

    async def read() -> None:
        try:
            async for item in source:
                await queue.put(item)
        except Exception as exc:
            await queue.put(exc)
        else:
            await queue.put(_End())

    reader = asyncio.create_task(read())
    try:
        while True:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            batch: list[T] = []
            for item in items:
                if isinstance(item, _End):
                    if batch:
                        yield batch
                    return
                if isinstance(item, BaseException):
                    if batch:
                        yield batch
                    raise item
                batch.append(item)
            yield batch
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
