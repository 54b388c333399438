"""One Generate request through the stack:

    encode (tokenizer) -> Engine.Generate (token ids) -> Detokenize stream (text, stop strings) -> caller

Every engine chunk of a sample is answered by exactly one Detokenize response,
so text deltas stay aligned with their token ids. A matched stop string ends
the sample; once every sample has ended the engine call is cancelled, which
aborts the request in the engine. Leaving this generator early (the caller
went away) cancels the engine call and the Detokenize streams the same way.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

from grpc import aio

from services.router import dispatch
from services.router.engine_pool import EnginePool
from services.router.tokenizer_pool import TokenizerPool
from turnout.errors import InvalidArgument, Unavailable
from turnout.v1 import common_pb2, engine_pb2, inference_pb2, tokenizer_pb2, tokenizer_pb2_grpc

log = logging.getLogger(__name__)

# Prompt tokens sent to the detokenizer as left context for the first output token's spacing.
PROMPT_CONTEXT_TOKENS = 8


class SampleText:
    """The Detokenize stream of one sample."""

    def __init__(self, stub: tokenizer_pb2_grpc.TokenizerStub, start: tokenizer_pb2.DetokenizeStart) -> None:
        self._call: aio.StreamStreamCall = stub.Detokenize()
        self._start = start
        self._opened = False

    async def push(self, token_ids: list[int], *, last: bool) -> tokenizer_pb2.DetokenizeResponse:
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


async def encode_prompt(request: inference_pb2.GenerateRequest, tokenizers: TokenizerPool) -> list[int]:
    which = request.WhichOneof("input")
    if which == "input_ids":
        if not request.input_ids.ids:
            raise InvalidArgument("input_ids must not be empty")
        return list(request.input_ids.ids)
    if which == "text":
        if not request.text:
            raise InvalidArgument("the prompt text must not be empty")
        add_special = request.add_special_tokens if request.HasField("add_special_tokens") else True
        encode = tokenizer_pb2.EncodeRequest(text=request.text, add_special_tokens=add_special)
    elif which == "chat":
        encode = tokenizer_pb2.EncodeRequest(chat=request.chat)
        if request.HasField("add_special_tokens"):
            encode.add_special_tokens = request.add_special_tokens
    else:
        raise InvalidArgument("a generate request needs `text`, `input_ids` or `chat`")
    reply = await tokenizers.pick().Encode(encode)
    if not reply.input_ids:
        raise InvalidArgument("the prompt encodes to no tokens")
    return list(reply.input_ids)


def _stop_token_trimmed(finish: common_pb2.FinishReason, params: common_pb2.SamplingParams) -> bool:
    """Whether the last token is a matched stop token whose text must not appear."""
    return (
        finish.WhichOneof("kind") == "stop"
        and finish.stop.WhichOneof("matched") == "token_id"
        and not params.no_stop_trim
    )


async def generate(
    request: inference_pb2.GenerateRequest, engines: EnginePool, tokenizers: TokenizerPool
) -> AsyncIterator[inference_pb2.GenerateResponse]:
    model = engines.model_info(request.model)
    input_ids = await encode_prompt(request, tokenizers)
    params = request.sampling_params
    request_id = request.request_id or uuid.uuid4().hex
    engine_request = engine_pb2.EngineGenerateRequest(
        request_id=request_id,
        input_ids=input_ids,
        sampling_params=params,
        logprob_options=request.logprob_options,
    )
    if request.HasField("priority"):
        engine_request.priority = request.priority
    start = tokenizer_pb2.DetokenizeStart(
        request_id=request_id,
        prompt_ids=input_ids[-PROMPT_CONTEXT_TOKENS:],
        stop=params.stop,
        no_stop_trim=params.no_stop_trim,
    )
    for flag in ("skip_special_tokens", "spaces_between_special_tokens"):
        if params.HasField(flag):
            setattr(start, flag, getattr(params, flag))
    log.info("generate", extra={"request_id": request_id, "prompt_tokens": len(input_ids)})

    tokenizer = tokenizers.pick()
    samples: dict[int, SampleText] = {}
    ended: set[int] = set()
    num_samples = params.n if params.HasField("n") else 1
    # Picks the engine; retries one that fails before output elsewhere, turns a later failure into aborts.
    async with dispatch.open_stream(engines, model.name, engine_request) as call:
        try:
            async for response in call:
                if response.WhichOneof("kind") == "chunk":
                    chunk = response.chunk
                    if chunk.index in ended:
                        continue
                    # Not setdefault(): its argument would open a new Detokenize stream for every chunk.
                    sample = samples.get(chunk.index) or samples.setdefault(chunk.index, SampleText(tokenizer, start))
                    text = await sample.push(list(chunk.token_ids), last=False)
                    yield _chunk(chunk.index, text.text, chunk.token_ids, chunk)
                    if text.HasField("matched_stop"):
                        ended.add(chunk.index)
                        usage = common_pb2.Usage(
                            prompt_tokens=chunk.prompt_tokens,
                            completion_tokens=chunk.completion_tokens,
                            cached_tokens=chunk.cached_tokens,
                        )
                        yield _complete(chunk.index, _stop_str(text.matched_stop), usage)
                else:
                    done = response.complete
                    if done.index in ended:
                        continue
                    ended.add(done.index)
                    sample = samples.get(done.index) or samples.setdefault(done.index, SampleText(tokenizer, start))
                    ids = list(done.token_ids)
                    feed = ids[:-1] if ids and _stop_token_trimmed(done.finish_reason, params) else ids
                    text = await sample.push(feed, last=True)
                    finish = _stop_str(text.matched_stop) if text.HasField("matched_stop") else done.finish_reason
                    if ids or text.text:
                        yield _chunk(done.index, text.text, ids, done.usage)
                    yield _complete(done.index, finish, done.usage)
                if len(ended) >= num_samples:
                    break
        finally:
            call.cancel()
            for sample in samples.values():
                sample.cancel()


def _stop_str(matched: str) -> common_pb2.FinishReason:
    return common_pb2.FinishReason(stop=common_pb2.FinishReason.Stop(stop_str=matched))


def _chunk(
    index: int,
    text: str,
    token_ids: object,
    counts: engine_pb2.EngineChunk | common_pb2.Usage,
) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(
        chunk=inference_pb2.GenerateChunk(
            index=index,
            text=text,
            token_ids=token_ids,  # type: ignore[arg-type]
            prompt_tokens=counts.prompt_tokens,
            completion_tokens=counts.completion_tokens,
            cached_tokens=counts.cached_tokens,
        )
    )


def _complete(index: int, finish: common_pb2.FinishReason, usage: common_pb2.Usage) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(
        complete=inference_pb2.GenerateComplete(index=index, finish_reason=finish, usage=usage)
    )
