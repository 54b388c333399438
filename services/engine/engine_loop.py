"""Runs the LLMEngine's step loop on its own thread and bridges it to asyncio.

The gRPC servicer (event-loop thread) and the step loop (worker thread) meet
only through a command queue (add, abort) and per-request output queues, so
network I/O never waits for a forward pass and a forward pass never waits
for the network. Leaving `generate()` early aborts the request, which frees
its KV blocks at the next step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from services.engine.llm_engine import LLMEngine
from services.engine.request import EngineOutput, EngineRequest, LoadReport
from turnout.errors import InvalidArgument, ResourceExhausted, Unavailable

log = logging.getLogger(__name__)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue[EngineOutput | BaseException] = field(default_factory=asyncio.Queue)

    def emit(self, item: EngineOutput | BaseException) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is listening
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)


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


class EngineLoop:
    def __init__(self, engine: LLMEngine, max_waiting_requests: int = 1024) -> None:
        self.engine = engine
        self._max_waiting = max_waiting_requests
        self._commands: queue.SimpleQueue[_Add | _Abort | _Flush | None] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._load = engine.load()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    async def generate(self, request: EngineRequest, priority: int = 0) -> AsyncIterator[EngineOutput]:
        """Stream the request's outputs; leaving the iteration early aborts it.

        A constrained request first waits for its grammar, compiled off the step loop (the batch
        keeps running meanwhile); a constraint that does not compile raises InvalidArgument here,
        before anything is scheduled."""
        self.engine.check_fits(request)
        constraint = request.sampling.constraint
        if constraint is not None and request.grammar is None:
            # shield: leaving early must not cancel a compilation other requests may share.
            compiled = await asyncio.shield(asyncio.wrap_future(self.engine.grammars.submit(constraint)))
            request = dataclasses.replace(request, grammar=compiled)
        stream = _Stream(asyncio.get_running_loop())
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
            while True:
                item = await stream.outputs.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.request_finished:
                    finished = True
                    return
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

    def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            streams = list(self._streams.values())
        self._commands.put(None)
        self._thread.join(timeout=30)
        for stream in streams:
            stream.emit(Unavailable("engine is shutting down"))

    def _run(self) -> None:
        while True:
            if not self._apply_commands(block=not self.engine.has_work()):
                return
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a bug in the step must not hang every caller
                log.exception("engine step failed")
                self._fail_all(exc)
                continue
            self._load = self.engine.load()
            for out in outputs:
                with self._lock:
                    stream = self._streams.get(out.request_id)
                if stream is not None:
                    stream.emit(out.output)

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
                try:
                    self.engine.add_request(command.request, command.priority)
                except Exception as exc:
                    with self._lock:
                        stream = self._streams.get(command.request.request_id)
                    if stream is not None:
                        stream.emit(exc)
            elif isinstance(command, _Flush):
                command.done.set_result(self.engine.block_manager.reset_prefix_cache())
            else:
                self.engine.abort(command.request_id, indices=command.indices)
            self._load = self.engine.load()

    def _fail_all(self, exc: Exception) -> None:
        with self._lock:
            streams = dict(self._streams)
        for request_id, stream in streams.items():
            self.engine.abort(request_id, "engine step failed")
            stream.emit(Unavailable(f"engine step failed: {type(exc).__name__}: {exc}"))
