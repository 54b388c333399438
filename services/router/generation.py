"""One Generate request through the stack:

    encode (tokenizer) -> Engine.Generate (token ids) -> Detokenize streams (text, stop strings,
    reasoning, tool calls) -> caller

Every engine chunk of a sample (one engine step's tokens) gets exactly one Detokenize
answer, so text deltas stay aligned with their token ids and log-probabilities. The
engine batches the steps that were ready while its reader lagged into one message,
and the router takes every engine message that arrived while it was busy at once
(dispatch.EngineStream, engine_mux.MuxedCall.ready); it sends each sample's
consecutive chunks in one Detokenize exchange (one answer per step,
DetokenizeTokens.step_sizes) and yields all the responses
made of those messages together (sent as one message to a caller that accepts
batches). Nothing waits for more: a batch is only what was already there. A
matched stop string or regex ends its sample (the engine is told to abort just
that sample); once every sample has ended the engine call is cancelled.
Leaving this generator early (the caller went away) cancels the engine call
and the Detokenize streams the same way.

Tool calling: REQUIRED / NAMED constrain the engine to a JSON form (tool_constraint);
every sample's Detokenize stream reads reasoning and tool calls out of its own text.

A request with `pooling` (an embedding) generates nothing: the engine's one Complete carries the
pooled vector, passed on as GenerateComplete.embedding.

best_of > n: all best_of samples are generated and held back; the n with the
highest cumulative log-probability are then sent, renumbered 0 .. n-1. Not so
for beam search, where best_of is the beam width: the engine sends only the n
best beams, whole, when its search ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator

from grpc import aio
from opentelemetry import trace

from services.router import dispatch
from services.router.engine_pool import EnginePool
from services.router.logprob_text import fill_texts
from services.router.prompt import Prompt, encode_prompt, encode_sampling_strings
from services.router.sample_text import SampleText
from services.router.tokenizer_pool import TokenizerClient, TokenizerPool, is_unreachable
from services.router.tool_constraint import constrain_for_tools
from turnout.errors import status_of
from turnout.telemetry.request_context import set_request_id
from turnout.v1 import common_pb2, engine_pb2, inference_pb2, tokenizer_pb2

log = logging.getLogger(__name__)

# Prompt tokens sent to the detokenizer as left context for the first output token's spacing.
PROMPT_CONTEXT_TOKENS = 8


def _stop_token_trimmed(finish: common_pb2.FinishReason, params: common_pb2.SamplingParams) -> bool:
    """Whether the last token is a matched stop or EOS token whose text must not appear. A stop with
    nothing matched is a grammar that ended, which it does on accepting its stop token (an EOS): that
    token is no more text than a matched EOS (`skip_special_tokens: false` would show it)."""
    return (
        finish.WhichOneof("kind") == "stop"
        and finish.stop.WhichOneof("matched") in ("token_id", "eos_token_id", None)
        and not params.no_stop_trim
    )


def _asks_logprobs(options: common_pb2.LogprobOptions) -> bool:
    return options.return_logprob or options.top_logprobs_num > 0 or len(options.token_ids_logprob) > 0


async def generate(
    request: inference_pb2.GenerateRequest,
    engines: EnginePool,
    tokenizers: TokenizerPool,
    *,
    log_requests: bool = False,
) -> AsyncIterator[list[inference_pb2.GenerateResponse]]:
    """The request's responses, in batches: those made of one engine message (one step's output, or all
    the steps that were ready when the engine's reader lagged) come together. A tokenizer that went
    away before anything was sent (it died after it was picked) costs one more try on a newly picked
    one; later, a clear UNAVAILABLE. `log_requests`: the request's line at its end (--enable-log-requests)."""
    for attempt in range(2):
        sent = False
        try:
            async for batch in _generate_once(request, engines, await tokenizers.pick(), log_requests):
                sent = True
                yield batch
            return
        except aio.AioRpcError as exc:
            # Engine failures reach here as TurnoutErrors (dispatch) or as non-retryable codes, so an
            # UNAVAILABLE before output is the tokenizer's.
            if not is_unreachable(exc):
                raise
            if sent or attempt:
                raise tokenizers.lost(exc) from None
            log.warning("tokenizer unreachable before output; trying again", extra={"error": exc.details()})


