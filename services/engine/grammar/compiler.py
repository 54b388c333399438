"""Compiling constraints to xgrammar grammars: one compiler per engine, a cache, killable workers.

Compilation runs off the step loop, in worker processes (compile_worker.py): `wanted()` queues
the work and gives a future, which the gRPC path awaits before giving the request to the step
loop, so a slow grammar delays only its own request. Each worker slot is a thread driving one
worker process; a compile that runs past --grammar-compile-timeout is refused (InvalidArgument
naming the limit) and its worker killed and replaced, so no grammar can hold a worker longer.

The cache maps each distinct constraint (kind, text, whitespace options) to its compile, so
concurrent requests with the same constraint share one; constraints that do not compile are
cached too (the same bad schema is refused again at once). Timeouts and crashes are not cached:
they may depend on the machine's load. A compile counts the requests waiting for it: when the
last one leaves (its client went away), the compile is dropped from the queue, or its worker
killed if it is running.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from services.engine.grammar import xgrammar_build
from services.engine.grammar.compile_worker import Build, CompileTimeout, CompileWorker, WorkerDied
from services.engine.grammar.constraint import Constraint
from services.engine.vocab import ModelVocab
from turnout.errors import InvalidArgument, TurnoutError

log = logging.getLogger(__name__)


class CompileCancelled(Exception):
    """No request waits for the compile any more; it was stopped."""


@dataclass(eq=False)
class _Compile:
    constraint: Constraint
    future: Future[Any] = field(default_factory=Future)
    # Requests waiting for it (see GrammarCompiler.wanted).
    waiters: int = 0
    # The worker running it, while it runs.
    worker: CompileWorker | None = None
    cancelled: bool = False


class GrammarCompiler:
    def __init__(
        self,
        vocab: ModelVocab,
        *,
        timeout_s: float = 10.0,
        workers: int = 2,
        build: Build = xgrammar_build.build,
        max_cached: int = 512,
    ) -> None:
        self.vocab = vocab
        self.timeout_s = timeout_s
        self._build = build
        self._max_cached = max_cached
        self._cache: OrderedDict[Constraint, _Compile] = OrderedDict()
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Compile | None] = queue.SimpleQueue()
        self._num_slots = workers
        self._slots: list[threading.Thread] = []
        self._workers: set[CompileWorker] = set()
        # Compilations started (cache misses); a cache hit leaves it unchanged.
        self.num_compiled = 0
        # Workers killed (time limit, or nobody waiting) and replaced.
        self.num_replaced = 0
        weakref.finalize(self, _stop_slots, self._queue, workers)

    @contextlib.contextmanager
    def wanted(self, constraint: Constraint) -> Iterator[Future[Any]]:
        """The compiled grammar's future while the block runs; it raises InvalidArgument when the
        constraint does not compile or over the time limit. Leaving the block withdraws this request's
        interest: the compile is stopped once no request waits for it."""
        job = self._acquire(constraint)
        try:
            yield job.future
        finally:
            self._release(job)

    def compile(self, constraint: Constraint) -> Any:
        """Blocking compile (offline API, tests); raises InvalidArgument."""
        with self.wanted(constraint) as future:
            return future.result()

    def worker_pids(self) -> list[int | None]:
        with self._lock:
            return [worker.process.pid for worker in self._workers]

    def shutdown(self) -> None:
        _stop_slots(self._queue, len(self._slots))
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.kill()

    def _acquire(self, constraint: Constraint) -> _Compile:
        with self._lock:
            job = self._cache.get(constraint)
            if job is not None and not job.cancelled:
                self._cache.move_to_end(constraint)
                job.waiters += 1
                return job
            job = _Compile(constraint, waiters=1)
            self._cache[constraint] = job
            while len(self._cache) > self._max_cached:
                self._cache.popitem(last=False)
            self.num_compiled += 1
            if len(self._slots) < self._num_slots:
                # The slot holds the compiler weakly: an engine dropped without shutdown() stops its workers.
                slot = threading.Thread(
                    target=_run_slot, args=(weakref.ref(self), self._queue), name="grammar-compile", daemon=True
                )
                self._slots.append(slot)
                slot.start()
        self._queue.put(job)
        return job

    def _release(self, job: _Compile) -> None:
        with self._lock:
            job.waiters -= 1
            if job.waiters > 0 or job.future.done():
                return
            job.cancelled = True
            self._uncache(job)
            if job.future.cancel():  # still queued: the slot skips it
                return
            worker = job.worker
        if worker is not None:
            log.info("grammar compile cancelled: no request waits for it", extra={"kind": job.constraint.kind})
            worker.kill()

    def _uncache(self, job: _Compile) -> None:
        if self._cache.get(job.constraint) is job:
            del self._cache[job.constraint]

    # -- a worker slot ------------------------------------------------------------

    def _take(self, job: _Compile, worker: CompileWorker | None) -> CompileWorker | None:
        """Run one queued job on this slot's worker (started if needed); the worker to use next."""
        if job.future.cancelled():
            return worker
        if worker is None or not worker.alive:
            try:
                worker = self._start_worker()
            except TurnoutError as exc:
                with self._lock:
                    self._uncache(job)
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(exc)
                return None
        with self._lock:
            if not job.future.set_running_or_notify_cancel():
                return worker
            job.worker = worker
        try:
            outcome = self._run(job, worker)
        except Exception as exc:  # a bug here must not leave this slot's later jobs waiting forever
            log.exception("grammar compile failed")
            outcome = _Uncached(f"{job.constraint.kind}: the grammar compiler failed: {type(exc).__name__}")
        with self._lock:
            job.worker = None
            if isinstance(outcome, BaseException) and type(outcome) is not InvalidArgument:
                self._uncache(job)  # only grammars and definite compile errors are kept
        if isinstance(outcome, BaseException):
            job.future.set_exception(outcome)
        else:
            job.future.set_result(outcome)
        if worker.alive:
            return worker
        self._retire(worker)
        return self._replacement()

    def _run(self, job: _Compile, worker: CompileWorker) -> Any:
        """The compiled grammar, or the exception to give its waiters."""
        kind = job.constraint.kind
        try:
            serialized = worker.compile(job.constraint, self.timeout_s)
        except CompileTimeout:
            log.warning("grammar compile timed out", extra={"kind": kind, "timeout_s": self.timeout_s})
            return _Uncached(
                f"{kind}: compiling the constraint took longer than {self.timeout_s:g} s (the server's "
                "--grammar-compile-timeout); simplify it"
            )
        except WorkerDied as exc:
            if job.cancelled:
                return CompileCancelled()
            log.error("grammar compile worker died", extra={"kind": kind, "error": str(exc)})
            return _Uncached(f"{kind}: the grammar compiler crashed on this constraint ({exc})")
        except InvalidArgument as exc:
            return exc
        import xgrammar as xgr

        return xgr.CompiledGrammar.deserialize_json(serialized, self.vocab.tokenizer_info)

    @cached_property
    def _tokenizer_info_json(self) -> str:
        return str(self.vocab.tokenizer_info.serialize_json())

    def _start_worker(self) -> CompileWorker:
        worker = CompileWorker(lambda: self._tokenizer_info_json, self._build)
        with self._lock:
            self._workers.add(worker)
        return worker

    def _retire(self, worker: CompileWorker) -> None:
        with self._lock:
            self._workers.discard(worker)
        self.num_replaced += 1

    def _replacement(self) -> CompileWorker | None:
        """A new worker now, so the next compile does not wait for one to start (None: it failed; the
        next job tries again and reports why)."""
        try:
            return self._start_worker()
        except TurnoutError:
            log.exception("cannot start a grammar compile worker")
            return None


class _Uncached(InvalidArgument):
    """A refusal that depends on the moment (time limit, crash): not kept in the cache."""


def _run_slot(compiler_ref: weakref.ref[GrammarCompiler], jobs: queue.SimpleQueue[_Compile | None]) -> None:
    """One worker slot: takes queued jobs until told to stop or the compiler is gone, then kills its worker.
    The compiler is referenced only while a job runs."""
    compiler = compiler_ref()
    # Started before taking a job, so a job never waits for a worker another slot has ready.
    worker = compiler._replacement() if compiler is not None else None
    del compiler
    try:
        while (job := jobs.get()) is not None:
            compiler = compiler_ref()
            if compiler is None:
                return
            worker = compiler._take(job, worker)
            del compiler
    finally:
        if worker is not None:
            worker.kill()


def _stop_slots(jobs: queue.SimpleQueue[_Compile | None], count: int) -> None:
    for _ in range(count):
        jobs.put(None)
