"""The kernel launches the engine makes for a model, made the way the engine makes them.

One table for whoever needs to know what the CUDA path compiles without running it on a GPU:
the ahead-of-time compile tests (tests/engine/kernels/test_aot_compile.py) and the kernel report
(`make kernel-report`, benchmarks/kernel_report.py) run every entry on "meta" tensors with
Triton's launch intercepted (benchmarks/kernel_aot.py), and compile what each launch would have
compiled. Every entry calls a kernel's own launcher, so the tile sizes, num_warps and other
constexprs are the launcher's own choice, never a copy of it; the table only says which calls
the engine makes and how their tensors are laid out:

    call site                          launcher                  tensors, as the engine has them
    models.layers.RMSNorm              rms_norm                  (T, hidden): the first layer's input
                                       fused_add_rms_norm        (T, hidden) x and residual
    models.layers.Rotation.rotate      rotary_embedding          q, k: views of the fused qkv output
    attention.TritonAttentionBackend   kv_store                  rotated k (new), v (a view of qkv)
                                       paged_decode              decode-only steps: CUDA-graph width
                                                                 and eager widths of every merge tile
                                       extend_attention          one prompt; a mixed batch
    sampler.draw                       exponential_race_argmax   float32 logits (R, W), W from the
                                                                 full vocabulary down to top-k widths
    lora.weights.LoraWeights.add_to    lora_grouped_matmul       steps with LoRA tokens: each adapted
                                                                 projection (qkv, o, gate_up, down)
                                                                 at the default --max-lora-rank

Runtime integers a kernel does not declare `do_not_specialize` (strides, widths, counts) make
Triton compile one variant per class (== 1, divisible by 16, other) of their values; the steps
below sample those classes as the engine meets them, while every constexpr value a launcher can
pick for these shapes is covered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch

from services.engine.attention.backend import KVCache
from services.engine.config import EngineConfig
from services.engine.cuda_graphs import blocks_per_sequence
from services.engine.kernels.extend_attention import extend_attention
from services.engine.kernels.kv_store import kv_store
from services.engine.kernels.lora_matmul import lora_grouped_matmul
from services.engine.kernels.paged_decode import paged_decode
from services.engine.kernels.rms_norm import fused_add_rms_norm, rms_norm
from services.engine.kernels.rotary import rotary_embedding
from services.engine.kernels.sampling import exponential_race_argmax
from services.engine.lora.batch import LoraBatch
from services.engine.models.layers import QKVLinear

_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(EngineConfig)}
BLOCK_SIZE: int = _DEFAULTS["block_size"]
# Block-table width of the captured decode graphs (cuda_graphs.graph_table_width) for a model
# whose context reaches the default --cuda-graph-max-seq-len.
GRAPH_TABLE_WIDTH = blocks_per_sequence(_DEFAULTS["cuda_graph_max_seq_len"], BLOCK_SIZE)
# Eager decode steps: the block table is as wide as the batch's longest sequence. At 16 blocks
# per split-K partition these give 1, 2, 4, 7 and 13 partitions: the single-partition kernel and
# merge tiles of 2, 4, 8 and 16 (the graph width's 32 partitions give the tile of 32).
EAGER_TABLE_WIDTHS = (7, 25, 50, 100, 200)
# Candidate widths the sampler's draw meets: the whole vocabulary, or what top-k / top-p left
# (one width per BLOCK_COLUMNS the launcher can pick).
CANDIDATE_WIDTHS = (5, 12, 20, 50, 100, 200, 400)
LORA_RANK: int = _DEFAULTS["max_lora_rank"]
LORA_SLOTS = 4  # slots do not change what compiles: the slot is a runtime index
KV_BLOCKS = 1000  # blocks in the pool (only the divisibility of its slot count matters)
EPS = 1e-5


class ModelDims(Protocol):
    """What the kernels see of a model (benchmarks.model_shapes.ModelShape has these)."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...


@dataclass(frozen=True)
class EngineCall:
    """One launcher call of the engine: `run()` makes it (on the tensors' device)."""

    launcher: str
    step: str  # which engine step makes it, e.g. "decode, eager, 25 blocks"
    run: Callable[[], object]


