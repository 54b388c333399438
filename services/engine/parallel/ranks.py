"""Rank 0's side of a tensor-parallel engine: it starts the other ranks, joins the group with them,
watches them, and stops them.

    turnout engine --tensor-parallel-size N          (rank 0: scheduler, sampler, gRPC service)
      +- python -m services.engine.parallel.worker   (rank 1)   \\  each: its shard of the model and
      +- ...                                                     >  of the KV cache, following rank
      +- python -m services.engine.parallel.worker   (rank N-1) /   0's steps (worker.py)

A worker gets its `WorkerSpec` (the engine's config, its rank, the group's address) pickled on its
stdin, and dies with rank 0 (PR_SET_PDEATHSIG). A worker that exits while rank 0 runs is a lost
rank: the engine cannot compute another step, so `on_lost` is called (the service stops: its
health goes NOT_SERVING and the process exits, and the router drops it from its pool), the
remaining ranks are ended, and the next collective on rank 0 fails instead of waiting.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from services.engine.config import EngineConfig
from services.engine.models.checkpoint_config import read_checkpoint_config
from services.engine.parallel.group import TensorParallel, backend_for, check_divisible
from turnout.security import ServiceSecurity

log = logging.getLogger(__name__)

# How long rank 0 waits for the other ranks to start (they join before loading the model).
JOIN_TIMEOUT_S = 300.0
# How long stopped workers get to leave before they are killed.
STOP_GRACE_S = 10.0
WATCH_INTERVAL_S = 0.2


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker process needs to know, sent on its stdin."""

    config: EngineConfig
    rank: int
    address: str  # host:port of the group's store, served by rank 0
    backend: str
    num_threads: int | None  # CPU: torch threads of this rank (None: torch's default)


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """Rank r's device: cuda:r on CUDA (one GPU per rank), else the CPU."""
    from services.engine.model_loader import pick_device

    device = pick_device(config.device)
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count()
    if config.tensor_parallel_size > count:
        raise ValueError(f"--tensor-parallel-size {config.tensor_parallel_size} needs as many GPUs; {count} visible")
    return torch.device("cuda", rank)


