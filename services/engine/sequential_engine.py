"""The skeleton engine: one request at a time, a Hugging Face model forward with
its own KV cache, on a worker thread so the gRPC event loop never blocks.

It is deliberately simple (no batching, no paged cache); the continuous-batching
engine replaces it behind the same interface: `generate()` yields EngineOutputs,
cancelling the iteration aborts the request, `load()` reports load.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from services.engine.model_loader import LoadedModel
from services.engine.request import EngineOutput, EngineRequest, Finish, LoadReport
from services.engine.sampling import sample_token
from turnout.errors import InvalidArgument, ResourceExhausted, Unavailable

log = logging.getLogger(__name__)


@dataclass
class _Job:
    request: EngineRequest
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue[EngineOutput | BaseException] = field(default_factory=asyncio.Queue)
    # Set from the event loop when the caller goes away; the worker checks it every step.
    cancelled: threading.Event = field(default_factory=threading.Event)

    def emit(self, item: EngineOutput | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()


class SequentialEngine:
    def __init__(self, loaded: LoadedModel, max_waiting_requests: int = 256) -> None:
        self._loaded = loaded
        self._max_waiting = max_waiting_requests
        self._waiting: collections.deque[_Job] = collections.deque()
        self._jobs: dict[str, _Job] = {}
        self._running: _Job | None = None
        self._running_tokens = 0
        self._lock = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="engine-worker", daemon=True)
        self._thread.start()

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Stream the request's outputs; leaving the iteration early aborts it."""
        job = _Job(request, asyncio.get_running_loop())
        with self._lock:
            if self._stopping:
                raise Unavailable("engine is shutting down")
            if request.request_id in self._jobs:
                raise InvalidArgument(f"request id {request.request_id!r} is already in use")
            if len(self._waiting) >= self._max_waiting:
                raise ResourceExhausted(f"engine queue is full ({self._max_waiting} requests waiting)")
            self._jobs[request.request_id] = job
            self._waiting.append(job)
            self._lock.notify()
        try:
            while True:
                item = await job.outputs.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            self._forget(job)

    def abort(self, request_id: str) -> bool:
        with self._lock:
            job = self._jobs.get(request_id)
        if job is None:
            return False
        job.cancelled.set()
        job.emit(EngineOutput([], len(job.request.input_ids), 0, finish=Finish("abort", message="aborted")))
        return True

    def load(self) -> LoadReport:
        with self._lock:
            return LoadReport(
                running=1 if self._running is not None else 0,
                waiting=len(self._waiting),
                kv_tokens_used=self._running_tokens,
                kv_tokens_capacity=self._loaded.max_model_len,
            )

    def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            for job in [*self._waiting, *([self._running] if self._running else [])]:
                job.cancelled.set()
                job.emit(Unavailable("engine is shutting down"))
            self._waiting.clear()
            self._lock.notify()
        self._thread.join(timeout=10)

    def _forget(self, job: _Job) -> None:
        job.cancelled.set()
        with self._lock:
            self._jobs.pop(job.request.request_id, None)
            if job in self._waiting:
                self._waiting.remove(job)

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._stopping:
                    self._lock.wait()
                if self._stopping:
                    return
                job = self._waiting.popleft()
                self._running = job
            try:
                if not job.cancelled.is_set():
                    self._run(job)
            except Exception as exc:
                log.exception("generation failed", extra={"request_id": job.request.request_id})
                job.emit(exc)
            finally:
                with self._lock:
                    self._running = None
                    self._running_tokens = 0

    @torch.inference_mode()
    def _run(self, job: _Job) -> None:
        request, settings = job.request, job.request.sampling
        model, device = self._loaded.model, self._loaded.device
        eos = frozenset() if settings.ignore_eos else self._loaded.eos_token_ids
        stop_ids = eos | settings.stop_token_ids
        generator = None
        if settings.seed is not None:
            generator = torch.Generator(device="cpu").manual_seed(settings.seed)

        cache = DynamicCache()
        prompt_len = len(request.input_ids)
        step_input = torch.tensor([request.input_ids], device=device)  # (1, T)
        generated: list[int] = []
        while not job.cancelled.is_set():
            logits = model(input_ids=step_input, past_key_values=cache, use_cache=True).logits[0, -1]  # (V,)
            self._running_tokens = prompt_len + len(generated)
            banned = sorted(stop_ids) if len(generated) < settings.min_new_tokens else ()
            token = sample_token(logits.float().cpu(), settings, generator, banned)
            generated.append(token)
            finish: Finish | None = None
            if token in stop_ids:
                finish = Finish("stop", matched_token_id=token)
            elif len(generated) >= settings.max_new_tokens:
                finish = Finish("length")
            job.emit(EngineOutput([token], prompt_len, len(generated), finish=finish))
            if finish is not None:
                return
            step_input = torch.tensor([[token]], device=device)
