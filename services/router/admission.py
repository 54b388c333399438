"""Admission control: at most `max_concurrent` Generate streams at once, a bounded FIFO queue behind them.

A request that finds every slot taken waits in the queue for up to
`queue_timeout_s`; one that finds the queue full too is refused at once.
Both refusals are RESOURCE_EXHAUSTED (HTTP 429): the caller should back off.
A finished stream hands its slot straight to the oldest waiter, so the queue
is served in arrival order and `active` never exceeds `max_concurrent`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

from turnout.errors import ResourceExhausted


class QueueFull(ResourceExhausted):
    """Every slot is taken and the queue is full."""


class QueueTimeout(ResourceExhausted):
    """No slot freed while the request waited in the queue."""


class Admission:
    def __init__(self, max_concurrent: int, max_queued: int, queue_timeout_s: float) -> None:
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.queue_timeout_s = queue_timeout_s
        self.active = 0
        # Refusals by reason (queue_full, queue_timeout), for metrics.
        self.rejected: collections.Counter[str] = collections.Counter()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self._acquire()
        try:
            yield
        finally:
            self._release()

    async def _acquire(self) -> None:
        if self.active < self.max_concurrent and not self._waiters:
            self.active += 1
            return
        if len(self._waiters) >= self.max_queued:
            self.rejected["queue_full"] += 1
            raise QueueFull(
                f"the router is at capacity: {self.active} requests running "
                f"(--max-concurrent-requests) and {len(self._waiters)} waiting (--max-queued-requests)"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout_s)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot was handed over just as we gave up: pass it on
            else:
                waiter.cancel()
                self._waiters.remove(waiter)
            if isinstance(exc, asyncio.TimeoutError):
                self.rejected["queue_timeout"] += 1
                raise QueueTimeout(
                    f"the router is at capacity: no slot freed within {self.queue_timeout_s:g} s (--queue-timeout)"
                ) from None
            raise

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot moves to the waiter: `active` is unchanged
                return
        self.active -= 1
