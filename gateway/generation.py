"""The router `Generate` calls behind one HTTP request, read as one stream of sample events.

A request with a batch of prompts makes one call per prompt; a call streams
the samples of its prompt (`n` of them). Samples get one index across the
whole request, prompt-major: `offset(prompt) + sample`, which is the order of
OpenAI `choices` and of SGLang batch outputs.

Cancellation is the point of this module: whoever stops reading (a client
that went away, an error) leaves through a `finally` that cancels every call,
so the router and engines stop generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request

from gateway import metrics
from gateway.disconnect import DisconnectWatch
from gateway.errors import ClientDisconnected, GenerationAborted, HTTPError
from gateway.growing_text import GrowingText
from turnout.generate_carrier import CarriedGenerate
from turnout.v1 import common_pb2, inference_pb2

T = TypeVar("T")

# Responses buffered per request before the readers wait for the HTTP side
# (backpressure to the router instead of unbounded memory here; the router then holds what the engine
# has sent for the request, at most its whole output: the engine's step loop never waits for a reader).
_QUEUE_SIZE = 64


@dataclass
class ToolCall:
    """One tool call of a sample, as its deltas have built it so far."""

    id: str
    name: str
    arguments_so_far: GrowingText = field(default_factory=GrowingText)

    @property
    def arguments(self) -> str:
        return self.arguments_so_far.value()


@dataclass
class Sample:
    """What one sample has produced so far; the counts are cumulative."""

    index: int
    prompt: int
    # Index among the samples of its prompt (the router's GenerateChunk.index).
    local_index: int
    started: float
    text_so_far: GrowingText = field(default_factory=GrowingText)
    token_ids: list[int] = field(default_factory=list)
    # The prompt's token ids, when the request asked for them (vLLM return_token_ids).
    prompt_token_ids: list[int] = field(default_factory=list)
    # One per token id, when logprobs were asked for.
    logprobs: list[common_pb2.PositionLogprobs] = field(default_factory=list)
    # Prompt positions max(logprob_start_len, 1) .. prompt_len - 1; they come with the end of the sample.
    input_logprobs: list[common_pb2.PositionLogprobs] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # Separated thinking text, the tool calls read from the output, and the tokens spent thinking.
    reasoning_so_far: GrowingText = field(default_factory=GrowingText)
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning_tokens: int = 0
    finish_reason: common_pb2.FinishReason | None = None
    finished: float | None = None
    # The pooled prompt, for a request with `pooling` (an embedding).
    embedding: list[float] = field(default_factory=list)
    # With return_hidden_states: one row per computed position (the prompt's, then each decode step's input).
    hidden_states: list[list[float]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.text_so_far.value()

    @property
    def reasoning_text(self) -> str:
        return self.reasoning_so_far.value()

    @property
    def latency_s(self) -> float:
        return (self.finished or time.monotonic()) - self.started


@dataclass(slots=True)
class Event:
    """New output of one sample: a text delta with its token ids (and their logprobs). The event with
    `done` ends the sample and carries its last delta (the router's last chunk), which is empty only
    when the sample ended without a last chunk to carry it. Never changed once made (the held last
    chunk is copied with `done` set); not frozen, as a frozen dataclass costs 2.4 µs to build here
    against 0.5, once per streamed event."""

    sample: Sample
    text: str
    token_ids: Sequence[int]
    logprobs: Sequence[common_pb2.PositionLogprobs]
    done: bool
    reasoning_text: str = ""
    tool_calls: Sequence[common_pb2.ToolCallDelta] = ()


class Generation:
    """Calls already started, each with its first response read (see `start`)."""

    def __init__(self, calls: list[Any], firsts: list[Any], samples_per_prompt: list[int], started: float) -> None:
        self._calls = calls
        self._firsts = firsts
        self._offsets = [sum(samples_per_prompt[:p]) for p in range(len(samples_per_prompt))]
        self._counts = samples_per_prompt
        self.samples = [
            Sample(index=offset + i, prompt=p, local_index=i, started=started)
            for p, (offset, count) in enumerate(zip(self._offsets, samples_per_prompt, strict=True))
            for i in range(count)
        ]
        self._closing = False
        for sample in self.samples:
            # Sent with the first response of the prompt's call, when the request asked for them (a call
            # that ended at once has none, and fails as a sample that never finished).
            first = firsts[sample.prompt]
            sample.prompt_token_ids = [] if first is None else list(first.prompt_token_ids)
        # A sample's last chunk, held until its Complete (the router's next message for it) arrives.
        self._last_chunks: dict[int, Event] = {}
        # While events() runs: the router's messages received and not read yet, and the responses of the
        # message being read that are still to come (see ready()).
        self._queue: asyncio.Queue[tuple[int, Any]] | None = None
        self._unread_parts = 0

    @classmethod
    async def start(
        cls,
        open_call: Callable[[inference_pb2.GenerateRequest], CarriedGenerate],
        requests: Sequence[inference_pb2.GenerateRequest],
    ) -> Generation:
        """Start one Generate stream per request (`open_call`; turnout/generate_carrier.py) and wait for
        each one's first response.

        Waiting for the first response lets an error the router reports up
        front (unknown model, bad parameter, overload) become the HTTP status,
        before a streaming response has committed to 200.
        """
        started = time.monotonic()
        metrics.on_generate(requests)
        for request in requests:
            request.accept_batches = True  # what is ready comes in one message (events() unpacks it)
        calls = [open_call(request) for request in requests]
        try:
            if len(calls) == 1:  # the usual request: gather() would add a task and a turn of the loop (10-20 µs)
                firsts = [await calls[0].read()]
            else:
                firsts = await asyncio.gather(*(call.read() for call in calls))
        except BaseException:
            for call in calls:
                call.cancel()
            raise
        counts = [r.sampling_params.n if r.sampling_params.HasField("n") else 1 for r in requests]
        return cls(calls, list(firsts), counts, started)

    def cancel(self) -> None:
        self._closing = True
        for call in self._calls:
            call.cancel()

    def ready(self) -> bool:
        """Whether more output is already here (events() yields it without waiting): the SSE writer
        then puts the next events in the same socket write."""
        if self._unread_parts > 0:
            return True
        if self._queue is None:
            return len(self._calls) == 1 and self._calls[0].has_ready()
        return not self._queue.empty()

    async def events(self) -> AsyncGenerator[Event, None]:
        """Every sample's output in arrival order, one event per response even when the router batched
        several in one message; raises on a failed call or an aborted sample."""
        try:
            async with contextlib.aclosing(self._messages()) as messages:
                async for prompt, message in messages:
                    parts = (message, *message.batch) if message.batch else (message,)
                    for k, part in enumerate(parts):
                        self._unread_parts = len(parts) - k - 1
                        event = self._apply(prompt, part)
                        if event is not None:
                            yield event
                    self._unread_parts = 0
            unfinished = [s.index for s in self.samples if s.finish_reason is None]
            if unfinished:
                raise HTTPError(502, f"the router ended the stream before samples {unfinished} finished")
        finally:
            self.cancel()

    async def _messages(self) -> AsyncGenerator[tuple[int, inference_pb2.GenerateResponse], None]:
        """(prompt, message) as the router's messages arrive. One call (one prompt, the usual request) is
        read in the caller's task: a task and a queue between the call and the caller cost a wake-up
        per message. Several are read each by its own task into one queue, in arrival order."""
        if len(self._calls) == 1:
            call, message = self._calls[0], self._firsts[0]
            while message is not None:
                yield 0, message
                message = await call.read()
            return
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue(_QUEUE_SIZE)
        self._queue = queue
        readers = [asyncio.create_task(self._read(p, queue)) for p in range(len(self._calls))]
        open_calls = len(readers)
        try:
            while open_calls:
                prompt, item = await queue.get()
                if item is None:
                    open_calls -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield prompt, item
        finally:
            for reader in readers:
                reader.cancel()

    async def collect(self) -> list[Sample]:
        """Read to the end; the finished samples in index order."""
        async for _ in self.events():
            pass
        return self.samples

    async def _read(self, prompt: int, queue: asyncio.Queue[tuple[int, Any]]) -> None:
        call = self._calls[prompt]
        try:
            response = self._firsts[prompt]
            while response is not None:
                await queue.put((prompt, response))
                response = await call.read()
            await queue.put((prompt, None))
        except asyncio.CancelledError:
            if not self._closing:
                # The call was cancelled under us (channel closing), not by our own exit.
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait((prompt, HTTPError(503, "the call to the router was cancelled")))
            raise
        except Exception as exc:
            await queue.put((prompt, exc))

    def _apply(self, prompt: int, response: inference_pb2.GenerateResponse) -> Event | None:
        """Apply `response` to its sample; the event to show, or None for a last chunk (held)."""
        kind = response.WhichOneof("kind")
        part = response.chunk if kind == "chunk" else response.complete
        if part.index >= self._counts[prompt]:
            raise HTTPError(
                502, f"the router sent sample {part.index} of prompt {prompt}, which has only {self._counts[prompt]}"
            )
        sample = self.samples[self._offsets[prompt] + part.index]
        if sample.finish_reason is not None:
            raise HTTPError(502, f"the router sent output for sample {sample.index} after it finished")
        if kind == "chunk":
            # Every field is read once: each read of a protobuf field builds a Python object, and this runs
            # once per streamed token; the fields most chunks leave empty are only copied when set.
            chunk = response.chunk
            text, token_ids, logprobs = chunk.text, chunk.token_ids, chunk.logprobs
            reasoning_text, tool_calls = chunk.reasoning_text, chunk.tool_calls
            if logprobs:
                if len(logprobs) != len(token_ids):
                    raise HTTPError(502, f"the router sent {len(logprobs)} logprobs for {len(token_ids)} tokens")
                sample.logprobs.extend(logprobs)
            sample.text_so_far.add(text)
            sample.token_ids.extend(token_ids)
            if chunk.hidden_states:
                sample.hidden_states += [list(row.values) for row in chunk.hidden_states]
            sample.prompt_tokens = chunk.prompt_tokens
            sample.completion_tokens = chunk.completion_tokens
            sample.cached_tokens = chunk.cached_tokens
            if reasoning_text:
                sample.reasoning_so_far.add(reasoning_text)
            sample.reasoning_tokens = chunk.reasoning_tokens
            for delta in tool_calls:
                _add_tool_call_delta(sample, delta)
            metrics.on_chunk(sample.index, len(token_ids))
            event = Event(sample, text, token_ids, logprobs, False, reasoning_text, tool_calls)
            if chunk.last:
                self._last_chunks[sample.index] = event
                return None
            return event
        complete = response.complete
        if complete.finish_reason.WhichOneof("kind") == "abort":
            raise GenerationAborted(complete.finish_reason.abort.message)
        if complete.HasField("usage"):
            sample.prompt_tokens = complete.usage.prompt_tokens
            sample.completion_tokens = complete.usage.completion_tokens
            sample.cached_tokens = complete.usage.cached_tokens
            sample.reasoning_tokens = complete.usage.reasoning_tokens
        if complete.input_logprobs:
            # All samples of a prompt share its logprobs, which the router may send with one of them only.
            for sibling in self.samples:
                if sibling.prompt == prompt and (sibling is sample or not sibling.input_logprobs):
                    sibling.input_logprobs = list(complete.input_logprobs)
        sample.finish_reason = complete.finish_reason
        sample.embedding = list(complete.embedding)
        sample.finished = time.monotonic()
        if sample.local_index == 0:
            metrics.on_prompt_done(sample.prompt_tokens)
        last = self._last_chunks.pop(sample.index, None)
        if last is None:
            return Event(sample, "", (), (), done=True)
        return dataclasses.replace(last, done=True)


def _add_tool_call_delta(sample: Sample, delta: common_pb2.ToolCallDelta) -> None:
    calls = sample.tool_calls
    if delta.index == len(calls):
        calls.append(ToolCall(id=delta.id, name=delta.name))
    elif delta.index > len(calls):
        message = f"the router sent tool call {delta.index} of sample {sample.index} before call {len(calls)}"
        raise HTTPError(502, message)
    calls[delta.index].arguments_so_far.add(delta.arguments)


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Run `work` in this task, cancelling it (and so its gRPC calls) if the client disconnects first;
    then ClientDisconnected."""
    async with DisconnectWatch(request.receive):
        return await work
    raise ClientDisconnected()  # the watch took back the disconnect's cancel
