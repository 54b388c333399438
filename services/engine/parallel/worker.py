"""A tensor-parallel rank other than 0: its shard of the model and of the KV cache, following rank 0.

Started by rank 0 (ranks.py) as `python -m services.engine.parallel.worker` with its `WorkerSpec`
pickled on stdin. It joins the group, loads its shards, sizes its KV pool exactly as rank 0 does
(the pool every rank can hold wins), then runs every forward rank 0 sends until the shutdown
message. It has no scheduler, sampler or server of its own, and dies with rank 0.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pickle
import signal
import sys

import torch
import torch.distributed as dist

from services.engine.attention.backend import AttentionBackend
from services.engine.kv_cache_sizing import size_kv_pool
from services.engine.model_loader import load_model
from services.engine.parallel.group import TensorParallel
from services.engine.parallel.ranks import WorkerSpec, rank_device, started_key
from services.engine.parallel.step_channel import LogitsMessage, StepChannel

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def follow(channel: StepChannel, model: torch.nn.Module, backend: AttentionBackend) -> None:
    """Run rank 0's forwards until it says stop: the same calls ModelRunner.run and compute_logits
    make there (the model forward, then the logits of the sampled rows when there are any)."""
    with torch.inference_mode():
        while (message := channel.receive(backend)) is not None:
            if isinstance(message, LogitsMessage):
                model.compute_logits(message.hidden)  # type: ignore[operator]
                continue
            hidden = model(message.input_ids, message.context.positions, message.context)  # (T, hidden)
            if message.sample_rows.numel():
                model.compute_logits(hidden[message.sample_rows])  # type: ignore[operator]


def run(spec: WorkerSpec) -> None:
    config, rank = spec.config, spec.rank
    if spec.num_threads is not None:
        torch.set_num_threads(spec.num_threads)
    device = rank_device(config, rank)
    host, port = spec.address.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), config.tensor_parallel_size, is_master=False)
    store.set(started_key(rank), "1")
    tp = TensorParallel.join(rank, config.tensor_parallel_size, store, spec.backend, device)
    loaded = load_model(config, tp)

    def make_backend(num_blocks: int) -> AttentionBackend:
        return loaded.make_backend(num_blocks, config.block_size, config.attention_backend)

    pool = size_kv_pool(config, loaded, make_backend, tp=tp)
    follow(StepChannel(tp, loaded.dtype), loaded.model, make_backend(pool.blocks))
    tp.leave()


def main() -> None:
    # Rank 0 ends its ranks: die with it (even SIGKILLed), and leave Ctrl-C of the terminal to it. The
    # signal comes when the *thread* that started this process ends: rank 0 stops its ranks before that.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    spec: WorkerSpec = pickle.load(sys.stdin.buffer)
    if os.getppid() != parent:  # rank 0 died before the request took effect
        sys.exit(1)
    logging.basicConfig(level=logging.INFO, format=f"tp-rank-{spec.rank} %(levelname)s %(name)s: %(message)s")
    run(spec)


if __name__ == "__main__":
    main()
