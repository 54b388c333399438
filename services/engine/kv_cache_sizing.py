"""How many KV blocks the pool gets.

In order: `--num-kv-blocks`; else `--kv-cache-memory` GiB; else what the device has room for:
- CPU: a fifth of the RAM available now, at most 4 GiB;
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
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from services.engine.attention.backend import AttentionBackend, KVCache
from services.engine.config import EngineConfig
from services.engine.memory_profile import MemoryProfile, profile_memory
from services.engine.model_loader import LoadedModel

log = logging.getLogger(__name__)

GIB = 1 << 30
CPU_SHARE = 0.2
CPU_CAP_BYTES = 4 * GIB


def cpu_budget_bytes() -> int:
    pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(min(pages * CPU_SHARE, CPU_CAP_BYTES))


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


def num_kv_blocks(config: EngineConfig, loaded: LoadedModel, make_backend: Callable[[int], AttentionBackend]) -> int:
    """make_backend(num_blocks) builds the engine's backend over a new cache (the CUDA profile's probe)."""
    useful = -(-config.max_running_requests * loaded.max_model_len // config.block_size)
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = loaded.kv_bytes_per_block(config.block_size)
    if config.kv_cache_memory_gib is not None:
        budget = int(config.kv_cache_memory_gib * GIB)
    elif loaded.device.type == "cuda":
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
        budget = cpu_budget_bytes()
    blocks = min(budget // per_block, useful)
    if blocks < 1:
        raise ValueError(f"the KV cache budget of {budget} bytes holds no block of {per_block} bytes")
    return int(blocks)


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.2f} GiB"
