"""Our torch implementations of the Llama family, loaded from Hugging Face checkpoints.

`build_model(folder, dtype, device)` returns (model, transformers config); then
`model(input_ids, positions, ctx)` maps (T,) int64 tokens and positions to hidden
states (T, hidden), and `model.compute_logits(hidden)` maps (N, hidden) to float32
logits (N, vocab). `model.spec` holds the shapes a KV cache needs.
"""

from __future__ import annotations

from services.engine.models.llama import (
    DecoderSpec,
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)
from services.engine.models.registry import model_class, supported_architectures
from services.engine.models.weights import build_model, load_weights

__all__ = [
    "DecoderSpec",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "build_model",
    "load_weights",
    "model_class",
    "supported_architectures",
]
