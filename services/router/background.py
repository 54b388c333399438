"""The lifecycle shared by the router's background loops (health checks, load polling, DNS refresh)."""

from __future__ import annotations

import asyncio
import contextlib


class BackgroundLoop:
    """Runs `_run()` as one asyncio task from `start()` until `close()` cancels it."""

    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        raise NotImplementedError
