"""Decode steps replayed from CUDA graphs: the model forward and the logits, one graph per batch size.

A decode-only step (every sequence brings one token) launches hundreds of small kernels; at small
batch sizes their launch overhead outlasts their work. Each graph is captured once at start and
replayed with new buffer contents.

Sizes: 1, 2, 4, 8, then every 8 up to the largest (EngineConfig.cuda_graph_batch_limit), which is
always one of them. A batch of B rows replays the smallest size n >= B; rows B .. n-1 are padding.

Static buffers, sized for the largest graph (a graph recorded their addresses; a replay reads what
they hold), W = ceil(min(max_model_len, --cuda-graph-max-seq-len) / block_size): a decode batch
holding a longer sequence runs eagerly (the split-K decode grid grows with W, so a graph as wide
as a 128k context would launch thousands of idle programs every step):

    buffer            shape      row b < B (the batch)               padding row B <= b < n
    input_ids         (max,)     its token                           0
    positions         (max,)     its position                        0
    slot_mapping      (max,)     its new token's slot                KVCache.scratch_slot
    seq_lens          (max,)     its length                          1
    block_tables      (max, W)   its blocks, then the zero block     the zero block
    query_start_loc   (max+1,)   b: one token per row, never rewritten

A padding row attends over one position of the zero block (zeros, so its values stay finite) and
writes its K/V into the scratch block: never into a request's block, nor into the zero block that
padding and the ends of block tables read. Every run rewrites rows B .. n-1, so rows a larger batch
left behind are never replayed as stale requests.

All graphs share one memory pool, captured largest first so the smaller ones reuse its memory: the
logits one replay returns are valid until the next replay of any size, so a step's logits are used
(sampled, or copied) before the next step runs.

Eager mode (no capture; e.g. on CPU) runs the same padded buffers through the model directly, so
the padding is exercised where CUDA graphs cannot run.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass

import torch

from services.engine.attention.backend import AttentionBackend
from services.engine.attention.context import ForwardContext
from services.engine.config import EngineConfig
from services.engine.model_loader import LoadedModel

log = logging.getLogger(__name__)

SMALL_SIZES = (1, 2, 4)
SIZE_STEP = 8


def capture_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, ... below max_batch_size, then max_batch_size itself."""
    small = [size for size in SMALL_SIZES if size < max_batch_size]
    return [*small, *range(SIZE_STEP, max_batch_size, SIZE_STEP), max_batch_size]


def graph_table_width(config: EngineConfig, max_model_len: int) -> int:
    """Blocks per row of the graphs' block tables: enough for the longest sequence a replay holds."""
    return blocks_per_sequence(min(max_model_len, config.cuda_graph_max_seq_len), config.block_size)


