"""How many KV blocks the pool gets.

In order: `--num-kv-blocks`; else `--kv-cache-memory` GiB (or vLLM's `VLLM_CPU_KVCACHE_SPACE`, read
by config.py); else a default for the device:
- CPU: 4 GiB (vLLM's default), at most a tenth of the machine's *total* RAM. Not a share of what is
  free at start-up: that made the pool depend on whatever else ran at that second (engines started
  minutes apart got 960 to 70,000 tokens). Whatever the source, the pool must then fit in the RAM
  available now (MemAvailable), or the engine refuses to start and says so;
- CUDA: a profiling pass (memory_profile.py) measures what this engine holds besides the pool at
  the worst moment of a step, and the pool gets the rest of its share, `--gpu-memory-utilization`
  of the device's total memory (vLLM's meaning: two engines on one GPU take 0.45 each):

      own  = weights and what else this engine allocated    [in use now - in use before loading]
           + activation peak                                 [largest prefill step + logits]
           + sampler working set                             [estimated]
           + decode graphs' pool                             [when captured]
      pool = total * utilization - own - the zero and scratch blocks

  and never more than is free: memory other processes hold is not this engine's to take.
Never more than the running cap times the context can use.

Tensor parallel: every rank sizes its own pool this way (its bytes per block hold num_kv_heads/N
heads; the budget, a memory size or a profile, is per rank, as vLLM's per-worker
VLLM_CPU_KVCACHE_SPACE), and every rank then takes the smallest pool of the group, since the one
scheduler on rank 0 hands the same block ids to every rank.

The pool must hold one sequence of `max_model_len` tokens, or a request with the default max_tokens
could never run (the stack would look ready and answer every such request 400). When it cannot:
`--max-model-len` given explicitly -> the engine refuses to start, naming the knobs; not given (the
model's own context) -> max_model_len is capped to what the pool holds, with a warning (as vLLM's
auto-fit does). The pool in tokens and the concurrency at full length are logged at start-up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.engine.attention.backend import AttentionBackend, KVCache
from services.engine.config import EngineConfig
from services.engine.memory_profile import MemoryProfile, profile_memory
from services.engine.model_loader import LoadedModel
from services.engine.parallel.group import TensorParallel

log = logging.getLogger(__name__)

GIB = 1 << 30
CPU_DEFAULT_BYTES = 4 * GIB
CPU_TOTAL_SHARE = 0.1
KNOBS = "--kv-cache-memory, --num-kv-blocks or --max-model-len"


@dataclass(frozen=True)
class KVPoolSize:
    """The pool's managed blocks and the max_model_len the engine serves with them."""

    blocks: int
    max_model_len: int


def cpu_default_bytes(total_ram_bytes: int) -> int:
    """The CPU pool when no size is given: fixed, at most a share of the machine, never of what is free now."""
    return min(CPU_DEFAULT_BYTES, int(total_ram_bytes * CPU_TOTAL_SHARE))


