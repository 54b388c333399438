"""The tokenizer replicas, used round-robin (they are stateless between streams).

A replica that is down (restarting) is skipped; while none is reachable, a request waits up to
`ready_timeout_s` for one to come back, then fails with UNAVAILABLE naming them.

A replica can also die between the pick and a call on it (its channel still looked connected):
the call fails UNAVAILABLE with gRPC's transport text. Work that has sent nothing to the caller
yet is then tried once more on a freshly picked replica (`retrying`); otherwise `lost` turns the
failure into an error that names the tokenizer instead of a socket.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from grpc import aio

from services.router.detokenize_mux import DetokenizeMux
from services.router.encode_mux import EncodeMux
from services.router.logprob_text import TokenTexts
from turnout.channel_ready import first_ready
from turnout.errors import Unavailable
from turnout.grpc_server import client_channel
from turnout.security import ClientCredentials
from turnout.v1 import tokenizer_pb2, tokenizer_pb2_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")


class TokenizerClient(tokenizer_pb2_grpc.TokenizerStub):
    """A replica's stub; the samples' Detokenize streams to it and the prompts' Encode calls, each kind
    carried by one stream (detokenize_mux.py, encode_mux.py); its token table (logprob_text.py)."""

    def __init__(self, channel: aio.Channel) -> None:
        super().__init__(channel)
        self.texts = DetokenizeMux(self)
        self._encodes = EncodeMux(self)
        self.token_texts = TokenTexts(self)

    async def encode(self, request: tokenizer_pb2.EncodeRequest) -> tokenizer_pb2.EncodeResponse:
        """What `Encode(request)` answers, carried by the EncodeStream."""
        return await self._encodes.encode(request)


class TokenizerPool:
    def __init__(
        self, addresses: tuple[str, ...], credentials: ClientCredentials | None = None, ready_timeout_s: float = 0.0
    ) -> None:
        self._addresses = addresses
        self._ready_timeout_s = ready_timeout_s
        self._channels = [client_channel(a, credentials) for a in addresses]
        self._stubs = [TokenizerClient(c) for c in self._channels]
        self._turn = itertools.count()

    async def pick(self) -> TokenizerClient:
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

    def channels(self) -> list[tuple[str, aio.Channel]]:
        """Each configured address with its channel (for scraping the tokenizers' metrics)."""
        return list(zip(self._addresses, self._channels, strict=True))

    def lost(self, exc: aio.AioRpcError) -> Unavailable:
        """The error a caller sees when a tokenizer went away during its request."""
        log.warning("tokenizer call failed", extra={"error": f"{exc.code().name}: {exc.details()}"})
        return Unavailable(
            f"the tokenizer ({', '.join(self._addresses)}) went away during the request (restarting?); retry it"
        )

    async def retrying(self, use: Callable[[TokenizerClient], Awaitable[T]]) -> T:
        """`use(stub)`, tried once more on a newly picked replica when the first one was unreachable."""
        for attempt in range(2):
            try:
                return await use(await self.pick())
            except aio.AioRpcError as exc:
                if not is_unreachable(exc):
                    raise
                if attempt:
                    raise self.lost(exc) from None
        raise AssertionError("unreachable")

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels))


def is_unreachable(exc: aio.AioRpcError) -> bool:
    return exc.code() is grpc.StatusCode.UNAVAILABLE
