"""Runs the LLMEngine's step loop on its own thread and bridges it to asyncio.

The gRPC servicer (event-loop thread) and the step loop (worker thread) meet
only through a command queue (add, abort) and each request's outputs (`_Stream`), so
network I/O never waits for a forward pass and a forward pass never waits
for the network. Leaving `generate()` early aborts the request, which frees
its KV blocks at the next step.

The service builds its engine on the step-loop thread too (`EngineLoop.build`), so that one
thread runs every parallel torch op of the process. With OpenMP (torch's CPU thread pool),
each thread that opens a parallel region owns a team of worker threads; a second team makes
libgomp count more threads than cores and cut its workers' spin-wait to almost nothing, so a
CPU decode step's ~150 parallel regions each pay a sleep and a wake-up: on 2 cores a batch-1
step took 30 ms instead of 20 ms when the model was loaded on another thread than the one
stepping it (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TypeVar, cast

from services.engine.llm_engine import LLMEngine
from services.engine.request import EngineOutput, EngineRequest, LoadReport
from turnout.errors import InvalidArgument, ResourceExhausted, Unavailable
from turnout.telemetry.engine_metrics import EngineGauges, EngineMetrics, RequestTimeline

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class _Stream:
    """One request's outputs on their way from the step loop to its reader."""

    loop: asyncio.AbstractEventLoop
    # Written by the step-loop thread only (see turnout/telemetry/engine_metrics.py).
    timeline: RequestTimeline
    # Delivered (on the event loop's thread) and not taken yet, and the reader waiting for them. A deque
    # and one future, not an asyncio.Queue: every step hands each running request an output, and the
    # queue's bookkeeping (getters, putters, unfinished count) was a third of the hand-over's cost.
    ready: collections.deque[EngineOutput | BaseException] = field(default_factory=collections.deque)
    waiter: asyncio.Future[None] | None = None

    def put(self, item: EngineOutput | BaseException) -> None:
        """On the event loop: `item` is ready for the reader."""
        self.ready.append(item)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():  # a reader cancelled meanwhile cancelled it
                waiter.set_result(None)

    async def take(self) -> list[EngineOutput | BaseException]:
        """Everything ready, in order, once there is something."""
        while not self.ready:
            self.waiter = self.loop.create_future()
            await self.waiter
        items = list(self.ready)
        self.ready.clear()
        return items

    def emit(self, item: EngineOutput | BaseException) -> None:
        """From any thread."""
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is listening
            self.loop.call_soon_threadsafe(self.put, item)


def _deliver(items: list[tuple[_Stream, EngineOutput]]) -> None:
    """On the event loop: hand one step's outputs to their streams."""
    for stream, output in items:
        stream.put(output)


