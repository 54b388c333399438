"""--skip-forward (the service-path benchmark's engine): no model forward, each next id is the last + 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.engine.config import EngineConfig
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import load_model
from services.engine.request import EngineRequest
from services.engine.sampling_validation import Limits, resolve
from turnout.v1 import common_pb2


def test_skip_forward_counts_up_from_the_prompt_and_runs_to_max_tokens(tiny_model_dir: Path) -> None:
    config = EngineConfig(model=tiny_model_dir, num_kv_blocks=64, skip_forward=True)
    loaded = load_model(config)
    engine = LLMEngine(config, loaded)
    vocab = loaded.vocab_size
    prompts = {"a": (5, 6, 7), "b": (1, vocab - 2)}
    for rid, prompt in prompts.items():
        params = common_pb2.SamplingParams(max_new_tokens=4, ignore_eos=True, temperature=1.0)
        sampling = resolve(params, loaded.info.generation_defaults, Limits(len(prompt), loaded.max_model_len, vocab))
        engine.add_request(EngineRequest(rid, prompt, sampling))
    tokens: dict[str, list[int]] = {"a": [], "b": []}
    finishes = {}
    while engine.has_work():
        for out in engine.step():
            tokens[out.request_id] += out.output.token_ids
            if out.output.finish is not None:
                finishes[out.request_id] = out.output.finish.kind
    assert tokens == {"a": [8, 9, 10, 11], "b": [vocab - 1, 0, 1, 2]}
    assert finishes == {"a": "length", "b": "length"}
    engine.block_manager.check_integrity()


def test_skip_forward_refuses_tensor_parallelism(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="--skip-forward"):
        EngineConfig(model=tiny_model_dir, skip_forward=True, tensor_parallel_size=2)
