"""Which model class serves a checkpoint, picked by `architectures[0]` in its config.json."""

from __future__ import annotations

from typing import Any

from services.engine.models.llama import (
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)

MODELS: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(MODELS)


def model_class(config: Any) -> type[LlamaForCausalLM]:
    """The class for a transformers config (or anything with an `architectures` list)."""
    architectures = getattr(config, "architectures", None) or []
    supported = ", ".join(supported_architectures())
    if not architectures:
        raise ValueError(f"config.json names no architecture; supported architectures: {supported}")
    name = architectures[0]
    if name not in MODELS:
        raise ValueError(f"unsupported architecture {name!r}; supported architectures: {supported}")
    return MODELS[name]