def blocks_per_sequence(max_model_len: int, block_size: int) -> int:
    """Block-table width that holds any sequence the engine accepts."""
    return -(-max_model_len // block_size)


def decode_graphs_refusal(config: EngineConfig, device: torch.device, backend: AttentionBackend) -> str | None:
    """Why decode steps cannot replay CUDA graphs on this engine; None when they can."""
    if config.disable_cuda_graph:
        return "--disable-cuda-graph"
    if config.tensor_parallel_size > 1:
        # The ranks' collectives would have to be captured too, and every rank replay in step; not done yet.
        return "--tensor-parallel-size > 1 (decode steps run eagerly on every rank)"
    if device.type != "cuda":
        return f"the device is {device.type}, not cuda"
    if not backend.graph_safe_decode:
        return f"the attention backend {type(backend).__name__} cannot be captured (graph_safe_decode is False)"
    return None


@dataclass(frozen=True)
class CapturedGraph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # (n, V) float32, rewritten by every replay


class DecodeGraphs:
    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        max_batch_size: int,
        max_blocks_per_seq: int,
        device: torch.device,
        *,
        eager: bool = False,
    ) -> None:
        self.model = model
        self.backend = backend
        self.sizes = capture_sizes(max_batch_size)
        self.max_blocks_per_seq = max_blocks_per_seq
        self.eager = eager
        cache = backend.kv_cache
        self.null_block = cache.null_block
        self.scratch_slot = cache.scratch_slot

        def filled(shape: tuple[int, ...], value: int) -> torch.Tensor:
            return torch.full(shape, value, dtype=torch.int64, device=device)

        # Every row starts as padding (see the module docstring's table).
        self.input_ids = filled((max_batch_size,), 0)
        self.positions = filled((max_batch_size,), 0)
        self.slot_mapping = filled((max_batch_size,), self.scratch_slot)
        self.seq_lens = filled((max_batch_size,), 1)
        self.block_tables = filled((max_batch_size, max_blocks_per_seq), self.null_block)
        self.query_start_loc = torch.arange(max_batch_size + 1, dtype=torch.int64, device=device)
        self.graphs: dict[int, CapturedGraph] = {}

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def padded_size(self, batch_size: int) -> int:
        """The smallest size holding batch_size rows (batch_size <= max_batch_size)."""
        return self.sizes[bisect.bisect_left(self.sizes, batch_size)]

    def fits(self, ctx: ForwardContext) -> bool:
        """Whether a batch can run here: decode-only, at most max_batch_size rows, block tables no
        wider than the buffers."""
        return (
            ctx.is_decode_only
            and ctx.num_sequences <= self.max_batch_size
            and ctx.block_tables.shape[1] <= self.max_blocks_per_seq
        )

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Logits (B, V) float32 of a batch that fits, one row per sequence. From a graph they live in
        its pool: valid until the next run."""
        if not self.fits(ctx):
            raise ValueError(f"a batch of {ctx.num_sequences} sequences does not fit the decode graphs")
        rows = ctx.num_sequences
        size = self.padded_size(rows)
        self._load(input_ids, ctx, size)
        if self.eager:
            return self._forward(size, ctx.seq_lens_cpu + [1] * (size - rows))[:rows]
        captured = self.graphs[size]
        captured.graph.replay()
        return captured.logits[:rows]

    @torch.inference_mode()
    def run_padding(self, size: int) -> torch.Tensor:
        """Run `size` rows of padding alone, eagerly: the warm-up before a capture, and the memory
        probe of the largest graph. Logits (size, V)."""
        self._pad(0, size)
        return self._forward(size, [1] * size)

    @torch.inference_mode()
    def capture(self) -> None:
        """Record one graph per size, largest first, into one shared pool. CUDA only."""
        if self.eager:
            raise ValueError("eager decode graphs capture nothing")
        pool = torch.cuda.graph_pool_handle()
        warmup = torch.cuda.Stream()
        for size in reversed(self.sizes):
            # Lazy initialisation (library handles, Triton compilation for new shapes) must happen
            # before the capture: it cannot be recorded.
            warmup.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(warmup):
                self.run_padding(size)
            torch.cuda.current_stream().wait_stream(warmup)
            graph = torch.cuda.CUDAGraph()
            # _forward builds a fresh ForwardContext: nothing a backend derived and kept in the
            # warm-up's ctx.scratch reaches the graph, which must compute it itself.
            with torch.cuda.graph(graph, pool=pool):
                logits = self._forward(size, [1] * size)
            self.graphs[size] = CapturedGraph(graph, logits)

    def _load(self, input_ids: torch.Tensor, ctx: ForwardContext, size: int) -> None:
        """The batch into rows 0 .. B-1, padding into rows B .. size-1."""
        rows, width = ctx.num_sequences, ctx.block_tables.shape[1]
        self.input_ids[:rows].copy_(input_ids)
        self.positions[:rows].copy_(ctx.positions)
        self.slot_mapping[:rows].copy_(ctx.slot_mapping)
        self.seq_lens[:rows].copy_(ctx.seq_lens)
        self.block_tables[:rows, :width].copy_(ctx.block_tables)
        self.block_tables[:rows, width:].fill_(self.null_block)
        self._pad(rows, size)

    def _pad(self, start: int, end: int) -> None:
        self.input_ids[start:end].fill_(0)
        self.positions[start:end].fill_(0)
        self.slot_mapping[start:end].fill_(self.scratch_slot)
        self.seq_lens[start:end].fill_(1)
        self.block_tables[start:end].fill_(self.null_block)

    def _forward(self, size: int, seq_lens_cpu: list[int]) -> torch.Tensor:
        """The model and its logits over rows 0 .. size-1 of the buffers: (size, V) float32.
        seq_lens_cpu feeds backends that plan on the host (eager mode only: a graph-safe backend
        never reads it)."""
        ctx = ForwardContext(
            backend=self.backend,
            positions=self.positions[:size],
            slot_mapping=self.slot_mapping[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            query_lens_cpu=[1] * size,
            seq_lens_cpu=seq_lens_cpu,
        )
        hidden = self.model(self.input_ids[:size], ctx.positions, ctx)  # (size, hidden)
        return self.model.compute_logits(hidden)  # type: ignore[operator,no-any-return]


def build_decode_graphs(config: EngineConfig, loaded: LoadedModel, backend: AttentionBackend) -> DecodeGraphs | None:
    """Capture the decode graphs of an engine whose KV cache exists; None (logged why) when it cannot
    use them."""
    refusal = decode_graphs_refusal(config, loaded.device, backend)
    if refusal is not None:
        log.info("cuda graphs off", extra={"reason": refusal})
        return None
    graphs = DecodeGraphs(
        loaded.model,
        backend,
        config.cuda_graph_batch_limit,
        graph_table_width(config, loaded.max_model_len),
        loaded.device,
    )
    free_before, _ = torch.cuda.mem_get_info(loaded.device)
    start = time.perf_counter()
    graphs.capture()
    torch.cuda.synchronize(loaded.device)
    free_after, _ = torch.cuda.mem_get_info(loaded.device)
    log.info(
        "cuda graphs captured",
        extra={
            "sizes": graphs.sizes,
            "seconds": round(time.perf_counter() - start, 2),
            "memory_mib": (free_before - free_after) >> 20,
        },
    )
    return graphs
