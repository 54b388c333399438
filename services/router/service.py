"""The Inference gRPC servicer (the public front door): converts and delegates."""

from __future__ import annotations

from collections.abc import AsyncIterator

from grpc import aio

from services.router.engine_pool import EnginePool
from services.router.generate_streams import GenerateStreams
from services.router.generation import generate
from services.router.metrics import RequestMetrics
from services.router.tokenizer_pool import TokenizerClient, TokenizerPool
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2, inference_pb2, inference_pb2_grpc, tokenizer_pb2


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        engines: EnginePool,
        tokenizers: TokenizerPool,
        metrics: RequestMetrics | None = None,
        *,
        log_requests: bool = False,
    ) -> None:
        """`log_requests`: a log line per Generate request at its end (--enable-log-requests)."""
        self._engines = engines
        self._tokenizers = tokenizers
        self._metrics = metrics or RequestMetrics()
        self._log_requests = log_requests
        self.streams = GenerateStreams(self.Generate)

    def drain(self) -> None:
        """The router is stopping: GenerateStream carriers refuse new streams and end once idle."""
        self.streams.drain()

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        generation = generate(request, self._engines, self._tokenizers, log_requests=self._log_requests)
        batches = self._metrics.observe(generation)
        async for batch in batches:
            if request.accept_batches:
                # One message for what was ready together; the caller reads `batch` (inference.proto).
                first = batch[0]
                first.batch.extend(batch[1:])
                yield first
            else:
                for response in batch:
                    yield response

    async def GenerateStream(
        self, requests: AsyncIterator[inference_pb2.GenerateStreamRequest], context: aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateStreamResponse]:
        async for message in self.streams.serve(requests, context):
            yield message

    async def Tokenize(
        self, request: inference_pb2.TokenizeRequest, context: aio.ServicerContext
    ) -> inference_pb2.TokenizeResponse:
        model, _ = self._engines.resolve_model(request.model)  # an adapter tokenizes as its base model
        which = request.WhichOneof("input")
        if which == "text":
            encode = tokenizer_pb2.EncodeRequest(text=request.text)
        elif which == "chat":
            encode = tokenizer_pb2.EncodeRequest(chat=request.chat)
        else:
            raise InvalidArgument("a tokenize request needs `text` or `chat`")
        if request.HasField("add_special_tokens"):
            encode.add_special_tokens = request.add_special_tokens
        return await self._tokenizers.retrying(lambda tokenizer: self._tokenize(tokenizer, request, encode, model))

    @staticmethod
    async def _tokenize(
        tokenizer: TokenizerClient,
        request: inference_pb2.TokenizeRequest,
        encode: tokenizer_pb2.EncodeRequest,
        model: common_pb2.ModelInfo,
    ) -> inference_pb2.TokenizeResponse:
        reply = await tokenizer.encode(encode)
        response = inference_pb2.TokenizeResponse(
            input_ids=reply.input_ids, prompt_text=reply.prompt_text, max_model_len=model.max_context_length
        )
        if request.return_token_strs and reply.input_ids:
            found = await tokenizer.token_texts.of(reply.input_ids)
            response.token_strs.extend(found[token_id][0] for token_id in reply.input_ids)
        return response

    async def Detokenize(
        self, request: inference_pb2.DetokenizeTextRequest, context: aio.ServicerContext
    ) -> inference_pb2.DetokenizeTextResponse:
        self._engines.resolve_model(request.model)
        decode = tokenizer_pb2.DecodeRequest(token_ids=request.token_ids)
        for flag in ("skip_special_tokens", "spaces_between_special_tokens"):
            if request.HasField(flag):
                setattr(decode, flag, getattr(request, flag))
        reply = await self._tokenizers.retrying(lambda tokenizer: tokenizer.Decode(decode))
        return inference_pb2.DetokenizeTextResponse(text=reply.text)

    async def GetTokenizerInfo(
        self, request: inference_pb2.TokenizerInfoRequest, context: aio.ServicerContext
    ) -> common_pb2.TokenizerInfo:
        self._engines.resolve_model(request.model)
        return await self._tokenizers.retrying(
            lambda tokenizer: tokenizer.GetInfo(tokenizer_pb2.GetTokenizerInfoRequest())
        )

    async def ListModels(
        self, request: inference_pb2.ListModelsRequest, context: aio.ServicerContext
    ) -> inference_pb2.ListModelsResponse:
        return inference_pb2.ListModelsResponse(models=self._engines.models())

    async def GetModelInfo(
        self, request: inference_pb2.ModelInfoRequest, context: aio.ServicerContext
    ) -> common_pb2.ModelInfo:
        return self._engines.model_info(request.model)