def engine_calls(model: ModelDims, dtype: torch.dtype, device: torch.device | str = "meta") -> list[EngineCall]:
    """Every launcher call the engine makes for `model` run in `dtype`, on `device` tensors."""
    device = torch.device(device)
    hidden, heads, kv_heads, head_dim = model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim

    def empty(*shape: int, like: torch.dtype = dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=like, device=device)

    tokens = 37  # rows do not change what compiles: every grid is sized from them
    x, residual, weight = empty(tokens, hidden), empty(tokens, hidden), empty(hidden)
    qkv_proj = QKVLinear(hidden, heads, kv_heads, head_dim, bias=False).to(device=device, dtype=dtype)
    q, k, v = qkv_proj(x)  # (T, Hq, D), (T, Hkv, D), (T, Hkv, D): views of one (T, (Hq + 2 Hkv) D)
    positions, inv_freq = empty(tokens, like=torch.int64), empty(head_dim // 2, like=torch.float32)
    cache = KVCache(1, KV_BLOCKS, BLOCK_SIZE, kv_heads, head_dim, dtype, device)
    k_cache, v_cache = cache.k[0], cache.v[0]
    q_rotated, k_rotated = empty(tokens, heads, head_dim), empty(tokens, kv_heads, head_dim)  # rotary's outputs
    scale = head_dim**-0.5

    def decode(width: int) -> Callable[[], object]:
        batch = 8
        return lambda: paged_decode(
            q_rotated[:batch],
            k_cache,
            v_cache,
            empty(batch, width, like=torch.int64),
            empty(batch, like=torch.int64),
            scale,
        )

    def extend(seqs: int, width: int) -> Callable[[], object]:
        return lambda: extend_attention(
            q_rotated,
            k_cache,
            v_cache,
            empty(seqs, width, like=torch.int64),
            empty(seqs + 1, like=torch.int64),
            empty(seqs, like=torch.int64),
            scale,
        )

    def draw(width: int) -> Callable[[], object]:
        return lambda: exponential_race_argmax(empty(8, width, like=torch.float32), seed=2**40, offset=2**40)

    # Two adapters and base tokens between them, as build_batch lays a mixed step out.
    lora_batch = LoraBatch.of([0, -1, 1, 0] * (tokens // 4) + [-1] * (tokens % 4), device)
    assert lora_batch is not None

    def lora(projection: str, in_features: int, shards: int, out_features: int) -> EngineCall:
        a = empty(LORA_SLOTS, in_features, shards * LORA_RANK)
        b = empty(LORA_SLOTS, shards * LORA_RANK, out_features)
        activations = empty(tokens, in_features)
        return EngineCall(
            "lora_grouped_matmul", f"LoRA of {projection}", lambda: lora_grouped_matmul(activations, a, b, lora_batch)
        )

    inner = model.intermediate_size
    return [
        EngineCall("rms_norm", "first layer's input norm", lambda: rms_norm(x, weight, EPS)),
        EngineCall("fused_add_rms_norm", "residual add + norm", lambda: fused_add_rms_norm(x, residual, weight, EPS)),
        EngineCall("rotary_embedding", "q and k of every layer", lambda: rotary_embedding(q, k, positions, inv_freq)),
        EngineCall(
            "kv_store",
            "new tokens' K/V",
            lambda: kv_store(k_rotated, v, k_cache, v_cache, empty(tokens, like=torch.int64), cache.null_slot),
        ),
        EngineCall("paged_decode", f"decode, CUDA graph replay, {GRAPH_TABLE_WIDTH} blocks", decode(GRAPH_TABLE_WIDTH)),
        *(EngineCall("paged_decode", f"decode, eager, {w} blocks", decode(w)) for w in EAGER_TABLE_WIDTHS),
        EngineCall("extend_attention", "prefill, one prompt of 128 tokens", extend(1, 128 // BLOCK_SIZE)),
        EngineCall("extend_attention", "mixed step, 5 sequences", extend(5, 37)),
        EngineCall("exponential_race_argmax", "draw over the vocabulary", draw(model.vocab_size)),
        *(EngineCall("exponential_race_argmax", f"draw over {w} candidates", draw(w)) for w in CANDIDATE_WIDTHS),
        lora("qkv_proj", hidden, 3, (heads + 2 * kv_heads) * head_dim),
        lora("o_proj", heads * head_dim, 1, hidden),
        lora("gate_up_proj", hidden, 2, 2 * inner),
        lora("down_proj", inner, 1, hidden),
    ]
