"""One engine's tensor-parallel group: its rank, its size, and the collectives the model needs.

Every rank runs the same forward on its shard of the weights; the only points where they
meet are the collectives below, issued in the same order on every rank (the model's layer
order). Rank 0 also runs the scheduler and the sampler (see step_channel.py).

The group runs on torch.distributed: gloo on CPU, NCCL on CUDA (`--distributed-backend auto`
picks by device). Its timeout is long on purpose: a worker waits in a broadcast for the next
step however long the engine stays idle, and a rank that dies is noticed by rank 0 watching
its processes (ranks.py) and by gloo's closed sockets, not by a timeout.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")
# How long a collective may wait for the other ranks: an idle engine's workers wait this long for a step.
GROUP_TIMEOUT = datetime.timedelta(days=365)


def backend_for(name: str, device: torch.device) -> str:
    """`auto`: NCCL for CUDA devices, gloo otherwise; NCCL is refused off CUDA (it has no CPU path)."""
    if name == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if name == "nccl" and device.type != "cuda":
        raise ValueError(f"--distributed-backend nccl needs CUDA devices (device: {device})")
    return name


def check_divisible(hf_config: Any, world_size: int) -> None:
    """ValueError naming the numbers when a model's heads or MLP rows do not split evenly over the ranks:
    each rank holds num_heads/N query heads, num_kv_heads/N KV heads and intermediate_size/N MLP rows."""
    if world_size == 1:
        return
    heads = int(hf_config.num_attention_heads)
    parts = {
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(hf_config, "num_key_value_heads", None) or heads),
        "intermediate_size": int(hf_config.intermediate_size),
    }
    bad = [f"{name}={value}" for name, value in parts.items() if value % world_size]
    if bad:
        raise ValueError(
            f"--tensor-parallel-size {world_size} must divide the model's {' and '.join(bad)} "
            f"(each rank holds an equal share of the heads and MLP rows)"
        )


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in its engine's group. Rank 0 is the engine the rest of the stack sees."""

    rank: int
    world_size: int
    device: torch.device

    @classmethod
    def join(cls, rank: int, world_size: int, store: dist.Store, backend: str, device: torch.device) -> TensorParallel:
        """Join the group whose rendezvous is `store` (rank 0 serves it); blocks until every rank joined."""
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=GROUP_TIMEOUT)
        return cls(rank, world_size, device)

    @property
    def is_driver(self) -> bool:
        """Rank 0: schedules, samples and serves; the other ranks only follow its steps."""
        return self.rank == 0

    def shard(self, size: int) -> tuple[int, int]:
        """This rank's [start, end) of a dimension of `size` split in world_size equal parts (the last
        part may run past `size`: the vocabulary is padded to a multiple of the group)."""
        per_rank = -(-size // self.world_size)
        start = self.rank * per_rank
        return start, start + per_rank

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x over the ranks, in place (row-parallel outputs, vocab-parallel embeddings)."""
        dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., n) of every rank concatenated along the last dim in rank order: (..., world_size * n)."""
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """x from rank 0 into x on every rank, in place."""
        dist.broadcast(x, src=0)
        return x

    def min_int(self, value: int) -> int:
        """The smallest of every rank's `value` (the KV pool all ranks can hold)."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
