"""The tokenizer replicas, used round-robin (they are stateless between streams).

A replica that is down (restarting) is skipped; while none is reachable, a request waits up to
`ready_timeout_s` for one to come back, then fails with UNAVAILABLE naming them.
"""

from __future__ import annotations

import asyncio
import itertools

from turnout.channel_ready import first_ready
from turnout.errors import Unavailable
from turnout.grpc_server import client_channel
from turnout.security import ClientCredentials
from turnout.v1 import tokenizer_pb2_grpc


class TokenizerPool:
    def __init__(
        self, addresses: tuple[str, ...], credentials: ClientCredentials | None = None, ready_timeout_s: float = 0.0
    ) -> None:
        self._addresses = addresses
        self._ready_timeout_s = ready_timeout_s
        self._channels = [client_channel(a, credentials) for a in addresses]
        self._stubs = [tokenizer_pb2_grpc.TokenizerStub(c) for c in self._channels]
        self._turn = itertools.count()

    async def pick(self) -> tokenizer_pb2_grpc.TokenizerStub:
        """The next connected replica (with no wait allowed: the next one)."""
        start = next(self._turn) % len(self._channels)
        if self._ready_timeout_s <= 0:
            return self._stubs[start]
        index = await first_ready(self._channels, start, self._ready_timeout_s)
        if index is None:
            raise Unavailable(
                f"no tokenizer is reachable ({', '.join(self._addresses)}; restarting?) after waiting "
                f"{self._ready_timeout_s:g} s (--tokenizer-ready-timeout)"
            )
        return self._stubs[index]

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels))
