"""Tokenizer.EncodeStream: many Encode calls carried by one.

The router encodes every text or chat prompt. As its own unary call, each paid a call's set-up at both
ends: about 0.65 ms of the tokenizer's CPU for a two-letter prompt, more than the tokenizing itself.
Carried by one stream per router, the prompts that arrive together go out as one message and their
answers come back as one.

Each carried call is served by the servicer's Encode handler and answered exactly as its own call
would be: its response, or an `end` with the status its call would have failed with. It is traced
and counted in the per-call metrics as that call. A `cancel` stops a call still running, as a
cancelled call stops (no answer follows). While the service drains, new calls are refused
UNAVAILABLE and the carrier ends once its calls have.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from turnout.carried_streams import CarrierServer, UnaryCalls
from turnout.errors import status_of
from turnout.v1 import tokenizer_pb2

OnEnd = Callable[[str, grpc.StatusCode, float], None]
Encode = Callable[[tokenizer_pb2.EncodeRequest], Awaitable[tokenizer_pb2.EncodeResponse]]

_METHOD = "turnout.v1.Tokenizer/Encode"


class EncodeStreams(CarrierServer):
    """Serves EncodeStream calls with a servicer's Encode handler. `on_end(method, code, seconds)` hears of
    each carried call's end, as the per-call metrics would of its call."""

    def __init__(self, encode: Encode, service: str = "tokenizer", on_end: OnEnd | None = None) -> None:
        super().__init__()
        self._encode = encode
        self._service = service
        self._on_end = on_end

    async def serve(
        self, requests: AsyncIterator[tokenizer_pb2.EncodeStreamRequest]
    ) -> AsyncIterator[tokenizer_pb2.EncodeStreamResponse]:
        async for answers in self._serve(_Carrier(self), requests):
            yield answers

    async def _counted(self, request: tokenizer_pb2.EncodeRequest) -> tokenizer_pb2.EncodeResponse:
        """The handler, counted as its own call would be."""
        started, code = time.perf_counter(), grpc.StatusCode.CANCELLED
        try:
            response = await self._encode(request)
            code = grpc.StatusCode.OK
            return response
        except Exception as exc:
            code = status_of(exc) or grpc.StatusCode.INTERNAL
            raise
        finally:
            if self._on_end is not None:
                self._on_end(_METHOD.rpartition("/")[2], code, time.perf_counter() - started)


class _Carrier(UnaryCalls[tokenizer_pb2.EncodeStreamRequest, tokenizer_pb2.EncodeStreamResponse]):
    def __init__(self, owner: EncodeStreams) -> None:
        super().__init__(
            owner,
            tokenizer_pb2.EncodeStreamResponse,
            service=owner._service,
            method=_METHOD,
            key_field="call_id",
            key_name="call id",
        )
        self._owner = owner

    async def read(self, requests: AsyncIterator[tokenizer_pb2.EncodeStreamRequest]) -> None:
        async for message in requests:
            for item in message.items:
                if item.WhichOneof("kind") == "request":
                    call = functools.partial(self._owner._counted, item.request)
                    self.start_call(item.call_id, call, item.trace_context)
                else:  # cancel
                    self.stop(item.call_id)
