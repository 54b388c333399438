"""The router's Encode calls to one tokenizer, carried by one `Tokenizer.EncodeStream`.

Every text or chat prompt is encoded by a tokenizer. As its own unary call, each paid a call's set-up at
both ends (about 0.65 ms of the tokenizer's CPU alone for a two-letter prompt); carried by one stream per
tokenizer, the prompts that arrive while the router works go out as one message, and their answers come
back together.

`EncodeMux.encode()` reads like the call it replaces: the response, or the `aio.AioRpcError` the call
would have raised (the tokenizer's refusal, or the carrier's status when it broke: UNAVAILABLE when the
tokenizer died or restarted, so the caller's retry on another replica works as before). A caller that is
cancelled while it waits cancels the carried call on the tokenizer. The next call after a break opens a
new carrier.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from turnout.carried_streams import current_trace_context, end_error
from turnout.carrier_client import AnsweredCall, OpenCarrier
from turnout.errors import Unavailable
from turnout.v1 import tokenizer_pb2, tokenizer_pb2_grpc


class _Carrier(AnsweredCall[tokenizer_pb2.EncodeStreamRequest, tokenizer_pb2.EncodeResponse]):
    """One open EncodeStream and the calls waiting on it."""

    def __init__(self, forget: Callable[[_Carrier], None], stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
        super().__init__(forget, stub.EncodeStream, tokenizer_pb2.EncodeStreamRequest, "the tokenizer's EncodeStream")

    async def encode(self, call_id: int, request: tokenizer_pb2.EncodeRequest) -> tokenizer_pb2.EncodeResponse:
        if self.error is not None:
            raise self.error
        answer = self.expect(call_id)
        item = self.outgoing.items.add(call_id=call_id, trace_context=current_trace_context())
        item.request.CopyFrom(request)
        self.due()
        try:
            return await answer
        except asyncio.CancelledError:
            if self._waiting.pop(call_id, None) is not None and self.error is None:
                self.outgoing.items.add(call_id=call_id, cancel=True)
                self.due()
            raise
        finally:
            self._waiting.pop(call_id, None)

    def key_of(self, item: tokenizer_pb2.EncodeStreamItem) -> int:
        return item.call_id

    def deliver(self, answer: tokenizer_pb2.EncodeStreamAnswer) -> None:
        if answer.WhichOneof("kind") == "response":
            self.settle(answer.call_id, answer.response)
        else:
            refusal = end_error(answer.end)
            self.settle(answer.call_id, error=refusal or Unavailable("the tokenizer answered an Encode with nothing"))


class EncodeMux:
    """The Encode calls this router makes to one tokenizer, carried by one stream at a time."""

    def __init__(self, stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
        self.carrier: OpenCarrier[_Carrier] = OpenCarrier(lambda forget: _Carrier(forget, stub))
        self._ids = itertools.count(1)

    async def encode(self, request: tokenizer_pb2.EncodeRequest) -> tokenizer_pb2.EncodeResponse:
        return await self.carrier.get().encode(next(self._ids), request)

    async def close(self) -> None:
        await self.carrier.close()