async def _generate_once(
    request: inference_pb2.GenerateRequest, engines: EnginePool, tokenizer: TokenizerClient, log_requests: bool
) -> AsyncIterator[list[inference_pb2.GenerateResponse]]:
    # The caller's id is shown (logs, traces, the tokenizer's logs); the engine keys requests by a
    # unique one, so two concurrent requests may share an id (as in vLLM).
    request_id = request.request_id or uuid.uuid4().hex
    engine_request_id = f"{request_id}-{uuid.uuid4().hex[:12]}" if request.request_id else request_id
    set_request_id(request_id)
    # `model` may name a LoRA adapter (vLLM); `lora_name` (SGLang lora_path) names one explicitly.
    model, lora_name = engines.resolve_model(request.model)
    lora_name = request.lora_name or lora_name
    # Checked before any tokenizer or engine work: a bad tool request costs nothing.
    params = constrain_for_tools(request, request.sampling_params)
    prompt = await encode_prompt(request, tokenizer)
    input_ids = prompt.ids
    params = await encode_sampling_strings(params, tokenizer)
    n = params.n if params.HasField("n") else 1
    best_of = params.best_of if params.HasField("best_of") else n
    # A beam search's engine returns its n best beams, ranked already.
    ranking = best_of > n and not params.use_beam_search
    options = common_pb2.LogprobOptions()
    options.CopyFrom(request.logprob_options)
    if ranking:
        options.return_logprob = True  # the ranking sums the sampled tokens' log-probabilities
    engine_request = engine_pb2.EngineGenerateRequest(
        request_id=engine_request_id,
        external_request_id=request_id,
        input_ids=input_ids,
        sampling_params=params,
        logprob_options=options,
        lora_name=lora_name,
    )
    if request.HasField("priority"):
        engine_request.priority = request.priority
    if request.HasField("pooling"):
        engine_request.pooling.CopyFrom(request.pooling)
    engine_request.return_hidden_states = request.return_hidden_states
    span = trace.get_current_span()
    span.set_attribute("turnout.request_id", request_id)
    span.set_attribute("turnout.prompt_tokens", len(input_ids))

    start = _detokenize_start(request_id, prompt, params, request)
    samples = _Samples(engines, model.name, tokenizer, start, params, best_of if ranking else n)
    started, status = time.perf_counter(), "CANCELLED"  # left early: the caller went away
    try:
        responses = _checked_by_tokenizer(
            samples, _responses(request, engine_request, tokenizer, samples, ranking, n, best_of)
        )
        async with contextlib.aclosing(responses):
            async for batch in responses:
                yield batch
        status = "OK"
    except Exception as exc:
        code = status_of(exc)
        status = code.name if code is not None else "INTERNAL"
        raise
    finally:
        # The request's one line, when asked for (a line costs ~0.1 ms of the router's CPU, a fifth of a
        # short request's): what was asked, where it ran and why, how it ended.
        if log_requests:
            _log_request(request_id, engine_request_id, samples, len(input_ids), status, time.perf_counter() - started)


def _log_request(
    request_id: str, engine_request_id: str, samples: _Samples, prompt_tokens: int, status: str, seconds: float
) -> None:
    log.info(
        "generated",
        extra={
            "request_id": request_id,
            "engine_request_id": engine_request_id,
            "engine": samples.engine_address,
            "route": samples.route_reason,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": samples.completion_tokens,
            "status": status,
            "seconds": round(seconds, 4),
        },
    )


async def _checked_by_tokenizer(
    samples: _Samples, responses: AsyncGenerator[list[inference_pb2.GenerateResponse], None]
) -> AsyncGenerator[list[inference_pb2.GenerateResponse], None]:
    """`responses` (the engine's part), run while the tokenizer checks sample 0's Detokenize start."""
    # The tokenizer checks the start (it refuses a stop regex that does not compile, AUTO without
    # --tool-call-parser) while the engine starts: one router-tokenizer round trip less before the first
    # token. Tokens wait for its answer, a refusal ends the engine's call at once, and it wins over an
    # engine's failure meanwhile, as when the engine waited for it.
    verdict = samples.open_first()

    def on_verdict(verdict: asyncio.Future[tokenizer_pb2.DetokenizeResponse]) -> None:
        if _refused(verdict) is not None:
            samples.stop_engine()

    verdict.add_done_callback(on_verdict)
    try:
        async with contextlib.aclosing(responses):
            async for batch in responses:
                yield batch
    except Exception:
        if not verdict.done():
            await asyncio.wait([verdict])
        refusal = _refused(verdict)
        if refusal is not None:
            raise refusal from None
        raise
    finally:
        verdict.cancel()  # nothing once answered


