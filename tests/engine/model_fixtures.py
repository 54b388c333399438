"""Helpers for tests that drive models and attention backends through the paged KV cache.

- `SequenceSlice` + `build_context`: one ForwardContext from per-sequence (cached length,
  new tokens, block ids), exactly as a runner would lay it out.
- `PagedSequences`: runs a model step by step (prefill, chunks, decode) over random blocks.
- `build_tiny_checkpoint`: tiny random Hugging Face folders for every architecture we serve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from services.engine.attention.backend import AttentionBackend, KVCache
from services.engine.attention.context import ForwardContext
from services.engine.attention.torch_backend import TorchAttentionBackend
from services.engine.models import LlamaForCausalLM


@dataclass(frozen=True)
class SequenceSlice:
    """One sequence's part of a step: `new_len` tokens after `cached_len` already in the cache."""

    cached_len: int
    new_len: int
    block_ids: Sequence[int]  # physical blocks holding positions 0, bs, 2 bs, ... of this sequence

    @property
    def seq_len(self) -> int:
        return self.cached_len + self.new_len


def slots(block_ids: Sequence[int], block_size: int, start: int, end: int) -> list[int]:
    """Cache slots of positions start .. end-1 of a sequence stored in `block_ids`."""
    return [block_ids[p // block_size] * block_size + p % block_size for p in range(start, end)]


def build_context(
    backend: AttentionBackend, seqs: Sequence[SequenceSlice], device: torch.device | str = "cpu"
) -> ForwardContext:
    block_size = backend.kv_cache.block_size
    for s in seqs:
        needed = math.ceil(s.seq_len / block_size)
        assert len(s.block_ids) >= needed, f"{s.seq_len} tokens need {needed} blocks, got {len(s.block_ids)}"
    width = max(len(s.block_ids) for s in seqs)
    positions = [p for s in seqs for p in range(s.cached_len, s.seq_len)]
    slot_mapping = [slot for s in seqs for slot in slots(s.block_ids, block_size, s.cached_len, s.seq_len)]
    query_lens = [s.new_len for s in seqs]
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    tables = [list(s.block_ids) + [0] * (width - len(s.block_ids)) for s in seqs]

    def tensor(values: list[Any]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return ForwardContext(
        backend=backend,
        positions=tensor(positions),
        slot_mapping=tensor(slot_mapping),
        query_start_loc=tensor(starts),
        seq_lens=tensor([s.seq_len for s in seqs]),
        block_tables=tensor(tables),
        query_lens_cpu=query_lens,
        seq_lens_cpu=[s.seq_len for s in seqs],
    )


def poison(cache: KVCache) -> None:
    """Fill every slot of the managed blocks with NaN, so a read of an unwritten slot shows up in
    the result. The zero block past them is part of the cache's contract and stays zero."""
    for pool in (*cache.k, *cache.v):
        pool[: cache.num_blocks].fill_(float("nan"))


@dataclass
class PagedSequences:
    """Sequences advanced step by step through one model and one paged cache, each on random blocks."""

    model: LlamaForCausalLM
    num_blocks: int = 64
    block_size: int = 4
    seed: int = 0
    device: str = "cpu"
    cache: KVCache = field(init=False)
    backend: TorchAttentionBackend = field(init=False)
    lengths: dict[str, int] = field(default_factory=dict)
    blocks: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        spec = self.model.spec
        dtype = self.model.model.embed_tokens.weight.dtype
        self.cache = KVCache(
            spec.num_layers,
            self.num_blocks,
            self.block_size,
            spec.num_kv_heads,
            spec.head_dim,
            dtype,
            torch.device(self.device),
        )
        poison(self.cache)
        self.backend = TorchAttentionBackend(self.cache, spec.attention_scale)
        self._free = torch.randperm(self.num_blocks, generator=torch.Generator().manual_seed(self.seed)).tolist()

    def step(self, chunks: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """Run the new tokens of several sequences in one forward: {name: logits (new, vocab)}."""
        seqs = []
        for name, tokens in chunks.items():
            cached = self.lengths.get(name, 0)
            owned = self.blocks.setdefault(name, [])
            while len(owned) * self.block_size < cached + len(tokens):
                owned.append(self._free.pop())
            seqs.append(SequenceSlice(cached, len(tokens), list(owned)))
            self.lengths[name] = cached + len(tokens)
        ctx = build_context(self.backend, seqs, self.device)
        input_ids = torch.tensor(
            [t for tokens in chunks.values() for t in tokens], dtype=torch.int64, device=self.device
        )
        with torch.inference_mode():
            logits = self.model.compute_logits(self.model(input_ids, ctx.positions, ctx))  # (T, vocab)
        return dict(zip(chunks, logits.split(ctx.query_lens_cpu), strict=True))


TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
)
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {"tie_word_embeddings": True}),
    "llama_untied": ("llama", {"tie_word_embeddings": False}),
    "llama3_rope": (
        "llama",
        {
            "tie_word_embeddings": False,
            "rope_theta": 10000.0,
            # A short original context, so the positions a test reaches cross all three llama3 bands.
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "mistral": ("mistral", {"tie_word_embeddings": False, "sliding_window": None}),
    "qwen2": ("qwen2", {"tie_word_embeddings": False}),
    "qwen3": ("qwen3", {"tie_word_embeddings": True, "head_dim": 32}),  # head_dim != hidden / heads
}


def build_tiny_checkpoint(out: Path, name: str, *, seed: int = 0, max_shard_size: str | None = None) -> Path:
    """Save a seeded random checkpoint of ARCHITECTURES[name] to `out` (sharded if max_shard_size)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, overrides = ARCHITECTURES[name]
    config = AutoConfig.for_model(model_type, **TINY, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    _randomize(model, seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size=max_shard_size or "1GB")
    return out


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights of unit-scale activations: transformers' default init (std 0.02) leaves attention
    almost uniform and logits near zero, which would hide masking or rotary mistakes."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                param.copy_(0.5 * noise)
            elif "embed_tokens" in name:
                param.copy_(noise)
            else:
                param.copy_(noise / math.sqrt(param.shape[1]))
