"""The tokenizer replicas, used round-robin (they are stateless between streams)."""

from __future__ import annotations

import asyncio
import itertools

from turnout.grpc_server import client_channel
from turnout.security import ClientCredentials
from turnout.v1 import tokenizer_pb2_grpc


class TokenizerPool:
    def __init__(self, addresses: tuple[str, ...], credentials: ClientCredentials) -> None:
        self._channels = [client_channel(a, credentials) for a in addresses]
        self._stubs = [tokenizer_pb2_grpc.TokenizerStub(c) for c in self._channels]
        self._turn = itertools.count()

    def pick(self) -> tokenizer_pb2_grpc.TokenizerStub:
        return self._stubs[next(self._turn) % len(self._stubs)]

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels))