def _refused(verdict: asyncio.Future[tokenizer_pb2.DetokenizeResponse]) -> BaseException | None:
    return None if verdict.cancelled() else verdict.exception()


async def _responses(
    request: inference_pb2.GenerateRequest,
    engine_request: engine_pb2.EngineGenerateRequest,
    tokenizer: TokenizerClient,
    samples: _Samples,
    ranking: bool,
    n: int,
    best_of: int,
) -> AsyncGenerator[list[inference_pb2.GenerateResponse], None]:
    with_texts = request.logprob_options.return_text_in_logprobs
    keep_logprobs = _asks_logprobs(request.logprob_options)
    # The prompt's ids go with the first response only.
    prompt_ids = list(engine_request.input_ids) if request.return_prompt_token_ids else []
    if not ranking:
        async for batch in samples.run(engine_request):
            if with_texts:
                for response in batch:
                    await _fill_texts(tokenizer, response)
            batch[0].prompt_token_ids.extend(prompt_ids)
            prompt_ids = []
            yield batch
        return

    held: dict[int, list[inference_pb2.GenerateResponse]] = defaultdict(list)
    scores: dict[int, float] = defaultdict(float)
    async for batch in samples.run(engine_request):
        for response in batch:
            part = response.chunk if response.WhichOneof("kind") == "chunk" else response.complete
            held[part.index].append(response)
            if response.WhichOneof("kind") == "chunk":
                scores[part.index] += sum(p.token.logprob for p in response.chunk.logprobs)
    best = sorted(range(best_of), key=lambda i: (-scores[i], i))[:n]
    for new_index, old_index in enumerate(best):
        for response in held[old_index]:
            part = response.chunk if response.WhichOneof("kind") == "chunk" else response.complete
            part.index = new_index
            if not keep_logprobs and response.WhichOneof("kind") == "chunk":
                del response.chunk.logprobs[:]
            if with_texts:
                await _fill_texts(tokenizer, response)
            response.prompt_token_ids.extend(prompt_ids)
            prompt_ids = []
            yield [response]


def _detokenize_start(
    request_id: str, prompt: Prompt, params: common_pb2.SamplingParams, request: inference_pb2.GenerateRequest
) -> tokenizer_pb2.DetokenizeStart:
    start = tokenizer_pb2.DetokenizeStart(
        request_id=request_id,
        prompt_ids=prompt.ids[-PROMPT_CONTEXT_TOKENS:],
        stop=params.stop,
        stop_regex=params.stop_regex,
        no_stop_trim=params.no_stop_trim,
        separate_reasoning=request.separate_reasoning,
        thinking_open=prompt.thinking_open,
        thinking_off=prompt.thinking_off,
        tool_calling=request.tool_calling,
    )
    for flag in ("skip_special_tokens", "spaces_between_special_tokens"):
        if params.HasField(flag):
            setattr(start, flag, getattr(params, flag))
    return start


async def _fill_texts(tokenizer: TokenizerClient, response: inference_pb2.GenerateResponse) -> None:
    if response.WhichOneof("kind") == "chunk":
        await fill_texts(tokenizer.token_texts, response.chunk.logprobs)
    else:
        await fill_texts(tokenizer.token_texts, response.complete.input_logprobs)


