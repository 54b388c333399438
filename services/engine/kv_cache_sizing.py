"""How many KV blocks the pool gets.

In order: `--num-kv-blocks`; else `--kv-cache-memory` GiB; else a share of the
memory that is free now (on CPU a fifth of available RAM, at most 4 GiB; on
CUDA 90% of free device memory after the weights, until the GPU work brings a
profiling pass). Never more than the running cap times the context can use.
"""

from __future__ import annotations

import os

import torch

from services.engine.config import EngineConfig
from services.engine.model_loader import LoadedModel

GIB = 1 << 30
CPU_SHARE = 0.2
CPU_CAP_BYTES = 4 * GIB
CUDA_SHARE = 0.9


def _available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * CUDA_SHARE)
    pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(min(pages * CPU_SHARE, CPU_CAP_BYTES))


def num_kv_blocks(config: EngineConfig, loaded: LoadedModel) -> int:
    useful = -(-config.max_running_requests * loaded.max_model_len // config.block_size)
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = loaded.kv_bytes_per_block(config.block_size)
    budget = (
        int(config.kv_cache_memory_gib * GIB)
        if config.kv_cache_memory_gib is not None
        else _available_bytes(loaded.device)
    )
    blocks = min(budget // per_block, useful)
    if blocks < 1:
        raise ValueError(f"the KV cache budget of {budget} bytes holds no block of {per_block} bytes")
    return int(blocks)
