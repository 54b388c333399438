"""Model shapes: the configs match the real models, and random-weight models run in the engine
from a folder that holds config.json only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from benchmarks.bench_engine import engine_requests, make_prompts
from benchmarks.model_shapes import SHAPES, random_loaded_model, write_model_folder, write_random_checkpoint
from services.engine.config import EngineConfig
from services.engine.llm_engine import LLMEngine
from services.engine.models.layers import rope_inv_freq
from services.engine.models.registry import model_class


def test_shapes_have_the_published_parameter_counts() -> None:
    assert SHAPES["1b"].total_params == 1_235_814_400  # meta-llama/Llama-3.2-1B
    assert SHAPES["8b"].total_params == 8_030_261_248  # meta-llama/Llama-3.1-8B


@pytest.mark.parametrize("key", ["tiny", "1b", "8b"])
def test_config_json_builds_the_model_that_was_counted(key: str, tmp_path: Path) -> None:
    shape = SHAPES[key]
    config = AutoConfig.from_pretrained(write_model_folder(shape, tmp_path))
    with torch.device("meta"):
        model = model_class(config)(config)
    assert sum(p.numel() for p in model.parameters()) == shape.total_params
    spec = model.spec
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (shape.num_heads, shape.num_kv_heads, shape.head_dim)
    assert spec.tie_word_embeddings == shape.tie_word_embeddings
    assert spec.rope["rope_type"] == "llama3"
    assert spec.rope["factor"] == shape.rope_scaling["factor"]
    # llama3 scaling slows the long wavelengths down by `factor` and keeps the short ones.
    plain = rope_inv_freq(shape.head_dim, {"rope_type": "default", "rope_theta": shape.rope_theta})
    scaled = rope_inv_freq(shape.head_dim, spec.rope)
    assert scaled[0] == plain[0]
    assert scaled[-1] == pytest.approx(plain[-1] / shape.rope_scaling["factor"])


def test_random_model_runs_in_the_engine_without_tokenizer_files(tmp_path: Path) -> None:
    folder = write_model_folder(SHAPES["tiny"], tmp_path)
    assert [p.name for p in folder.iterdir()] == ["config.json"]
    config = EngineConfig(model=folder, num_kv_blocks=32, max_model_len=256, dtype="float32")
    loaded = random_loaded_model(config, seed=1)
    params = dict(loaded.model.named_parameters())
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params.values())
    assert torch.equal(params["model.norm.weight"], torch.ones_like(params["model.norm.weight"]))
    embedding = params["model.embed_tokens.weight"]
    assert embedding.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.equal(
        embedding, dict(random_loaded_model(config, seed=1).model.named_parameters())["model.embed_tokens.weight"]
    )
    assert not torch.equal(
        embedding, dict(random_loaded_model(config, seed=2).model.named_parameters())["model.embed_tokens.weight"]
    )

    engine = LLMEngine(config, loaded)
    prompts = make_prompts(3, 5, 12, seed=0, vocab=loaded.vocab_size)
    for request in engine_requests(engine, prompts, 7, "r"):
        engine.add_request(request)
    produced: dict[str, int] = {}
    while engine.has_work():
        for out in engine.step():
            produced[out.request_id] = produced.get(out.request_id, 0) + len(out.output.token_ids)
    assert produced == {"r0": 7, "r1": 7, "r2": 7}
    engine.block_manager.check_integrity()


def test_a_random_checkpoint_is_served_with_the_tokenizer_it_was_given(default_model_dir: Path, tmp_path: Path) -> None:
    """`bench_router --random-shape`'s model folder: the engine loads it through its own checkpoint reader
    (no missing or unexpected tensor), and its vocabulary and special ids are the tokenizer's, so every id a
    random model picks decodes."""
    from tokenizers import Tokenizer

    from services.engine.model_loader import load_model

    folder = write_random_checkpoint(SHAPES["tiny"], tmp_path, default_model_dir)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    real = AutoConfig.from_pretrained(default_model_dir)
    ours = AutoConfig.from_pretrained(folder)
    special = ("vocab_size", "bos_token_id", "eos_token_id")
    assert [getattr(ours, name) for name in special] == [getattr(real, name) for name in special]
    assert ours.num_hidden_layers == SHAPES["tiny"].num_layers
    config = EngineConfig(model=folder, num_kv_blocks=32, max_model_len=256, dtype="float32")
    loaded = load_model(config)
    embedding = dict(loaded.model.named_parameters())["model.embed_tokens.weight"]
    assert embedding.shape == (real.vocab_size, SHAPES["tiny"].hidden_size)
    assert embedding.std().item() == pytest.approx(0.02, rel=0.05)
    engine = LLMEngine(config, loaded)
    for request in engine_requests(engine, make_prompts(2, 5, 12, seed=0, vocab=real.vocab_size), 6, "r"):
        engine.add_request(request)
    ids: list[int] = []
    while engine.has_work():
        for out in engine.step():
            ids += out.output.token_ids
    assert len(ids) == 12 and max(ids) < real.vocab_size
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert all(tokenizer.id_to_token(i) is not None for i in ids)


# The fields of meta-llama/Llama-3.1-8B's and Llama-3.2-1B's config.json that decide the shape.
LLAMA_31_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}
LLAMA_32_1B = {
    **LLAMA_31_8B,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "rope_scaling": {**LLAMA_31_8B["rope_scaling"], "factor": 32.0},  # type: ignore[dict-item]
}


@pytest.mark.parametrize(("key", "published"), [("8b", LLAMA_31_8B), ("1b", LLAMA_32_1B)])
def test_config_json_holds_the_published_values(key: str, published: dict[str, object]) -> None:
    ours = SHAPES[key].config_json()
    assert {name: ours[name] for name in published} == published


def test_135m_shape_is_the_default_model(default_model_dir: Path, tmp_path: Path) -> None:
    assert SHAPES["135m"].total_params == 134_515_008  # HuggingFaceTB/SmolLM2-135M-Instruct
    real = AutoConfig.from_pretrained(default_model_dir)
    ours = AutoConfig.from_pretrained(write_model_folder(SHAPES["135m"], tmp_path))
    for name in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "tie_word_embeddings",
        "max_position_embeddings",
        "eos_token_id",
    ):
        assert getattr(ours, name) == getattr(real, name), name
