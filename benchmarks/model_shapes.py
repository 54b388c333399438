"""Llama-shaped models with random weights, for benchmarks that need no checkpoint.

`SHAPES` holds the shapes of Llama-3.2-1B and Llama-3.1-8B (the values of their
config.json files), of the default model SmolLM2-135M-Instruct, and a `tiny` one for smoke
runs. `write_model_folder` writes a model folder holding config.json only (no weights, no
tokenizer: the engine reads the tokenizer only for grammars and think tags, lazily);
`random_loaded_model` builds the model through the engine's own `load_model`, with every weight drawn at random directly
on the device in the engine's dtype instead of read from a checkpoint:

    folder = write_model_folder(SHAPES["8b"], tmp)
    config = EngineConfig(model=folder, num_kv_blocks=4096)
    engine = LLMEngine(config, loaded=random_loaded_model(config))

The parameter counts below are what the floors in `step_floors` are made of; tests
check them against the real models' published totals and against the built model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import nn

from services.engine.config import EngineConfig
from services.engine.model_loader import LoadedModel, load_model
from services.engine.models import weights

# Standard deviation of the random weights (the checkpoints' initializer_range).
WEIGHT_STD = 0.02


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    rms_norm_eps: float = 1e-5
    bos_token_id: int = 128000
    eos_token_id: int = 128001

    @property
    def matmul_params_per_layer(self) -> int:
        """Weights of one decoder layer's matrix products: q/k/v, o, gate/up, down."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        return attention + 3 * self.hidden_size * self.intermediate_size

    @property
    def matmul_params(self) -> int:
        """Weights every token multiplies through, all layers (the LM head and embedding excluded)."""
        return self.num_layers * self.matmul_params_per_layer

    @property
    def non_embedding_params(self) -> int:
        """Every parameter but the embedding and LM head matrices: layers' matmuls and all norms."""
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.matmul_params + norms

    @property
    def lm_head_params(self) -> int:
        """The LM head's matrix (the embedding itself when tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        embedding = self.vocab_size * self.hidden_size
        return self.non_embedding_params + embedding + (0 if self.tie_word_embeddings else self.lm_head_params)

    def kv_bytes_per_token(self, element_bytes: int) -> int:
        """K and V of one token in every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element_bytes

    def config_json(self) -> dict[str, Any]:
        """A Hugging Face config.json for this shape."""
        config: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": WEIGHT_STD,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "mlp_bias": False,
            "num_attention_heads": self.num_heads,
            "num_hidden_layers": self.num_layers,
            "num_key_value_heads": self.num_kv_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }
        if self.rope_scaling:
            config["rope_scaling"] = dict(self.rope_scaling)
        return config


def _llama3_rope(factor: float) -> dict[str, Any]:
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


SHAPES: dict[str, ModelShape] = {
    # meta-llama/Llama-3.2-1B config.json: 1,235,814,400 parameters.
    "1b": ModelShape(
        name="llama-3.2-1b-shaped",
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=_llama3_rope(32.0),
    ),
    # meta-llama/Llama-3.1-8B config.json: 8,030,261,248 parameters.
    "8b": ModelShape(
        name="llama-3.1-8b-shaped",
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=_llama3_rope(8.0),
    ),
    # HuggingFaceTB/SmolLM2-135M-Instruct, the default model (turnout/default_model.py): 134,515,008 parameters.
    "135m": ModelShape(
        name="smollm2-135m-shaped",
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        vocab_size=49152,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        bos_token_id=1,
        eos_token_id=2,
    ),
    # Smoke runs on CPU: the same structure (GQA 4/2, llama3 rope, tied), seconds to run.
    "tiny": ModelShape(
        name="llama-tiny-shaped",
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        vocab_size=512,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=_llama3_rope(32.0),
        bos_token_id=1,
        eos_token_id=2,
    ),
}


def write_model_folder(shape: ModelShape, parent: Path) -> Path:
    """`parent/<shape name>/config.json` and nothing else; returns the folder."""
    folder = parent / shape.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(shape.config_json(), indent=2))
    return folder


def _draw_(name: str, tensor: torch.Tensor, generator: torch.Generator, std: float) -> None:
    """A parameter's random value in place: norm weights 1, biases 0, matrices N(0, std)."""
    if tensor.dim() == 1:
        tensor.fill_(0.0 if name.endswith("bias") else 1.0)
    else:
        tensor.normal_(0.0, std, generator=generator)


def fill_random_(model: nn.Module, seed: int, std: float = WEIGHT_STD) -> None:
    """Draw every parameter in place on its own device (`_draw_`)."""
    generator_device = next(model.parameters()).device
    generator = torch.Generator(device=generator_device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            _draw_(name, param, generator, std)


def random_loaded_model(config: EngineConfig, seed: int = 0) -> LoadedModel:
    """The engine's `load_model(config)` with the checkpoint read replaced by random weights.

    Everything else `load_model` does (device and dtype choice, ModelInfo, any step it
    takes after loading) happens as in production; each parameter is allocated once, in
    the engine's dtype on its device, and filled there (an 8B model never touches CPU memory)."""

    def random_weights(
        model: nn.Module, folder: Path, dtype: torch.dtype, device: torch.device, tp: object = None
    ) -> None:
        del tp  # one rank: the whole model
        for module in model.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                storage = torch.empty(param.shape, dtype=dtype, device=device)
                setattr(module, name, nn.Parameter(storage, requires_grad=False))
            for name, buffer in list(module.named_buffers(recurse=False)):
                setattr(module, name, buffer.to(device))  # rotary frequencies, float32
        fill_random_(model, seed)

    with mock.patch.object(weights, "load_weights", random_weights):
        return load_model(config)


def write_random_checkpoint(shape: ModelShape, parent: Path, tokenizer_source: Path, seed: int = 0) -> Path:
    """A servable model folder of `shape` with random bf16 weights and `tokenizer_source`'s tokenizer.

    For benchmarks of the whole stack on a machine without the real checkpoint (a GPU host a
    session lends): the vocabulary and special ids are the tokenizer's, so every id a random
    model picks decodes. Weights are drawn on the GPU when there is one (a 1B shape is ~2.5 GB)."""
    from dataclasses import replace

    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.models import TOKENIZER_FILES

    source = json.loads((tokenizer_source / "config.json").read_text())
    shape = replace(
        shape,
        vocab_size=source["vocab_size"],
        bos_token_id=source.get("bos_token_id", shape.bos_token_id),
        eos_token_id=source.get("eos_token_id", shape.eos_token_id),
    )
    folder = write_model_folder(shape, parent)
    for name in TOKENIZER_FILES:
        if (tokenizer_source / name).is_file():
            (folder / name).write_bytes((tokenizer_source / name).read_bytes())
    with torch.device("meta"):
        names = LlamaForCausalLM(LlamaConfig(**shape.config_json())).state_dict()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, meta in names.items():
        if name == "lm_head.weight" and shape.tie_word_embeddings:
            continue  # the embedding is the head
        tensor = torch.empty(meta.shape, dtype=torch.bfloat16, device=device)
        _draw_(name, tensor, generator, WEIGHT_STD)
        tensors[name] = tensor.cpu()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