def _emit_step(items: list[tuple[_Stream, EngineOutput]]) -> None:
    """One step's outputs, one wake-up of each event loop they go to (not one per output: each
    wake-up writes to the loop's self-pipe, ~5% of a 16-way CPU step when done per output)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, EngineOutput]]] = {}
    for stream, output in items:
        by_loop.setdefault(stream.loop, []).append((stream, output))
    for loop, batch in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is listening
            loop.call_soon_threadsafe(_deliver, batch)


@dataclass(frozen=True)
class _Add:
    request: EngineRequest
    priority: int


@dataclass(frozen=True)
class _Abort:
    request_id: str
    indices: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Flush:
    # Resolved on the step-loop thread with whether the prefix cache was dropped.
    done: concurrent.futures.Future[bool]


@dataclass(frozen=True)
class _Call:
    # Runs on the step-loop thread between steps (the only thread touching the scheduler and the
    # adapter slots); `done` gets its result or its exception.
    fn: Callable[[], object]
    done: concurrent.futures.Future[object]


def _retrieve(future: asyncio.Future[object]) -> None:
    """Marks the outcome of a compile its caller stopped waiting for as seen (no "never retrieved" log)."""
    if not future.cancelled():
        future.exception()


class EngineLoop:
    def __init__(
        self,
        engine: LLMEngine,
        max_waiting_requests: int = 1024,
        metrics: EngineMetrics | None = None,
        *,
        start: bool = True,
    ) -> None:
        """Steps `engine` on a new thread; `start=False` leaves the stepping to the caller's thread
        (`build` runs `_run` there)."""
        self.engine = engine
        self._max_waiting = max_waiting_requests
        self.metrics = metrics or EngineMetrics()
        self.metrics.watch(self.gauges)
        # Step-loop thread only: requests added to the scheduler and not scheduled yet.
        self._unscheduled: dict[str, RequestTimeline] = {}
        self._commands: queue.SimpleQueue[_Add | _Abort | _Flush | _Call | None] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._load = engine.load()
        self._stopping = False
        if start:
            self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
            self._thread.start()
        else:
            self._thread = threading.current_thread()

    @classmethod
    def build(
        cls,
        make_engine: Callable[[], LLMEngine],
        max_waiting_requests: int = 1024,
        metrics: EngineMetrics | None = None,
    ) -> concurrent.futures.Future[EngineLoop]:
        """Start a thread that builds the engine with `make_engine` (loading the model, packing
        weights, sizing the KV cache) and then steps it: the future holds the loop once the engine
        is built, or what `make_engine` raised. One thread for both keeps the process at one
        OpenMP team (see the module docstring)."""
        built: concurrent.futures.Future[EngineLoop] = concurrent.futures.Future()

        def build_and_run() -> None:
            try:
                loop = cls(make_engine(), max_waiting_requests, metrics, start=False)
            except BaseException as exc:
                built.set_exception(exc)
                return
            built.set_result(loop)
            loop._run()

        threading.Thread(target=build_and_run, name="engine-loop", daemon=True).start()
        return built

    async def generate(
        self, request: EngineRequest, priority: int = 0, timeline: RequestTimeline | None = None
    ) -> AsyncIterator[EngineOutput]:
        """Stream the request's outputs one by one (see generate_batches); leaving the iteration early aborts it."""
        async with contextlib.aclosing(self.generate_batches(request, priority, timeline)) as batches:
            async for batch in batches:
                for output in batch:
                    yield output

    async def generate_batches(
        self, request: EngineRequest, priority: int = 0, timeline: RequestTimeline | None = None
    ) -> AsyncGenerator[list[EngineOutput], None]:
        """Stream the request's outputs, every output that is ready in one batch: one step's, or, when the
        reader lagged behind the step loop, those of all the steps since it last read (in order; never held
        back to wait for more). Leaving the iteration early aborts the request. `timeline` (read it once the
        last output arrived) gets the times the request was queued, scheduled, first sampled and finished.

        A constrained request first waits for its grammar, compiled off the step loop (the batch
        keeps running meanwhile); a constraint that does not compile raises InvalidArgument here,
        before anything is scheduled."""
        self.engine.check_fits(request)
        if request.lora_name is not None:
            self.engine.resolve_lora(request.lora_name)  # refuse an unknown adapter before queueing
        constraint = request.sampling.constraint
        if constraint is not None and request.grammar is None:
            with self.engine.grammars.wanted(constraint) as compiling:
                # shield: leaving early must not cancel a compile other requests may share; leaving the
                # `wanted` block stops it once no request waits for it.
                waiting = asyncio.wrap_future(compiling)
                waiting.add_done_callback(_retrieve)
                compiled = await asyncio.shield(waiting)
            request = dataclasses.replace(request, grammar=compiled)
        stream = _Stream(asyncio.get_running_loop(), timeline or RequestTimeline())
        with self._lock:
            if self._stopping:
                raise Unavailable("engine is shutting down")
            if request.request_id in self._streams:
                raise InvalidArgument(f"request id {request.request_id!r} is already in use")
            if self._load.waiting >= self._max_waiting:
                raise ResourceExhausted(f"engine queue is full ({self._max_waiting} requests waiting)")
            self._streams[request.request_id] = stream
        self._commands.put(_Add(request, priority))
        finished = False
        try:
            while not finished:
                items = await stream.take()  # with what the step loop delivered while this reader lagged
                batch: list[EngineOutput] = []
                for item in items:
                    if isinstance(item, BaseException):
                        if batch:
                            yield batch
                        raise item
                    batch.append(item)
                    if item.request_finished:  # nothing follows the last output
                        finished = True
                        break
                yield batch
        finally:
            if not finished:
                self._commands.put(_Abort(request.request_id))
            with self._lock:
                self._streams.pop(request.request_id, None)

    def abort(self, request_id: str, indices: tuple[int, ...] = ()) -> bool:
        """Abort a request, or only the listed samples of it."""
        with self._lock:
            known = request_id in self._streams
        if known:
            self._commands.put(_Abort(request_id, indices))
        return known

    def load(self) -> LoadReport:
        return self._load

    async def flush_cache(self) -> bool:
        """Drop the prefix cache on the step-loop thread (the only one touching blocks); False,
        changing nothing, while any request holds blocks."""
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._commands.put(_Flush(done))
        return await asyncio.wrap_future(done)

    async def call(self, fn: Callable[[], T]) -> T:
        """fn() on the step-loop thread between two steps (e.g. loading a LoRA adapter); its result or error."""
        done: concurrent.futures.Future[object] = concurrent.futures.Future()
        self._commands.put(_Call(fn, done))
        return cast(T, await asyncio.wrap_future(done))

    def gauges(self) -> EngineGauges:
        """The state metrics report (read from any thread: plain numbers the step loop last wrote)."""
        load, cache = self._load, self.engine.block_manager.stats
        return EngineGauges(
            running=load.running,
            waiting=load.waiting,
            kv_cache_usage=load.kv_tokens_used / load.kv_tokens_capacity if load.kv_tokens_capacity else 0.0,
            prefix_queried_tokens=cache.num_query_tokens,
            prefix_hit_tokens=cache.num_hit_tokens,
            preemptions=self.engine.scheduler.num_preemptions,
        )

    def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            streams = list(self._streams.values())
        self._commands.put(None)
        self._thread.join(timeout=30)
        if self._thread.is_alive():  # a step hangs: its thread could not close the engine (see _run)
            self.engine.close(step_running=True)
        self.engine.grammars.shutdown()
        for stream in streams:
            stream.emit(Unavailable("engine is shutting down"))

    def _run(self) -> None:
        while True:
            if not self._apply_commands(block=not self.engine.has_work()):
                # Here, not in shutdown(): the thread that built the engine started its tensor-parallel
                # ranks, which die with that thread (PR_SET_PDEATHSIG), so it asks them to stop first.
                self.engine.close()
                return
            started = time.time_ns()
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a bug in the step must not hang every caller
                log.exception("engine step failed")
                self._fail_all(exc)
                continue
            now = time.time_ns()
            self._load = self.engine.load()
            self._note_scheduled(started)
            ready: list[tuple[_Stream, EngineOutput]] = []
            with self._lock:
                streams = [self._streams.get(out.request_id) for out in outputs]
            for out, stream in zip(outputs, streams, strict=True):
                if stream is not None:
                    ready.append((stream, out.output))
                if out.output.request_finished:
                    self._unscheduled.pop(out.request_id, None)
            self.metrics.on_step(started, now, [(stream.timeline, output) for stream, output in ready])
            _emit_step(ready)

    def _note_scheduled(self, step_started: int) -> None:
        """Requests the scheduler admitted in this step were scheduled when it started."""
        if not self._unscheduled:
            return
        running = {seq.request.request_id for seq in self.engine.scheduler.running}
        for request_id in running.intersection(self._unscheduled):
            self.metrics.on_scheduled(self._unscheduled.pop(request_id), step_started)

    def _apply_commands(self, *, block: bool) -> bool:
        """Apply queued commands (waiting for one when idle). False once shutdown was asked."""
        while True:
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                return True
            block = False
            if command is None:
                return False
            if isinstance(command, _Add):
                with self._lock:
                    stream = self._streams.get(command.request.request_id)
                try:
                    self.engine.add_request(command.request, command.priority)
                except Exception as exc:
                    if stream is not None:
                        stream.emit(exc)
                else:
                    if stream is not None:
                        self._unscheduled[command.request.request_id] = stream.timeline
            elif isinstance(command, _Flush):
                command.done.set_result(self.engine.block_manager.reset_prefix_cache())
            elif isinstance(command, _Call):
                try:
                    command.done.set_result(command.fn())
                except Exception as exc:
                    command.done.set_exception(exc)
            else:
                self.engine.abort(command.request_id, indices=command.indices)
            self._load = self.engine.load()

    def _fail_all(self, exc: Exception) -> None:
        with self._lock:
            streams = dict(self._streams)
        for request_id, stream in streams.items():
            self.engine.abort(request_id, "engine step failed")
            stream.emit(Unavailable(f"engine step failed: {type(exc).__name__}: {exc}"))
