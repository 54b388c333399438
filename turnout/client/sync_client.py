"""`Client`: blocking calls on the router's Inference service."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc

from turnout.client import results
from turnout.client.requests import Message, Prompt, generate_request, tokenize_request
from turnout.client.results import Completion, Delta, ModelInfo, Tokenized, TurnoutError
from turnout.grpc_auth import sync_channel
from turnout.grpc_server import CHANNEL_OPTIONS
from turnout.security import ClientCredentials, TlsFiles
from turnout.v1 import inference_pb2, inference_pb2_grpc


class GenerateStream:
    """The events of one Generate call: `Delta`s, then one `Completion` per sample.

    `cancel()` (or leaving a `with` block, or closing early) cancels the call, and with it the
    router's and the engine's work; iterating after that raises TurnoutError(CANCELLED).
    """

    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> Iterator[Delta | Completion]:
        for response in self._responses():
            yield results.event(response)

    def _responses(self) -> Iterator[inference_pb2.GenerateResponse]:
        """Every response in order, a batch (what the router had ready while this reader lagged) unpacked."""
        try:
            for message in self._call:
                yield from results.unbatched(message)
        except grpc.RpcError as exc:
            raise TurnoutError.of(exc) from None
        finally:
            # Reached on normal end (a no-op then), on an error and when the consumer stops early.
            self._call.cancel()

    def cancel(self) -> None:
        self._call.cancel()

    def __enter__(self) -> GenerateStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class Client:
    """The router's `turnout.v1.Inference` service over one channel; `timeout_s` is every call's deadline."""

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
        self._channel = sync_channel(address, ClientCredentials(bearer=api_key, tls=tls), CHANNEL_OPTIONS)
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)
        self._timeout_s = timeout_s

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
    ) -> GenerateStream:
        """Start generating from text, token ids or chat `messages`; `sampling` takes the
        SamplingParams fields by name (max_new_tokens=, temperature=, n=, stop=[...], ...)."""
        request = generate_request(
            prompt,
            messages=messages,
            model=model,
            request_id=request_id or uuid.uuid4().hex,
            chat_options=chat_options,
            logprobs=logprobs,
            sampling=sampling,
        )
        request.accept_batches = True  # what is ready comes in one message (GenerateStream unpacks it)
        return GenerateStream(self._stub.Generate(request, timeout=self._timeout_s))

    def generate(self, prompt: Prompt = None, **kwargs: Any) -> list[Completion]:
        """Generate to the end: one Completion per sample (`n`), with its text and token ids."""
        collector = results.Collector()
        for response in self.generate_stream(prompt, **kwargs)._responses():
            collector.add(response)
        return collector.results()

    def tokenize(
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
        return results.tokenized(self._call(self._stub.Tokenize, request))

    def detokenize(self, token_ids: Sequence[int], *, model: str = "", skip_special_tokens: bool | None = None) -> str:
        request = inference_pb2.DetokenizeTextRequest(model=model, token_ids=token_ids)
        if skip_special_tokens is not None:
            request.skip_special_tokens = skip_special_tokens
        return str(self._call(self._stub.Detokenize, request).text)

    def list_models(self) -> list[ModelInfo]:
        reply = self._call(self._stub.ListModels, inference_pb2.ListModelsRequest())
        return [results.model_info(m) for m in reply.models]

    def model_info(self, model: str = "") -> ModelInfo:
        """The named model, or the default one."""
        return results.model_info(self._call(self._stub.GetModelInfo, inference_pb2.ModelInfoRequest(model=model)))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            raise TurnoutError.of(exc) from None
