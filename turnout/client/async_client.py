"""`AsyncClient`: the same calls as `Client`, over asyncio.

Its Generate calls are carried by one `Inference.GenerateStream` (turnout/generate_carrier.py, as the
gateway carries its HTTP requests): what the router has ready for all of a client's concurrent requests
comes as one message, where a call per request costs the router and this process a call's set-up and a
message per step of each (docs/grpc.md). Each stream still reads, fails, times out and cancels as its own
call would.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc
from grpc import aio

from turnout.client import results
from turnout.client.requests import Message, Prompt, generate_request, tokenize_request
from turnout.client.results import Completion, Delta, ModelInfo, Tokenized, TurnoutError
from turnout.generate_carrier import CarriedGenerate, GenerateCarrier
from turnout.grpc_server import client_channel
from turnout.security import ClientCredentials, TlsFiles
from turnout.v1 import inference_pb2, inference_pb2_grpc


class AsyncGenerateStream:
    """The events of one Generate stream (`async for`). `cancel()`, leaving an `async with` block,
    closing early or cancelling the task that reads it cancels the request end to end."""

    def __init__(self, call: CarriedGenerate) -> None:
        self._call = call

    async def __aiter__(self) -> AsyncIterator[Delta | Completion]:
        # Closed with this generator, not when the garbage collector gets to it: its close cancels the request.
        async with contextlib.aclosing(self._responses()) as responses:
            async for response in responses:
                yield results.event(response)

    async def _responses(self) -> AsyncGenerator[inference_pb2.GenerateResponse, None]:
        """Every response in order, a batch (what the router had ready together) unpacked."""
        try:
            while (message := await self._call.read()) is not None:
                for response in results.unbatched(message):
                    yield response
        except grpc.RpcError as exc:
            raise TurnoutError.of(exc) from None
        finally:
            self._call.cancel()

    def cancel(self) -> None:
        self._call.cancel()

    async def __aenter__(self) -> AsyncGenerateStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


class AsyncClient:
    """The router's `turnout.v1.Inference` service over one asyncio channel."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float | None = None,
        api_key: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        """`api_key`: sent as `authorization: Bearer` on every call (the router's --api-key);
        `tls`: connect over TLS, verified with its CA (mutual TLS with its certificate and key)."""
        self._channel = client_channel(address, ClientCredentials(bearer=api_key, tls=tls))
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)
        self._timeout_s = timeout_s
        self._carrier = GenerateCarrier(self._stub)

    def generate_stream(
        self,
        prompt: Prompt = None,
        *,
        messages: Sequence[Message] | None = None,
        model: str = "",
        request_id: str | None = None,
        chat_options: Mapping[str, Any] | None = None,
        logprobs: Mapping[str, Any] | None = None,
        **sampling: Any,
    ) -> AsyncGenerateStream:
        """As `Client.generate_stream`; the request starts at once."""
        request = generate_request(
            prompt,
            messages=messages,
            model=model,
            request_id=request_id or uuid.uuid4().hex,
            chat_options=chat_options,
            logprobs=logprobs,
            sampling=sampling,
        )
        request.accept_batches = True  # what is ready comes in one message (AsyncGenerateStream unpacks it)
        return AsyncGenerateStream(self._carrier.generate(request, self._timeout_s))

    async def generate(self, prompt: Prompt = None, **kwargs: Any) -> list[Completion]:
        collector = results.Collector()
        async for response in self.generate_stream(prompt, **kwargs)._responses():
            collector.add(response)
        return collector.results()

    async def tokenize(
        self,
        text: str | None = None,
        *,
        messages: Sequence[Message] | None = None,
        model: str = "",
        add_special_tokens: bool | None = None,
        chat_options: Mapping[str, Any] | None = None,
        return_token_strs: bool = False,
    ) -> Tokenized:
        request = tokenize_request(text, messages, model, add_special_tokens, chat_options, return_token_strs)
        return results.tokenized(await self._call(self._stub.Tokenize, request))

    async def detokenize(
        self, token_ids: Sequence[int], *, model: str = "", skip_special_tokens: bool | None = None
    ) -> str:
        request = inference_pb2.DetokenizeTextRequest(model=model, token_ids=token_ids)
        if skip_special_tokens is not None:
            request.skip_special_tokens = skip_special_tokens
        return str((await self._call(self._stub.Detokenize, request)).text)

    async def list_models(self) -> list[ModelInfo]:
        reply = await self._call(self._stub.ListModels, inference_pb2.ListModelsRequest())
        return [results.model_info(m) for m in reply.models]

    async def model_info(self, model: str = "") -> ModelInfo:
        reply = await self._call(self._stub.GetModelInfo, inference_pb2.ModelInfoRequest(model=model))
        return results.model_info(reply)

    async def close(self) -> None:
        await self._carrier.close()
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self._timeout_s)
        except aio.AioRpcError as exc:
            raise TurnoutError.of(exc) from None
