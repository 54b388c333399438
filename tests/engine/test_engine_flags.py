"""Engine flags that change behaviour: --seed, --generation-config and --override-generation-config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.engine.config import EngineConfig
from services.engine.model_loader import load_model
from turnout import LLM

UNSEEDED = {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True}


def test_seed_repeats_the_draws_of_unseeded_requests(tiny_model_dir: Path) -> None:
    first = LLM(tiny_model_dir, num_kv_blocks=64, seed=5).generate("a b c", UNSEEDED)[0].output_token_ids
    again = LLM(tiny_model_dir, num_kv_blocks=64, seed=5).generate("a b c", UNSEEDED)[0].output_token_ids
    other = LLM(tiny_model_dir, num_kv_blocks=64, seed=6).generate("a b c", UNSEEDED)[0].output_token_ids
    assert first == again
    assert first != other


def test_generation_config_folder_and_overrides(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.3, "top_k": 7}))
    from_folder = load_model(EngineConfig(model=tiny_model_dir, sampling_defaults=str(tmp_path), device="cpu"))
    defaults = from_folder.info.generation_defaults
    assert (round(defaults.temperature, 3), defaults.top_k) == (0.3, 7)
    # The overrides go over the chosen file; under `openai` (vLLM's `vllm`) they are all there is.
    overridden = EngineConfig(
        model=tiny_model_dir, sampling_defaults=str(tmp_path), override_generation_config={"top_k": 2}, device="cpu"
    )
    defaults = load_model(overridden).info.generation_defaults
    assert (round(defaults.temperature, 3), defaults.top_k) == (0.3, 2)
    only = EngineConfig(model=tiny_model_dir, sampling_defaults="openai", override_generation_config={"top_p": 0.5})
    defaults = load_model(only).info.generation_defaults
    assert defaults.top_p == 0.5 and not defaults.HasField("temperature") and not defaults.HasField("top_k")


def test_generation_config_values_are_checked(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"a folder holding a generation_config\.json"):
        EngineConfig(model=tiny_model_dir, sampling_defaults=str(tmp_path))
    with pytest.raises(ValueError, match="'do_sample' is not one of"):
        EngineConfig(model=tiny_model_dir, override_generation_config={"do_sample": True})
    with pytest.raises(ValueError, match="temperature must be a number"):
        EngineConfig(model=tiny_model_dir, override_generation_config={"temperature": "hot"})
