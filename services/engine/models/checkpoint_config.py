"""A checkpoint's config.json, read as transformers reads it for the architectures the engine serves,
without importing transformers.

Where torch is installed, transformers 5's config classes take ~4 s of CPU to import (the Llama
config pulls its rope utilities, then the activations, the hub-kernel integration and with it
`torch._dynamo` and `torch.distributed.tensor`): half of an engine's start on two cores, paid again at
every restart. The engine needs ~20 fields of the file, so it reads the JSON itself and fills in what
a file leaves out as transformers' config class for its `model_type` would. `MODEL_TYPE_DEFAULTS`
holds those classes' defaults (transformers 5's `LlamaConfig`, `MistralConfig`, `Qwen2Config`,
`Qwen3Config`); tests/engine/test_checkpoint_config.py checks them, and every field the engine reads
from real and edge-case files, against `AutoConfig`. Unlike AutoConfig, a file without `model_type`
is read with its architecture's usual one.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

_LLAMA: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,  # None: as many as the attention heads
    "head_dim": None,  # None: hidden_size // num_attention_heads
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_QWEN: dict[str, Any] = {
    **_LLAMA,
    "vocab_size": 151936,
    "intermediate_size": 22016,
    "max_position_embeddings": 32768,
    "bos_token_id": None,
    "eos_token_id": None,
    # The window applies only with use_sliding_window, and then to the layers from max_window_layers on.
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "layer_types": None,
}

MODEL_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": _LLAMA,
    "mistral": {
        **_LLAMA,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
    },
    "qwen2": _QWEN,
    "qwen3": {**_QWEN, "head_dim": 128},
}
# The model_type of each architecture the engine serves (services/engine/models/registry.py).
ARCHITECTURE_MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_SLIDING_WINDOW_SWITCHED = ("qwen2", "qwen3")


def read_checkpoint_config(folder: Path | str) -> SimpleNamespace:
    """`folder/config.json` with transformers' defaults for its model type: every field of the file as an
    attribute. A model type or architecture the engine does not serve gets no defaults (the model registry
    names an unserved architecture in its error)."""
    path = Path(folder) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} not found: a model folder holds its config.json") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} holds {type(raw).__name__}, not a JSON object")
    architectures = raw.get("architectures") or []
    architecture = str(architectures[0]) if isinstance(architectures, list) and architectures else ""
    model_type = str(raw.get("model_type") or ARCHITECTURE_MODEL_TYPES.get(architecture, ""))
    values = {**MODEL_TYPE_DEFAULTS.get(model_type, {}), **raw}
    if values.get("num_key_value_heads") is None and "num_attention_heads" in values:
        values["num_key_value_heads"] = values["num_attention_heads"]
    if model_type in _SLIDING_WINDOW_SWITCHED:
        if not values["use_sliding_window"]:
            values["sliding_window"] = None
        if values["layer_types"] is None:
            window, first = values["sliding_window"], values["max_window_layers"]
            values["layer_types"] = [
                "sliding_attention" if window is not None and i >= first else "full_attention"
                for i in range(int(values["num_hidden_layers"]))
            ]
    return SimpleNamespace(**values)
