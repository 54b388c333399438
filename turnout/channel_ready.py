"""Waiting, for a bounded time, for a channel to a service that may be restarting.

A call on a channel whose server is down fails at once with UNAVAILABLE ("connection refused").
While `turnout serve` restarts that server (a few seconds), a caller that waits a little for the
channel to connect turns most of those failures into successes; past the wait it fails with an
error that says which service is unreachable. Calls on a connected channel do not wait at all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import grpc
from grpc import aio


async def first_ready(channels: Sequence[aio.Channel], start: int, timeout_s: float) -> int | None:
    """The index of a connected channel: the first READY one from `start` on (round-robin order),
    else the first to connect within `timeout_s`; None when none does."""
    order = [(start + i) % len(channels) for i in range(len(channels))]
    for i in order:
        # try_to_connect: an idle channel (never used, or idle for long) starts connecting now.
        if channels[i].get_state(try_to_connect=True) is grpc.ChannelConnectivity.READY:
            return i
    if timeout_s <= 0:
        return None
    waits = {asyncio.ensure_future(channels[i].channel_ready()): i for i in order}
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        for wait in waits:
            with contextlib.suppress(asyncio.CancelledError):
                await wait
    ready = [waits[w] for w in done if not w.cancelled() and w.exception() is None]
    return min(ready, key=order.index) if ready else None
