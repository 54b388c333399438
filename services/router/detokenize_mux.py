"""The router's Detokenize streams to one tokenizer, carried by one `Tokenizer.DetokenizeStream`.

Every sample's text used to be its own Detokenize call. Carried by one stream per tokenizer, the
exchanges of every sample that become due while the router works go out as one message, and the
tokenizer's answers to all of them come back as one: a write and a read per batch of samples instead of
per sample.

`DetokenizeMux.open()` gives a `CarriedDetokenize` for one sample, whose `exchange()` and
`exchange_tokens()` are what a write and a read on its own call were (one answer per message; the
tokenizer's refusal raised as the `aio.AioRpcError` its call would have ended with). When the carrier
breaks (the tokenizer died or restarted), every exchange on it fails with the carrier's status, as their
own calls would have, and the next sample opens a new carrier.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable

from grpc import aio

from turnout.carried_streams import end_error
from turnout.carrier_client import AnsweredCall, OpenCarrier
from turnout.errors import Unavailable
from turnout.v1 import tokenizer_pb2, tokenizer_pb2_grpc


class CarriedDetokenize:
    """One sample's Detokenize stream on a carrier: one message in flight at a time."""

    def __init__(self, carrier: _Carrier, stream_id: int) -> None:
        self._carrier = carrier
        self._id = stream_id

    async def exchange(self, request: tokenizer_pb2.DetokenizeRequest) -> tokenizer_pb2.DetokenizeResponse:
        """Send one message (copied into the carrier's next one) and return its answer."""
        item, answer = self._carrier.item(self._id)
        item.request.CopyFrom(request)
        return await self._carrier.answer(self._id, answer)

    async def exchange_tokens(
        self, token_ids: Iterable[int], *, last: bool = False, step_sizes: Iterable[int] = ()
    ) -> tokenizer_pb2.DetokenizeResponse:
        """Send one step's tokens (several steps' with `step_sizes`) and return the answer. The message is
        written in place in the carrier's next one: it is the router's most frequent (one per step of every
        sample), and building it apart and copying it in cost 1.95 us against 1.31 (docs/benchmarks.md)."""
        item, answer = self._carrier.item(self._id)
        tokens = item.request.tokens
        tokens.token_ids.extend(token_ids)
        tokens.step_sizes.extend(step_sizes)
        tokens.last = last
        return await self._carrier.answer(self._id, answer)

    def close(self) -> None:
        """Nothing more is needed of this stream (the tokenizer drops it). Only the first close of a stream
        whose end has not come sends anything (the carrier knows which are open)."""
        self._carrier.close_stream(self._id)


class _Carrier(AnsweredCall[tokenizer_pb2.DetokenizeStreamRequest, tokenizer_pb2.DetokenizeResponse]):
    """One open DetokenizeStream and the exchanges waiting on it."""

    def __init__(self, forget: Callable[[_Carrier], None], stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
        # Streams opened here whose end has not come and that this side has not closed: only they need a
        # close (a stream ends on the tokenizer's side with the answer that ends its sequence).
        self._open: set[int] = set()
        super().__init__(
            forget, stub.DetokenizeStream, tokenizer_pb2.DetokenizeStreamRequest, "the tokenizer's DetokenizeStream"
        )

    def item(
        self, stream_id: int
    ) -> tuple[tokenizer_pb2.DetokenizeStreamItem, asyncio.Future[tokenizer_pb2.DetokenizeResponse]]:
        """The next message's item for `stream_id`, for its caller to fill in before it awaits `answer`
        (the item goes out after one turn of the loop), and the future of its answer."""
        if self.error is not None:
            raise self.error
        answer = self.expect(stream_id)
        item = self.outgoing.items.add()
        item.stream_id = stream_id
        self.due()
        return item, answer

    async def answer(
        self, stream_id: int, answer: asyncio.Future[tokenizer_pb2.DetokenizeResponse]
    ) -> tokenizer_pb2.DetokenizeResponse:
        try:
            return await answer
        finally:
            if self._waiting.get(stream_id) is answer:
                del self._waiting[stream_id]

    def opened(self, stream_id: int) -> None:
        self._open.add(stream_id)

    def close_stream(self, stream_id: int) -> None:
        if stream_id in self._open and self.error is None:
            self._open.discard(stream_id)
            self.outgoing.items.add(stream_id=stream_id, close=True)
            self.due()

    def key_of(self, item: tokenizer_pb2.DetokenizeStreamItem) -> int:
        return item.stream_id

    def deliver(self, answer: tokenizer_pb2.DetokenizeStreamAnswer) -> None:
        # An end of a stream whose sequence ended, or that this side closed, finds no one waiting.
        if answer.WhichOneof("kind") == "response":
            self.settle(answer.stream_id, answer.response)
            return
        self._open.discard(answer.stream_id)
        if answer.stream_id in self._waiting:  # most ends follow the answer that ended the sequence: no one waits
            refusal = end_error(answer.end)
            self.settle(answer.stream_id, error=refusal or Unavailable("tokenizer closed the detokenize stream early"))

    def broken(self, error: aio.AioRpcError) -> None:
        self._open.clear()
        super().broken(error)


class DetokenizeMux:
    """The Detokenize streams this router opens on one tokenizer, carried by one stream at a time."""

    def __init__(self, stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
        self.carrier: OpenCarrier[_Carrier] = OpenCarrier(lambda forget: _Carrier(forget, stub))
        self._ids = itertools.count(1)

    def open(self) -> CarriedDetokenize:
        """A new sample's stream (on the open carrier, opening one if none is)."""
        carrier = self.carrier.get()
        stream_id = next(self._ids)
        carrier.opened(stream_id)
        return CarriedDetokenize(carrier, stream_id)

    async def close(self) -> None:
        await self.carrier.close()
