"""What a CUDA device holds besides the KV pool, measured once at start, after the weights load.

- the largest step the scheduler can build runs once (max_num_batched_tokens prompt tokens, then
  the logits of as many rows as can sample in one step) against a tiny temporary KV cache; the
  allocator's peak over it is the activation memory later steps need on top of what stays;
- with decode CUDA graphs, the largest graph's batch runs once eagerly over DecodeGraphs' own
  buffers: its peak stands for the graphs' memory pool. Capturing first and measuring the pool
  is not possible: a capture records the addresses of the real KV cache, whose size is what this
  profile decides. A replay runs the captured kernels on the captured shapes, so the pool holds
  about what one eager run of that batch allocates; the capture logs what it really took;
- the sampler's working set is estimated (SAMPLER_BYTES_PER_LOGIT), not run: it needs requests;
- the driver's free memory, read once the probes' memory is released, counts everything else
  in use: weights, the CUDA context, library workspaces, Triton modules, other processes; what
  was in use before the weights loaded (LoadedModel.device_bytes_in_use_before) is the part that
  is not this engine's.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import torch

from services.engine.attention.backend import AttentionBackend
from services.engine.attention.context import ForwardContext
from services.engine.config import EngineConfig
from services.engine.cuda_graphs import DecodeGraphs, blocks_per_sequence, decode_graphs_refusal, graph_table_width
from services.engine.model_loader import LoadedModel

# Bytes the sampler may hold per logit of a step: a float32 working copy of the logits, a sort's
# float32 values and int64 order (top-p, min-p), and float32 probabilities.
SAMPLER_BYTES_PER_LOGIT = 4 + 4 + 8 + 4
# Blocks of the probes' temporary KV cache: their tokens write its scratch block, read its zero block.
PROBE_KV_BLOCKS = 1


@dataclass(frozen=True)
class MemoryProfile:
    total_bytes: int  # the device's memory
    in_use_bytes: int  # in use once the probes are released: weights, CUDA context, other processes
    others_bytes: int  # in use before this engine loaded its weights: other processes, the CUDA context
    activation_bytes: int  # allocator's peak rise over the largest step's forward and logits
    sampler_bytes: int  # estimated working set of sampling the largest step's rows
    graph_bytes: int  # allocator's peak rise over the largest decode graph's batch; 0 without graphs

    @property
    def step_bytes(self) -> int:
        """What a step needs on top of what stays: activations, sampling, the decode graphs' pool."""
        return self.activation_bytes + self.sampler_bytes + self.graph_bytes

    @property
    def own_bytes(self) -> int:
        """This engine's memory besides the KV pool, at the worst moment of a step."""
        return self.in_use_bytes - self.others_bytes + self.step_bytes


def prefill_probe_context(backend: AttentionBackend, num_tokens: int, max_model_len: int) -> ForwardContext:
    """num_tokens prompt tokens as sequences of at most max_model_len, nothing cached. Every token
    writes the cache's scratch slot and reads its zero block: the memory a forward needs does not
    depend on the values."""
    cache = backend.kv_cache
    device = cache.k[0].device
    lengths = [min(max_model_len, num_tokens - start) for start in range(0, num_tokens, max_model_len)]
    width = blocks_per_sequence(max(lengths), cache.block_size)

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return ForwardContext(
        backend=backend,
        positions=tensor([p for length in lengths for p in range(length)]),
        slot_mapping=torch.full((num_tokens,), cache.scratch_slot, dtype=torch.int64, device=device),
        query_start_loc=tensor([0, *accumulate(lengths)]),
        seq_lens=tensor(lengths),
        block_tables=torch.full((len(lengths), width), cache.null_block, dtype=torch.int64, device=device),
        query_lens_cpu=lengths,
        seq_lens_cpu=lengths,
    )


def prefill_probe(
    model: torch.nn.Module, backend: AttentionBackend, num_tokens: int, max_model_len: int, logit_rows: int
) -> torch.Tensor:
    """The largest step: a forward over prefill_probe_context's tokens (all id 0), then the logits of
    its first logit_rows rows: (logit_rows, V)."""
    ctx = prefill_probe_context(backend, num_tokens, max_model_len)
    input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=ctx.positions.device)
    with torch.inference_mode():
        hidden = model(input_ids, ctx.positions, ctx)  # (T, hidden)
        return model.compute_logits(hidden[:logit_rows])  # type: ignore[operator,no-any-return]


def profile_memory(
    config: EngineConfig, loaded: LoadedModel, make_backend: Callable[[int], AttentionBackend]
) -> MemoryProfile:
    """Measure the device (CUDA only). make_backend(num_blocks) builds the engine's attention backend
    over a new KV cache of that many blocks."""
    device = loaded.device
    rows = min(config.max_running_requests, config.max_num_batched_tokens)
    # The probe backend and its cache live only inside this call, so they are released below.
    activation, graph = _probe_peaks(config, loaded, make_backend(PROBE_KV_BLOCKS), rows)
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return MemoryProfile(
        total_bytes=int(total),
        in_use_bytes=int(total - free),
        others_bytes=int(loaded.device_bytes_in_use_before or 0),
        activation_bytes=activation,
        sampler_bytes=rows * loaded.vocab_size * SAMPLER_BYTES_PER_LOGIT,
        graph_bytes=graph,
    )


def _probe_peaks(config: EngineConfig, loaded: LoadedModel, backend: AttentionBackend, rows: int) -> tuple[int, int]:
    """The allocator's peak rise over the prefill probe, and over the largest decode graph's batch
    (0 when decode graphs are off)."""
    device = loaded.device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()

    def peak_rise(probe: Callable[[], object]) -> int:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        probe()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)

    tokens, max_model_len = config.max_num_batched_tokens, loaded.max_model_len
    activation = peak_rise(lambda: prefill_probe(loaded.model, backend, tokens, max_model_len, rows))
    if decode_graphs_refusal(config, device, backend) is not None:
        return activation, 0
    size = config.cuda_graph_batch_limit
    width = graph_table_width(config, max_model_len)
    # The graphs' buffers are part of what they keep, so they are allocated inside the measurement.
    graph = peak_rise(lambda: DecodeGraphs(loaded.model, backend, size, width, device, eager=True).run_padding(size))
    return activation, graph
