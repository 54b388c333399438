"""The engine reads config.json itself (services/engine/models/checkpoint_config.py): every field it
uses must come out as transformers' AutoConfig gives it, defaults included, for each architecture it
serves; and building a model must not import transformers or torch._dynamo (seconds of every start)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig

from benchmarks.model_shapes import SHAPES
from services.engine.models.checkpoint_config import ARCHITECTURE_MODEL_TYPES, read_checkpoint_config
from services.engine.models.llama import sliding_window_layers
from services.engine.models.registry import model_class

# What the engine reads of a config (model_loader, llama.py, parallel/group.py), beside the DecoderSpec.
ENGINE_FIELDS = (
    "architectures",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "eos_token_id",
    "hidden_act",
)


def engine_view(config: Any) -> dict[str, Any]:
    view = {name: getattr(config, name, None) for name in ENGINE_FIELDS}
    view["spec"] = model_class(config).spec_from_config(config)
    view["sliding_window_layers"] = sliding_window_layers(config)
    return view


def _minimal(architecture: str, **fields: Any) -> dict[str, Any]:
    return {"architectures": [architecture], "model_type": ARCHITECTURE_MODEL_TYPES[architecture], **fields}


CASES: dict[str, dict[str, Any]] = {
    **{f"shape-{key}": shape.config_json() for key, shape in SHAPES.items()},
    # Only the architecture: every field from the defaults.
    **{f"bare-{name}": _minimal(name) for name in ARCHITECTURE_MODEL_TYPES},
    "llama-kv-heads-null-head-dim-absent": _minimal(
        "LlamaForCausalLM", hidden_size=256, num_attention_heads=4, num_key_value_heads=None, num_hidden_layers=2
    ),
    "llama-legacy-linear-rope": _minimal(
        "LlamaForCausalLM", rope_theta=50000.0, rope_scaling={"type": "linear", "factor": 2.0}
    ),
    "llama-eos-list-tied": _minimal("LlamaForCausalLM", eos_token_id=[2, 7], tie_word_embeddings=True),
    "llama-bias": _minimal("LlamaForCausalLM", attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5),
    "mistral-window-null": _minimal("MistralForCausalLM", sliding_window=None),
    "mistral-window-short": _minimal("MistralForCausalLM", sliding_window=4096, max_position_embeddings=32768),
    "qwen2-window-off": _minimal("Qwen2ForCausalLM", use_sliding_window=False, sliding_window=4096),
    "qwen2-window-on-late-layers": _minimal(
        "Qwen2ForCausalLM", use_sliding_window=True, sliding_window=4096, num_hidden_layers=30, max_window_layers=28
    ),
    "qwen2-window-on-no-layer-reaches-it": _minimal(
        "Qwen2ForCausalLM", use_sliding_window=True, num_hidden_layers=24, max_window_layers=28
    ),
    "qwen3-explicit-head-dim": _minimal(
        "Qwen3ForCausalLM", hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128
    ),
    "qwen3-layer-types-given": _minimal(
        "Qwen3ForCausalLM", num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"]
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_field_the_engine_reads_is_what_transformers_reads(case: str, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CASES[case]))
    assert engine_view(read_checkpoint_config(tmp_path)) == engine_view(AutoConfig.from_pretrained(tmp_path))


def test_the_models_of_the_suite_read_the_same(default_model_dir: Path, tiny_model_dir: Path) -> None:
    for folder in (default_model_dir, tiny_model_dir):
        assert engine_view(read_checkpoint_config(folder)) == engine_view(AutoConfig.from_pretrained(folder))


def test_a_config_without_model_type_is_read_with_its_architectures(tmp_path: Path) -> None:
    """AutoConfig refuses such a file; the engine serves it as the architecture's usual model type."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2}))
    config = read_checkpoint_config(tmp_path)
    assert (config.head_dim, config.vocab_size, config.sliding_window) == (128, 151936, None)


def test_a_missing_or_broken_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        read_checkpoint_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_checkpoint_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        read_checkpoint_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        model_class(read_checkpoint_config(tmp_path))


def test_building_the_engine_imports_neither_transformers_nor_dynamo(tiny_model_dir: Path) -> None:
    """A fresh process, as an engine starts: transformers' config classes and a random init on the meta
    device each used to import seconds of modules the engine never runs."""
    code = (
        "import sys\n"
        "from services.engine.config import EngineConfig\n"
        "from services.engine.llm_engine import LLMEngine\n"
        "from pathlib import Path\n"
        f"LLMEngine(EngineConfig(model=Path({str(tiny_model_dir)!r}), num_kv_blocks=16, dtype='float32'))\n"
        "print(sorted(m for m in ('transformers', 'torch._dynamo') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
