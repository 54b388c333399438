"""Our model implementations against Hugging Face transformers on the same checkpoints.

Every architecture runs a batched prefill and an incremental schedule (prefill, chunk over a
cached prefix, decodes) through the paged cache on random blocks; logits at every new token
must match transformers' full-sequence forward at the same positions.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.engine.models import build_model, model_class, supported_architectures
from services.engine.models.layers import rope_inv_freq, rope_parameters
from services.engine.models.llama import LlamaForCausalLM
from tests.engine.model_fixtures import ARCHITECTURES, PagedSequences, build_tiny_checkpoint

ATOL = 1e-4
SEQUENCES = {"a": 18, "b": 13, "c": 6}  # token counts
# Tokens per sequence per step: a prefill, then a chunk over the cached prefix while b decodes
# (mixed batch), then b's chunk while a decodes, then decode-only steps.
SCHEDULE = [{"a": 7, "b": 5}, {"a": 6, "b": 1}, {"a": 1, "b": 3}] + [{"a": 1, "b": 1}] * 4


@dataclass
class Case:
    folder: Path
    model: LlamaForCausalLM
    tokens: dict[str, list[int]]
    expected: dict[str, torch.Tensor]  # transformers' logits (L, vocab) per sequence


def reference_logits(folder: Path, tokens: dict[str, list[int]], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    with torch.inference_mode():
        return {name: hf(torch.tensor([ids])).logits[0].float() for name, ids in tokens.items()}


@pytest.fixture(scope="module")
def tiny_case(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Case]:
    cases: dict[str, Case] = {}

    def get(name: str) -> Case:
        if name not in cases:
            shard = "40KB" if name == "sharded" else None
            folder = build_tiny_checkpoint(
                tmp_path_factory.mktemp(name), "llama_untied" if shard else name, max_shard_size=shard
            )
            gen = torch.Generator().manual_seed(len(cases))
            tokens = {s: torch.randint(0, 256, (n,), generator=gen).tolist() for s, n in SEQUENCES.items()}
            model, _ = build_model(folder, torch.float32, "cpu")
            cases[name] = Case(folder, model, tokens, reference_logits(folder, tokens, torch.float32))
        return cases[name]

    return get


NAMES = [*ARCHITECTURES, "sharded"]


@pytest.mark.parametrize("name", NAMES)
def test_batched_prefill_matches_transformers(tiny_case: Callable[[str], Case], name: str) -> None:
    case = tiny_case(name)
    logits = PagedSequences(case.model, seed=1).step(case.tokens)  # all sequences in one forward
    for seq, expected in case.expected.items():
        torch.testing.assert_close(logits[seq], expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_incremental_matches_transformers(tiny_case: Callable[[str], Case], name: str) -> None:
    case = tiny_case(name)
    runner = PagedSequences(case.model, seed=2)
    done = {"a": 0, "b": 0}
    for step in SCHEDULE:
        chunks = {seq: case.tokens[seq][done[seq] : done[seq] + n] for seq, n in step.items()}
        logits = runner.step(chunks)
        for seq, n in step.items():
            torch.testing.assert_close(logits[seq], case.expected[seq][done[seq] : done[seq] + n], atol=ATOL, rtol=0)
            done[seq] += n
    assert done == {"a": SEQUENCES["a"], "b": SEQUENCES["b"]}


def test_sharded_checkpoint_is_sharded(tiny_case: Callable[[str], Case]) -> None:
    folder = tiny_case("sharded").folder
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("*.safetensors"))) > 1


@pytest.mark.default_model
def test_default_model_prefill_matches_transformers(default_model_dir: Path) -> None:
    tokens = {"prompt": [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 30, 2, 198, 1, 4093, 198]}
    model, _ = build_model(default_model_dir, torch.float32, "cpu")
    assert type(model) is LlamaForCausalLM and model.spec.num_kv_heads == 3
    logits = PagedSequences(model, num_blocks=8, block_size=16).step(tokens)["prompt"]
    expected = reference_logits(default_model_dir, tokens, torch.float32)["prompt"]
    torch.testing.assert_close(logits, expected, atol=1e-3, rtol=0)
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))


def test_bfloat16_load(tiny_case: Callable[[str], Case]) -> None:
    case = tiny_case("qwen2")
    model, _ = build_model(case.folder, torch.bfloat16, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.rotary.inv_freq.dtype == torch.float32
    logits = PagedSequences(model).step({"a": case.tokens["a"]})["a"]
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, case.expected["a"], atol=0.15, rtol=0.05)


def test_unsupported_architecture_names_supported_ones(tiny_case: Callable[[str], Case], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'GPT2LMHeadModel'.*LlamaForCausalLM, MistralForCausalLM"):
        model_class(SimpleNamespace(architectures=["GPT2LMHeadModel"]))
    assert supported_architectures() == sorted(
        ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]
    )
    folder = shutil.copytree(tiny_case("llama").folder, tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["FancyForCausalLM"]}))
    with pytest.raises(ValueError, match=r"unsupported architecture 'FancyForCausalLM'.*Qwen3ForCausalLM"):
        build_model(folder, torch.float32, "cpu")


def test_missing_and_unexpected_weights_are_named(tiny_case: Callable[[str], Case], tmp_path: Path) -> None:
    folder = shutil.copytree(tiny_case("llama_untied").folder, tmp_path / "model")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    tensors["model.layers.0.mystery.weight"] = torch.zeros(2)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing weights model\.layers\.1\.self_attn\.k_proj\.weight") as info:
        build_model(folder, torch.float32, "cpu")
    assert "unexpected weights model.layers.0.mystery.weight" in str(info.value)


def test_derived_rotary_weights_are_skipped(tiny_case: Callable[[str], Case], tmp_path: Path) -> None:
    folder = shutil.copytree(tiny_case("llama").folder, tmp_path / "model")
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(tensors, folder / "model.safetensors")
    build_model(folder, torch.float32, "cpu")


def test_sliding_window_is_rejected() -> None:
    from transformers import MistralConfig

    config = MistralConfig(sliding_window=4096, max_position_embeddings=32768, architectures=["MistralForCausalLM"])
    with pytest.raises(ValueError, match="sliding window attention is not supported yet"):
        model_class(config)(config)


def test_llama3_rope_frequencies_match_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, **scaling}
    config = LlamaConfig(head_dim=128, max_position_embeddings=131072, rope_parameters=rope)
    ours = rope_inv_freq(128, rope_parameters(config))
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config)
    assert torch.equal(ours, expected)
    assert not torch.equal(ours, rope_inv_freq(128, {"rope_type": "default", "rope_theta": 500000.0}))
    # transformers 4.x field names.
    old = SimpleNamespace(rope_theta=500000.0, rope_scaling={"type": "llama3", **scaling})
    assert torch.equal(rope_inv_freq(128, rope_parameters(old)), expected)
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        rope_inv_freq(128, {"rope_type": "yarn", "rope_theta": 1e4})