class _Samples:
    """The engine call of one request and the Detokenize stream of each of its samples."""

    def __init__(
        self,
        engines: EnginePool,
        model_name: str,
        tokenizer: TokenizerClient,
        start: tokenizer_pb2.DetokenizeStart,
        params: common_pb2.SamplingParams,
        num_samples: int,
    ) -> None:
        self._engines = engines
        self._model_name = model_name
        self._call: dispatch.EngineStream | None = None
        self._tokenizer = tokenizer
        self._start = start
        self._params = params
        self._num_samples = num_samples
        self._texts: dict[int, SampleText] = {}
        self._ended: set[int] = set()
        # Prompt log-probabilities, sent by the engine once; every sample's Complete carries them.
        self._input_logprobs: list[common_pb2.PositionLogprobs] = []
        # Tokens of the samples that have ended (the request's log line).
        self.completion_tokens = 0

    @property
    def engine_address(self) -> str:
        """The engine the request ran on (its last attempt's), "" before one was picked."""
        engine = self._call.engine if self._call is not None else None
        return engine.address if engine is not None else ""

    @property
    def route_reason(self) -> str:
        """Why the policy picked that engine (cache_hit, cache_miss, ...)."""
        return self._call.route_reason if self._call is not None else ""

    def _text(self, index: int) -> SampleText:
        # Not setdefault(): building a SampleText opens a Detokenize stream.
        if index not in self._texts:
            self._texts[index] = SampleText(self._tokenizer.texts, self._start)
        return self._texts[index]

    def open_first(self) -> asyncio.Future[tokenizer_pb2.DetokenizeResponse]:
        """Send sample 0's Detokenize start now; the future is the tokenizer's verdict on it."""
        return self._text(0).open()

    def stop_engine(self) -> None:
        """End the engine's call now, or keep it from being made (the request is refused)."""
        if self._call is not None:
            self._call.cancel()

    async def run(
        self, engine_request: engine_pb2.EngineGenerateRequest
    ) -> AsyncIterator[list[inference_pb2.GenerateResponse]]:
        """The responses made of the engine messages that were ready together, in one list. Each sample's
        consecutive chunks among them (steps that were ready together) cost one Detokenize exchange."""
        # Picks the engine; retries one that fails before output elsewhere, turns a later failure into aborts.
        async with dispatch.open_stream(self._engines, self._model_name, engine_request) as call:
            self._call = call
            try:
                async for messages in call:
                    out = await self._on_messages(engine_request.request_id, messages)
                    if out:
                        yield out
                    if len(self._ended) >= self._num_samples:
                        break
            finally:
                call.cancel()
                for text in self._texts.values():
                    text.cancel()

    async def _on_messages(
        self, request_id: str, messages: list[engine_pb2.EngineGenerateResponse]
    ) -> list[inference_pb2.GenerateResponse]:
        parts = [part for message in messages for part in (message, *message.batch)]
        out: list[inference_pb2.GenerateResponse] = []
        i = 0
        while i < len(parts) and len(self._ended) < self._num_samples:
            if parts[i].WhichOneof("kind") == "complete":
                await self._on_complete(parts[i].complete, out)
                i += 1
                continue
            index, j = parts[i].chunk.index, i + 1
            while j < len(parts) and parts[j].WhichOneof("kind") == "chunk" and parts[j].chunk.index == index:
                j += 1
            await self._on_chunks(request_id, [p.chunk for p in parts[i:j]], out)
            i = j
        return out

    async def _on_chunks(
        self, request_id: str, chunks: list[engine_pb2.EngineChunk], out: list[inference_pb2.GenerateResponse]
    ) -> None:
        """Consecutive steps' chunks of one sample: each gets the chunk it would have had alone."""
        self._input_logprobs = self._input_logprobs or list(chunks[0].input_logprobs)
        index = chunks[0].index
        if index in self._ended:
            return
        text = self._text(index)
        if len(chunks) == 1:
            texts = [await text.push(chunks[0].token_ids, last=False)]
        else:
            texts = await text.push_steps([c.token_ids for c in chunks])
        for chunk, step in zip(chunks, texts, strict=False):  # the answers stop at a matched stop
            matched = _matched(step)
            last = matched is not None
            out.append(
                _chunk(index, step, chunk.token_ids, chunk.logprobs, chunk, last=last, hidden=chunk.hidden_states)
            )
            if matched is not None:
                await self._end_on_stop(request_id, chunk, step, matched, out)
                return

    async def _end_on_stop(
        self,
        request_id: str,
        chunk: engine_pb2.EngineChunk,
        text: tokenizer_pb2.DetokenizeResponse,
        matched: common_pb2.FinishReason,
        out: list[inference_pb2.GenerateResponse],
    ) -> None:
        self._ended.add(chunk.index)
        usage = common_pb2.Usage(
            prompt_tokens=chunk.prompt_tokens,
            completion_tokens=chunk.completion_tokens,
            cached_tokens=chunk.cached_tokens,
            reasoning_tokens=text.reasoning_tokens,
        )
        self.completion_tokens += usage.completion_tokens
        out.append(_complete(chunk.index, matched, usage, self._input_logprobs))
        engine = self._call.engine if self._call is not None else None
        if len(self._ended) < self._num_samples and engine is not None:
            # Only this sample is over: free its KV blocks while the others go on.
            try:
                await engine.stub.Abort(engine_pb2.AbortRequest(request_id=request_id, indices=[chunk.index]))
            except aio.AioRpcError as exc:
                # Best effort: an engine that cannot take it fails its stream too, which dispatch reports.
                log.warning("abort of a finished sample failed", extra={"error": exc.details()})

    async def _on_complete(self, done: engine_pb2.EngineComplete, out: list[inference_pb2.GenerateResponse]) -> None:
        self._input_logprobs = self._input_logprobs or list(done.input_logprobs)
        if done.index in self._ended:
            return
        self._ended.add(done.index)
        ids = list(done.token_ids)
        feed = ids[:-1] if ids and _stop_token_trimmed(done.finish_reason, self._params) else ids
        text = await self._text(done.index).push(feed, last=True)
        finish = _matched(text) or done.finish_reason
        usage = common_pb2.Usage()
        usage.CopyFrom(done.usage)
        if text.reasoning_tokens:
            usage.reasoning_tokens = text.reasoning_tokens
        self.completion_tokens += usage.completion_tokens
        if ids or text.text or text.reasoning_text or text.tool_calls or done.hidden_states:
            out.append(_chunk(done.index, text, ids, done.logprobs, usage, last=True, hidden=done.hidden_states))
        out.append(_complete(done.index, finish, usage, self._input_logprobs, done.embedding))