def total_ram_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def available_ram_bytes() -> int:
    """MemAvailable: what can be allocated without swapping, page cache included (MemFree is not)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_ram_available(pool_bytes: int, available_bytes: int) -> None:
    """ValueError when the CPU pool (managed blocks + the extra ones) does not fit in available RAM."""
    if pool_bytes > available_bytes:
        raise ValueError(
            f"the KV cache needs {_gib(pool_bytes)} of RAM but only {_gib(available_bytes)} is available "
            f"(MemAvailable): lower --kv-cache-memory (or --num-kv-blocks), or free memory"
        )


def fit_max_model_len(blocks: int, block_size: int, max_model_len: int, explicit: bool) -> int:
    """The max_model_len to serve with a pool of `blocks`: unchanged when one sequence of it fits;
    else ValueError when it was asked for explicitly, or capped to the pool with a warning."""
    tokens = blocks * block_size
    if tokens >= max_model_len:
        return max_model_len
    if explicit:
        raise ValueError(
            f"the KV cache holds {tokens} tokens ({blocks} blocks of {block_size}), less than one sequence of "
            f"--max-model-len {max_model_len}: raise --kv-cache-memory or --num-kv-blocks, or lower --max-model-len"
        )
    log.warning(
        "max_model_len capped to what the KV cache holds",
        extra={"max_model_len": tokens, "model_context": max_model_len, "raise_with": KNOBS},
    )
    return tokens


def profiled_budget_bytes(profile: MemoryProfile, utilization: float, bytes_per_block: int) -> int:
    """Bytes the pool's managed blocks may take (see the module docstring); ValueError when they
    cannot take one block."""
    extra = KVCache.NUM_EXTRA_BLOCKS * bytes_per_block
    allowed = int(profile.total_bytes * utilization)
    share = allowed - profile.own_bytes - extra
    free = profile.total_bytes - profile.in_use_bytes - profile.step_bytes - extra
    budget = min(share, free)
    if budget < bytes_per_block:
        raise ValueError(
            f"no room for the KV cache: --gpu-memory-utilization {utilization} allows this engine "
            f"{_gib(allowed)} of the device's {_gib(profile.total_bytes)}; its weights and the rest it "
            f"keeps take {_gib(profile.in_use_bytes - profile.others_bytes)}, a step's activations "
            f"{_gib(profile.activation_bytes)}, sampling {_gib(profile.sampler_bytes)}, CUDA graphs "
            f"{_gib(profile.graph_bytes)}; other processes and the CUDA context hold "
            f"{_gib(profile.others_bytes)}. That leaves {_gib(budget)} for blocks of {bytes_per_block} "
            "bytes: raise --gpu-memory-utilization or lower --max-num-batched-tokens (or "
            "--cuda-graph-max-bs, --max-running-requests)"
        )
    return budget


def size_kv_pool(
    config: EngineConfig,
    loaded: LoadedModel,
    make_backend: Callable[[int], AttentionBackend],
    available_bytes: Callable[[], int] = available_ram_bytes,
    tp: TensorParallel | None = None,
) -> KVPoolSize:
    """make_backend(num_blocks) builds the engine's backend over a new cache (the CUDA profile's probe);
    available_bytes() is the RAM a CPU pool must fit in; `tp`: every rank of the group calls this, and
    all get the smallest of their pools."""
    blocks = num_kv_blocks(config, loaded, make_backend)
    if tp is not None:
        blocks = tp.min_int(blocks)
    if loaded.device.type == "cpu":
        pool_bytes = (blocks + KVCache.NUM_EXTRA_BLOCKS) * loaded.kv_bytes_per_block(config.block_size)
        check_ram_available(pool_bytes, available_bytes())
    explicit = config.max_model_len is not None
    return KVPoolSize(blocks, fit_max_model_len(blocks, config.block_size, loaded.max_model_len, explicit))


def num_kv_blocks(config: EngineConfig, loaded: LoadedModel, make_backend: Callable[[int], AttentionBackend]) -> int:
    """make_backend(num_blocks) builds the engine's backend over a new cache (the CUDA profile's probe)."""
    useful = -(-config.max_running_requests * loaded.max_model_len // config.block_size)
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = loaded.kv_bytes_per_block(config.block_size)
    if config.kv_cache_memory_gib is not None:
        budget = int(config.kv_cache_memory_gib * GIB)
    elif loaded.device.type == "cuda":
        # A forward of the largest batch, the sampler and (when on) the CUDA graphs: seconds to a minute.
        log.info("sizing the KV cache: profiling a step's device memory")
        profile = profile_memory(config, loaded, make_backend)
        log.info(
            "device memory profiled",
            extra={
                "total": _gib(profile.total_bytes),
                "in_use": _gib(profile.in_use_bytes),
                "activations": _gib(profile.activation_bytes),
                "sampler": _gib(profile.sampler_bytes),
                "cuda_graphs": _gib(profile.graph_bytes),
            },
        )
        budget = profiled_budget_bytes(profile, config.gpu_memory_utilization, per_block)
    else:
        budget = cpu_default_bytes(total_ram_bytes())
    blocks = min(budget // per_block, useful)
    if blocks < 1:
        raise ValueError(
            f"the KV cache budget of {budget} bytes holds no block of {per_block} bytes: raise --kv-cache-memory"
        )
    return int(blocks)


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.2f} GiB"
