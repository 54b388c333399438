"""DisconnectWatch: the client's disconnect cancels the work in the request's own task, and only that
cancel is taken back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.disconnect import DisconnectWatch


class Client:
    """An ASGI `receive` whose next message is the disconnect, once `leave()` is called."""

    def __init__(self) -> None:
        self._gone = asyncio.Event()

    def leave(self) -> None:
        self._gone.set()

    async def receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}


async def test_work_that_completes_is_left_alone_and_the_watcher_stops() -> None:
    client = Client()
    async with DisconnectWatch(client.receive) as watch:
        await asyncio.sleep(0)
        result = 42
    client.leave()  # after the block: nothing to cancel any more
    await asyncio.sleep(0.01)
    assert result == 42 and not watch.gone
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_the_disconnect_stops_the_work_where_it_waits_and_the_request_goes_on() -> None:
    client = Client()
    stopped = asyncio.Event()

    async def request() -> str:
        async with DisconnectWatch(client.receive) as watch:
            try:
                await asyncio.Event().wait()  # work that never ends on its own
            finally:
                stopped.set()
        assert watch.gone
        await asyncio.sleep(0)  # the task is not cancelled any more: it can wait again
        return "ended normally"

    task = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    client.leave()
    assert await asyncio.wait_for(task, 5) == "ended normally"
    assert stopped.is_set()


async def test_a_cancel_from_elsewhere_goes_on_with_the_client_still_there() -> None:
    async def request() -> None:
        async with DisconnectWatch(Client().receive):
            await asyncio.Event().wait()

    task = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    task.cancel()  # the server shutting down, say
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancel_from_elsewhere_goes_on_when_the_client_left_too() -> None:
    client = Client()
    watch = DisconnectWatch(client.receive)

    async def request() -> None:
        async with watch:
            await asyncio.Event().wait()

    task = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    client.leave()
    while not watch.gone:  # the watcher has cancelled the task, which has not run since
        await asyncio.sleep(0)
    task.cancel()  # and the server cancels it too
    with pytest.raises(asyncio.CancelledError):
        await task
