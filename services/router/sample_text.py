"""The Detokenize stream of one sample: token ids in, final text (and stop matches) out."""

from __future__ import annotations

from grpc import aio

from turnout.errors import Unavailable
from turnout.v1 import tokenizer_pb2, tokenizer_pb2_grpc


class SampleText:
    def __init__(self, stub: tokenizer_pb2_grpc.TokenizerStub, start: tokenizer_pb2.DetokenizeStart) -> None:
        self._call: aio.StreamStreamCall = stub.Detokenize()
        self._start = start
        self._opened = False

    async def push(self, token_ids: list[int], *, last: bool) -> tokenizer_pb2.DetokenizeResponse:
        """Every push is answered by exactly one response, so text stays aligned with its tokens."""
        if not self._opened:
            await self._call.write(tokenizer_pb2.DetokenizeRequest(start=self._start))
            self._opened = True
        chunk = tokenizer_pb2.DetokenizeTokens(token_ids=token_ids, last=last)
        await self._call.write(tokenizer_pb2.DetokenizeRequest(tokens=chunk))
        response = await self._call.read()
        if response is aio.EOF:
            raise Unavailable("tokenizer closed the detokenize stream early")
        assert isinstance(response, tokenizer_pb2.DetokenizeResponse)
        return response

    def cancel(self) -> None:
        self._call.cancel()
