"""The Detokenize stream of one sample: token ids in, final text (and stop matches) out.

Strictly one message in flight: each message waits for the answer to the one
before (the start's answer is empty). The start goes out as soon as it is opened,
and the router starts the engine meanwhile; tokens wait for the start's answer.
The tokenizer refuses a message by ending the stream with an error status instead
of answering, so the refusal is always what the exchange returns, never a message
that races the stream's end.
The stream is carried, with every other sample's, by the tokenizer's one
DetokenizeStream (detokenize_mux.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from services.router.detokenize_mux import DetokenizeMux
from turnout.carried_streams import current_trace_context
from turnout.errors import Unavailable
from turnout.v1 import tokenizer_pb2


class SampleText:
    def __init__(self, streams: DetokenizeMux, start: tokenizer_pb2.DetokenizeStart) -> None:
        self._stream = streams.open()
        self._start = start
        self._verdict: asyncio.Future[tokenizer_pb2.DetokenizeResponse] | None = None

    def open(self) -> asyncio.Future[tokenizer_pb2.DetokenizeResponse]:
        """Send the start now (once). The future is the tokenizer's verdict on it: its refusal is raised
        as the AioRpcError its call would have ended with."""
        if self._verdict is None:
            start = tokenizer_pb2.DetokenizeRequest(start=self._start)
            # The carrier's metadata is not this request's: the trace context rides in the start.
            start.start.trace_context.update(current_trace_context())
            self._verdict = asyncio.ensure_future(self._stream.exchange(start))
        return self._verdict

    async def push(self, token_ids: Iterable[int], *, last: bool) -> tokenizer_pb2.DetokenizeResponse:
        """Every push is answered by exactly one response, so text stays aligned with its tokens."""
        await self.open()
        return await self._stream.exchange_tokens(token_ids, last=last)

    async def push_steps(self, steps: Sequence[Sequence[int]]) -> list[tokenizer_pb2.DetokenizeResponse]:
        """Several engine steps' tokens in one message (none of them the last): each step's answer, as a
        push of it alone would have been, up to the step where a stop matched."""
        await self.open()
        answer = await self._stream.exchange_tokens(
            [t for step in steps for t in step], step_sizes=[len(step) for step in steps]
        )
        if not 0 < len(answer.steps) <= len(steps):
            raise Unavailable(f"the tokenizer answered {len(answer.steps)} steps for {len(steps)}")
        return list(answer.steps)

    def cancel(self) -> None:
        # A verdict still coming is left to come: the request may yet need it (a refusal wins over an
        # engine's failure); its owner cancels it when it does not.
        self._stream.close()
