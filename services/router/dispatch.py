"""Running one engine request on the pool: admission, choice of engine, retries, failover.

    async with dispatch.open_stream(pool, model, engine_request) as call:
        async for responses in call: ...     # the engine's EngineGenerateResponses, in lists of those
                                             # that arrived while the reader was busy

- A concurrency slot (`Admission`) is held for the whole stream.
- The policy picks among the routable engines serving the model; none: UNAVAILABLE.
- An attempt that fails before the engine sent anything (refused connection,
  engine shutting down, engine queue full, internal error) is retried on another
  engine, preferring ones not tried yet, after a backoff, up to `max_retries`
  times. Nothing reached the caller, so nothing is duplicated.
- Once output has flowed, a failure ends every unfinished sample with a
  `FinishReason.abort` naming the engine and the error: the caller sees an
  explicit abort, never a stream that just stops.
- The engine's in-flight count is held for the life of each attempt and
  released on completion, error and cancellation alike (`EngineClient.track`).

The engine's own verdicts (INVALID_ARGUMENT for a prompt that cannot fit,
NOT_FOUND, ...) pass through unchanged: another engine would say the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

import grpc
from grpc import aio
from opentelemetry import trace

from services.router.engine_mux import MuxedCall
from services.router.engine_pool import EngineClient, EnginePool
from services.router.policies import routing_key
from turnout.carried_streams import call_error, current_trace_context
from turnout.errors import ResourceExhausted, Unavailable
from turnout.v1 import common_pb2, engine_pb2

log = logging.getLogger(__name__)

# Failures that say something is wrong with the engine: they count against its circuit breaker.
ENGINE_FAULTS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
    }
)
# Failures before any output that another engine may not have: retried elsewhere.
RETRYABLE = ENGINE_FAULTS | {grpc.StatusCode.RESOURCE_EXHAUSTED}


@dataclass
class _Progress:
    """Which samples of the request have ended, and the last chunk (its counts) of each."""

    num_samples: int
    ended: set[int] = field(default_factory=set)
    last_chunks: dict[int, engine_pb2.EngineChunk] = field(default_factory=dict)
    # One sample: the last message with a chunk (its last part is the sample's last chunk), looked into
    # only when the request is aborted. Every engine message of every request is observed, and going
    # through each of its parts cost 0.75 us a part.
    _latest: engine_pb2.EngineGenerateResponse | None = None

    def observe(self, response: engine_pb2.EngineGenerateResponse) -> None:
        if self.num_samples == 1:
            # A sample's Complete is its last output: the last part of the last message.
            if _last_part(response).WhichOneof("kind") == "complete":
                self.ended.add(0)
            else:
                self._latest = response
            return
        for part in (response, *response.batch) if response.batch else (response,):
            if part.WhichOneof("kind") == "chunk":
                self.last_chunks[part.chunk.index] = part.chunk
            else:
                self.ended.add(part.complete.index)

    @property
    def done(self) -> bool:
        return len(self.ended) >= self.num_samples

    def aborts(self, message: str) -> list[engine_pb2.EngineGenerateResponse]:
        """One `abort` Complete for every sample that has not ended."""
        finish = common_pb2.FinishReason(abort=common_pb2.FinishReason.Abort(message=message))
        return [
            engine_pb2.EngineGenerateResponse(
                complete=engine_pb2.EngineComplete(index=i, finish_reason=finish, usage=self._usage(i))
            )
            for i in range(self.num_samples)
            if i not in self.ended
        ]

    def _usage(self, index: int) -> common_pb2.Usage | None:
        c = _last_part(self._latest).chunk if self._latest is not None else self.last_chunks.get(index)
        if c is None:
            return None
        return common_pb2.Usage(
            prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens, cached_tokens=c.cached_tokens
        )


def _last_part(response: engine_pb2.EngineGenerateResponse) -> engine_pb2.EngineGenerateResponse:
    return response.batch[-1] if response.batch else response


class EngineStream:
    """The responses of one engine request, wherever it ends up running."""

    def __init__(self, pool: EnginePool, model_name: str, request: engine_pb2.EngineGenerateRequest) -> None:
        self._pool = pool
        self._model = model_name
        self._request = request
        self._call: MuxedCall | None = None
        self._cancelled = False
        # The engine of the current attempt (for aborting single samples on it), and why it was picked.
        self.engine: EngineClient | None = None
        self.route_reason = ""
        self._responses = self._run()

    def __aiter__(self) -> AsyncIterator[list[engine_pb2.EngineGenerateResponse]]:
        return self._responses

    def cancel(self) -> None:
        """Stop the engine's work (it aborts the request when its call is cancelled); before the call is
        made, keep it from being made."""
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()

    async def aclose(self) -> None:
        await self._responses.aclose()

    async def _run(self) -> AsyncGenerator[list[engine_pb2.EngineGenerateResponse], None]:
        # The engine stream's metadata is not this request's: its trace context rides in the request.
        self._request.trace_context.update(current_trace_context())
        params = self._request.sampling_params
        n = params.n if params.HasField("n") else 1
        # best_of > n: the engine generates best_of samples, and each of them ends (a beam search's
        # engine ends only its n best beams).
        ranked = params.HasField("best_of") and not params.use_beam_search
        progress = _Progress(max(n, params.best_of) if ranked else n)
        config = self._pool.config
        async with self._pool.admission.slot():
            errors: list[str] = []
            tried: set[str] = set()
            for attempt in range(config.max_retries + 1):
                if attempt:
                    await asyncio.sleep(config.retry_delay_s(attempt))
                if self._cancelled:  # e.g. the tokenizer refused the request while it waited for a slot
                    raise call_error(grpc.StatusCode.CANCELLED, "the request was cancelled before it reached an engine")
                engine = self._pick(tried, errors)
                tried.add(engine.address)
                last_try = attempt == config.max_retries
                try:
                    async with contextlib.aclosing(self._attempt(engine, progress, errors, last_try)) as batches:
                        async for batch in batches:
                            yield batch
                    return
                except _RetryElsewhere:
                    engine.retried_total += 1
                    trace.get_current_span().add_event("retry", {"engine": engine.address, "error": errors[-1]})

    def _pick(self, tried: set[str], errors: list[str]) -> EngineClient:
        candidates = self._pool.routable(self._model, self._request.lora_name)
        if not candidates:
            self._pool.rejections["no_engine"] += 1
            why = f" (tried: {'; '.join(errors)})" if errors else ""
            raise Unavailable(f"no healthy engine is serving {self._model!r}{why}")
        # Prefer engines not tried yet; with none left, try one again after the backoff.
        fresh = [e for e in candidates if e.address not in tried] or candidates
        route = self._pool.policy.pick(fresh, routing_key(self._request.input_ids, self._request.lora_name))
        self._pool.decisions[route.reason] += 1
        trace.get_current_span().add_event(
            "routed",
            {"engine": route.engine.address, "reason": route.reason, "policy": self._pool.policy.name},
        )
        # Logged once, in the request's closing line (generation.py), not per pick.
        self.route_reason = route.reason
        return route.engine

    async def _attempt(
        self, engine: EngineClient, progress: _Progress, errors: list[str], last_try: bool
    ) -> AsyncGenerator[list[engine_pb2.EngineGenerateResponse], None]:
        """One engine call, counted in the engine's load from start to end.

        Raises `_RetryElsewhere` when it failed before any output and may be retried.
        """
        engine.requests_total += 1
        engine.breaker.on_dispatch()
        call = self._call = engine.mux.generate(self._request)
        self.engine = engine
        with engine.track():
            try:
                response: engine_pb2.EngineGenerateResponse | None = await self._first_response(
                    engine, call, errors, last_try
                )
                try:
                    while response is not None:
                        # With it, everything else that arrived while this request's reader was busy.
                        batch = [response, *call.ready()]
                        for part in batch:
                            progress.observe(part)
                        yield batch
                        if progress.done:
                            return
                        response = await call.read()
                    error = "the engine ended the stream before every sample finished"
                    engine.failures_total += 1
                    engine.breaker.record_failure()
                except aio.AioRpcError as exc:
                    if exc.code() in ENGINE_FAULTS:
                        engine.failures_total += 1
                        engine.breaker.record_failure()
                    error = f"{exc.code().name}: {exc.details()}"
            finally:
                call.cancel()
        message = f"engine {engine.address} failed after output had been sent ({error}); the output is incomplete"
        log.warning("engine failed mid-stream", extra={"engine": engine.address, "error": error})
        aborts = progress.aborts(message)
        if aborts:
            yield aborts

    async def _first_response(
        self, engine: EngineClient, call: MuxedCall, errors: list[str], last_try: bool
    ) -> engine_pb2.EngineGenerateResponse:
        """The call's first response, with the verdict on the engine recorded in its breaker."""
        try:
            first = await call.read()
        except aio.AioRpcError as exc:
            code = exc.code()
            if code in ENGINE_FAULTS:
                engine.failures_total += 1
                engine.breaker.record_failure()
            else:
                engine.breaker.record_success()  # it answered: the engine itself works
            if code not in RETRYABLE:
                raise
            errors.append(f"{engine.address}: {code.name}: {exc.details()}")
            log.warning("engine failed before output", extra={"engine": engine.address, "error": errors[-1]})
            if last_try:
                kind = ResourceExhausted if code is grpc.StatusCode.RESOURCE_EXHAUSTED else Unavailable
                raise kind(f"every attempt failed: {'; '.join(errors)}") from None
            raise _RetryElsewhere() from None
        except BaseException:
            engine.breaker.release_trial()  # cancelled: no verdict on the engine
            raise
        if first is None:
            engine.failures_total += 1
            engine.breaker.record_failure()
            errors.append(f"{engine.address}: ended the stream without output")
            if last_try:
                raise Unavailable(f"every attempt failed: {'; '.join(errors)}")
            raise _RetryElsewhere()
        engine.breaker.record_success()
        return first


class _RetryElsewhere(Exception):
    """The attempt failed before any output; another engine may do better."""


@contextlib.asynccontextmanager
async def open_stream(
    pool: EnginePool, model_name: str, request: engine_pb2.EngineGenerateRequest
) -> AsyncIterator[EngineStream]:
    """An `EngineStream` that is closed (engine call cancelled, slot and load released) on exit."""
    stream = EngineStream(pool, model_name, request)
    try:
        yield stream
    finally:
        stream.cancel()
        await stream.aclose()