def cpu_threads_per_rank(world_size: int, device: torch.device) -> int | None:
    """On the CPU, the ranks share the engine's threads (OMP_NUM_THREADS, which `turnout serve
    --engines` sets per replica, else every core) instead of each taking as many; None elsewhere."""
    if device.type != "cpu":
        return None
    budget = os.environ.get("OMP_NUM_THREADS", "").strip()
    threads = int(budget) if budget.isdigit() else (os.cpu_count() or 1)
    return max(1, threads // world_size)


class Ranks:
    """The group seen from rank 0: `tp` for the model, and the other ranks' processes."""

    def __init__(
        self, tp: TensorParallel, workers: list[subprocess.Popen[bytes]], threads_before: int | None = None
    ) -> None:
        self.tp = tp
        self.workers = workers
        # Rank 0's torch threads before it took its share of the cores; given back when the ranks stop.
        self._threads_before = threads_before
        self.lost: str | None = None  # why a rank was lost, once one was
        self._stopping = False
        self._on_lost: Callable[[str], None] | None = None
        self._watcher = threading.Thread(target=self._watch, name="tp-ranks-watch", daemon=True)
        self._watcher.start()

    @classmethod
    def start(cls, config: EngineConfig) -> Ranks:
        """Start ranks 1..N-1 and join the group with them as rank 0; ValueError before any
        process starts when the model does not split over N ranks."""
        world_size = config.tensor_parallel_size
        check_divisible(read_checkpoint_config(config.model), world_size)
        device = rank_device(config, 0)
        backend = backend_for(config.distributed_backend, device)
        threads = cpu_threads_per_rank(world_size, device)
        threads_before = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
        address = f"127.0.0.1:{store.port}"
        # The workers serve nothing: they get no credentials.
        worker_config = replace(config, security=ServiceSecurity())
        workers = [_spawn(WorkerSpec(worker_config, r, address, backend, threads)) for r in range(1, world_size)]
        try:
            _wait_started(store, workers)
            tp = TensorParallel.join(0, world_size, store, backend, device)
        except BaseException:
            for worker in workers:
                worker.kill()
                worker.wait()
            torch.set_num_threads(threads_before)
            raise
        log.info("tensor parallel group ready", extra={"ranks": world_size, "backend": backend, "device": str(device)})
        return cls(tp, workers, threads_before)

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call `callback(reason)` (from the watcher thread) once a rank is lost; at once if one was."""
        self._on_lost = callback
        if self.lost is not None:
            callback(self.lost)

    def stop(self, send_shutdown: Callable[[], None]) -> None:
        """End the other ranks: `send_shutdown()` (rank 0's channel; called only when no step is
        running and every rank is alive) asks them to leave their loop, stragglers are killed."""
        self._stopping = True
        if self.lost is None and all(w.poll() is None for w in self.workers):
            try:
                send_shutdown()
            except RuntimeError as exc:  # a rank went away meanwhile: the kill below ends the rest
                log.warning("tensor parallel shutdown message failed", extra={"error": str(exc)})
        deadline = time.monotonic() + STOP_GRACE_S
        for worker in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=max(0.0, deadline - time.monotonic()))
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        # 0 for each rank that left on the shutdown message; -9 for one that had to be killed.
        log.info("tensor parallel ranks stopped", extra={"exit_codes": [w.returncode for w in self.workers]})
        if self.lost is None or self.tp.device.type != "cuda":  # NCCL may wait on a dead rank forever
            self.tp.leave()
        self._give_back_threads()

    def abandon(self) -> None:
        """Kill the other ranks at once (rank 0 failed to build its engine: they may be mid-load)."""
        self._stopping = True
        for worker in self.workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
        self.tp.leave()
        self._give_back_threads()

    def _give_back_threads(self) -> None:
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    def _watch(self) -> None:
        while not self._stopping:
            for rank, worker in enumerate(self.workers, start=1):
                code = worker.poll()
                if code is not None and not self._stopping:
                    self._lose(f"tensor parallel rank {rank} (pid {worker.pid}) exited with code {code}")
                    return
            time.sleep(WATCH_INTERVAL_S)

    def _lose(self, reason: str) -> None:
        self.lost = reason
        log.error("tensor parallel rank lost: this engine cannot compute another step", extra={"reason": reason})
        for worker in self.workers:
            if worker.poll() is None:
                worker.kill()
        if self._on_lost is not None:
            self._on_lost(reason)


def started_key(rank: int) -> str:
    """Set in the group's store by a worker about to join the group."""
    return f"turnout/started/{rank}"


def _wait_started(store: dist.TCPStore, workers: list[subprocess.Popen[bytes]]) -> None:
    """Until every worker announced itself in the store: RuntimeError at once when one exits first
    (an import error, a bad device), or after JOIN_TIMEOUT_S. Joining the group itself has no
    deadline short enough (its timeout is the group's), so only started ranks are joined."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for rank, worker in enumerate(workers, start=1):
        while not store.check([started_key(rank)]):
            time.sleep(WATCH_INTERVAL_S)
            if worker.poll() is not None:
                raise RuntimeError(f"tensor parallel rank {rank} exited with code {worker.returncode} while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor parallel rank {rank} did not start within {JOIN_TIMEOUT_S:.0f}s")


def _spawn(spec: WorkerSpec) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if spec.num_threads is not None:
        env["OMP_NUM_THREADS"] = str(spec.num_threads)
    process = subprocess.Popen(
        [sys.executable, "-m", "services.engine.parallel.worker"], stdin=subprocess.PIPE, env=env
    )
    assert process.stdin is not None
    process.stdin.write(pickle.dumps(spec))
    process.stdin.close()
    return process
