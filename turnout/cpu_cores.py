"""Which CPUs a process's threads run on: an engine's compute threads on cores of their own, the rest elsewhere.

On the CPU an engine step is an OpenMP team, one thread per core, meeting at a barrier ~150 times a
step. A gateway, router or tokenizer thread that wakes while every core is busy runs on the core of
a team thread and preempts it, and the whole team then waits for that thread at the next barrier;
the kernel does this even when the team is smaller than the machine (on 2 cores with a one-thread
engine, the router preempted the step thread 2.4 times a token while the other core had nothing
to run; docs/benchmarks.md, "Cores of their own"). Keeping them apart:

- `turnout engine --cpu-cores LIST` runs the engine's step thread, and so the OpenMP team it starts,
  on LIST (one OpenMP thread per physical core of it unless OMP_NUM_THREADS says otherwise), and
  every other thread of the process (event loop, gRPC, logs) on the CPUs it may use outside LIST.
  vLLM's CPU backend binds its OpenMP threads the same way (VLLM_CPU_OMP_THREADS_BIND).
- `turnout serve --cpu-reserved-cores N` keeps the first N CPUs the launcher may use for the gateway,
  router, tokenizer and the engines' event loops, and gives each engine replica a contiguous share
  of the others as its `--cpu-cores` (vLLM keeps cores for its front end the same way,
  VLLM_CPU_NUM_OF_RESERVED_CPU).

Nothing is bound by default: a reserved core is a core the engine's step does not use, which on a
small machine costs more than it saves (docs/benchmarks.md has both sides).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

OMP_THREADS_ENV = "OMP_NUM_THREADS"


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """`0-3,8` (the kernel's cpuset list format) or a JSON list `[0, 1, 2, 3, 8]`: the CPUs, sorted, once each."""
    text = text.strip()
    try:
        if text.startswith("["):
            items = json.loads(text)
            if not isinstance(items, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
                raise ValueError("a JSON list of CPU numbers")
            cpus = set(items)
        else:
            cpus = set()
            for part in text.split(","):
                first, dash, last = part.strip().partition("-")
                low, high = int(first), int(last) if dash else int(first)
                if high < low:
                    raise ValueError(f"the range {part.strip()!r} runs backwards")
                cpus.update(range(low, high + 1))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a CPU list like 0-3,8 ({exc}): {text!r}") from None
    if not cpus:
        raise argparse.ArgumentTypeError("the CPU list is empty")
    if min(cpus) < 0:
        raise argparse.ArgumentTypeError(f"CPU numbers are 0 or more: {text!r}")
    return tuple(sorted(cpus))


def show_cpu_list(cpus: Iterable[int]) -> str:
    """The kernel's list format: (0, 1, 2, 3, 8) -> '0-3,8'."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def can_bind() -> bool:
    return hasattr(os, "sched_setaffinity")


def allowed_cpus() -> tuple[int, ...]:
    """The CPUs the calling thread may run on (its affinity: a container's cpuset, `taskset`)."""
    if not can_bind():
        return tuple(range(os.cpu_count() or 1))
    return tuple(sorted(os.sched_getaffinity(0)))


def physical_cores(cpus: Sequence[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> int:
    """How many physical cores `cpus` are on (hyperthreads of one core count once); len(cpus) where
    the kernel does not say."""
    cores: set[str] = set()
    for cpu in cpus:
        try:
            cores.add((sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text().strip())
        except OSError:
            cores.add(f"cpu{cpu}")
    return len(cores)


@dataclass(frozen=True)
class CorePlan:
    """`turnout serve --cpu-reserved-cores`: the CPUs of the services, and each engine replica's."""

    services: tuple[int, ...]
    engines: tuple[tuple[int, ...], ...]


def plan_cores(allowed: Sequence[int], reserved: int, replicas: int) -> CorePlan:
    """The first `reserved` of `allowed` for the services, the rest split between `replicas` engines in
    contiguous shares whose sizes differ by one at most; ValueError when a replica would get none."""
    if reserved < 1:
        raise ValueError(f"--cpu-reserved-cores must be at least 1 to reserve any, got {reserved}")
    if reserved + replicas > len(allowed):
        raise ValueError(
            f"--cpu-reserved-cores {reserved} leaves {len(allowed) - reserved} of the {len(allowed)} CPUs this "
            f"process may use ({show_cpu_list(allowed)}) for {replicas} engine replica(s); each needs one"
        )
    rest = tuple(allowed[reserved:])
    shares: list[tuple[int, ...]] = []
    start = 0
    for i in range(replicas):
        size = len(rest) // replicas + (1 if i < len(rest) % replicas else 0)
        shares.append(rest[start : start + size])
        start += size
    return CorePlan(tuple(allowed[:reserved]), tuple(shares))


def bind_process(pid: int | str, cpus: Sequence[int]) -> None:
    """Every thread process `pid` has now (and so every one they start) runs on `cpus`; nothing for a
    process or thread that ended meanwhile (its exit is reported where it is waited for)."""
    try:
        tasks = [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return
    for task in tasks:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(task, cpus)


def bind_process_outside(cpus: Sequence[int]) -> tuple[int, ...]:
    """On an engine's main thread, before it starts its step thread: every thread the process has so far
    (and so every one they start) runs on the CPUs it may use other than `cpus` (all of them when
    `cpus` is all it may use). Returns those CPUs; ValueError when `cpus` names one it may not use."""
    if not can_bind():
        raise ValueError("--cpu-cores needs Linux (sched_setaffinity)")
    allowed = allowed_cpus()
    unknown = sorted(set(cpus) - set(allowed))
    if unknown:
        raise ValueError(
            f"--cpu-cores lists CPUs this process may not use: {show_cpu_list(unknown)} (it may use "
            f"{show_cpu_list(allowed)})"
        )
    others = tuple(c for c in allowed if c not in cpus) or allowed
    bind_process("self", others)
    return others


def bind_compute_thread(cpus: Sequence[int]) -> int:
    """On the engine's step thread, before its first parallel op: it and the OpenMP team it starts run
    on `cpus`, one OpenMP thread per physical core of them unless OMP_NUM_THREADS was set (also
    written to the environment, where tensor-parallel ranks read their share). Returns the threads."""
    import torch

    os.sched_setaffinity(0, cpus)
    if OMP_THREADS_ENV in os.environ:
        return torch.get_num_threads()
    threads = physical_cores(cpus)
    os.environ[OMP_THREADS_ENV] = str(threads)
    torch.set_num_threads(threads)
    return threads
