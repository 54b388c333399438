"""Stopping a request's work when its HTTP client goes away.

Once the request's body has been read, the next ASGI message the server has for the request is
`http.disconnect` (uvicorn also sends it once the response is complete), so waiting for it is a
notification, not polling. `DisconnectWatch` runs the request's work in the request's own task: a
watcher task waits for the disconnect and cancels that task, so the work stops where it waits (and
cancels its router calls on its way out). This is what starlette's anyio task group did for a
streamed body, without its task, cancel scope and the extra wake-ups per response.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from starlette.types import Receive


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client has gone (call it after the body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class DisconnectWatch:
    """`async with DisconnectWatch(receive) as watch:` while the block runs, the client's disconnect
    cancels the task running it; the block's end (whatever its outcome) stops the watching. A
    cancellation that came from the disconnect is taken back and not raised (`gone` says it came),
    so the request ends normally; any other cancellation goes on."""

    __slots__ = ("_receive", "_task", "_watcher", "gone")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Future[None] | None = None
        self.gone = False

    async def __aenter__(self) -> DisconnectWatch:
        self._task = asyncio.current_task()
        assert self._task is not None, "DisconnectWatch outside a task"
        self._watcher = asyncio.ensure_future(self._cancel_when_gone(self._task))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> bool:
        # Runs before the watcher can run again: work that completed is never cancelled after the fact.
        assert self._watcher is not None and self._task is not None
        # The watcher ends with its CancelledError, whose traceback holds its frames and so this watch:
        # dropped here, the watcher is no cycle for the garbage collector (two a streamed request).
        self._watcher.cancel()
        self._watcher = None
        if exc_type is None or not issubclass(exc_type, asyncio.CancelledError) or not self.gone:
            return False
        # Our own cancel: taken back (3.11+ counts a task's cancels); one from elsewhere too goes on.
        return not hasattr(self._task, "uncancel") or self._task.uncancel() == 0

    async def _cancel_when_gone(self, task: asyncio.Task[Any]) -> None:
        await wait_for_disconnect(self._receive)
        self.gone = True
        task.cancel()