def _matched(text: tokenizer_pb2.DetokenizeResponse) -> common_pb2.FinishReason | None:
    if text.HasField("matched_stop"):
        return common_pb2.FinishReason(stop=common_pb2.FinishReason.Stop(stop_str=text.matched_stop))
    if text.HasField("matched_regex"):
        return common_pb2.FinishReason(stop=common_pb2.FinishReason.Stop(regex=text.matched_regex))
    return None


def _chunk(
    index: int,
    text: tokenizer_pb2.DetokenizeResponse,
    token_ids: object,
    logprobs: object,
    counts: engine_pb2.EngineChunk | common_pb2.Usage,
    last: bool = False,
    hidden: object = (),
) -> inference_pb2.GenerateResponse:
    """A chunk of one sample: the tokenizer's text, reasoning and tool calls, with the engine's tokens and counts.
    `last`: the sample's Complete is sent right after it. Filled in place, lists only when not empty (one per
    step of every sample: a nested message built from keywords and copied in costs about twice as much)."""
    response = inference_pb2.GenerateResponse()
    chunk = response.chunk
    chunk.index = index
    chunk.text = text.text
    chunk.reasoning_tokens = text.reasoning_tokens
    chunk.token_ids.extend(token_ids)  # type: ignore[call-overload]
    chunk.prompt_tokens = counts.prompt_tokens
    chunk.completion_tokens = counts.completion_tokens
    chunk.cached_tokens = counts.cached_tokens
    chunk.last = last
    if text.reasoning_text:
        chunk.reasoning_text = text.reasoning_text
    if text.tool_calls:
        chunk.tool_calls.extend(text.tool_calls)
    if logprobs:
        chunk.logprobs.extend(logprobs)  # type: ignore[call-overload]
    if hidden:
        chunk.hidden_states.extend(hidden)  # type: ignore[call-overload]
    return response


def _complete(
    index: int,
    finish: common_pb2.FinishReason,
    usage: common_pb2.Usage,
    input_logprobs: object,
    embedding: object = (),
) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(
        complete=inference_pb2.GenerateComplete(
            index=index,
            finish_reason=finish,
            usage=usage,
            input_logprobs=input_logprobs,  # type: ignore[arg-type]
            embedding=embedding,  # type: ignore[arg-type]
        )
    )
