"""The offline API: `from turnout import LLM`, on the same engine core as the service."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from turnout import LLM
from turnout.errors import InvalidArgument


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(tiny_model_dir, num_kv_blocks=256)


def test_text_and_token_prompts_match_transformers_greedy(llm: LLM, tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompts = ["The capital of France is", "Once upon a time there", [1, 504, 3575, 282]]
    outputs = llm.generate(prompts, {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True})
    assert [len(o.output_token_ids) for o in outputs] == [10, 10, 10]
    for prompt, out in zip(prompts, outputs, strict=True):
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        assert out.prompt_token_ids == ids
        expected = reference.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False, eos_token_id=None)
        assert out.output_token_ids == expected[0, len(ids) :].tolist()
        assert out.text == tokenizer.decode(out.output_token_ids, skip_special_tokens=True)
        assert out.finish.kind == "length"
    llm.engine.block_manager.check_integrity()


def test_per_prompt_sampling_params_and_seeds(llm: LLM) -> None:
    params = [{"max_new_tokens": 3, "temperature": 0}, {"max_new_tokens": 5, "temperature": 1.0, "seed": 3}]
    first = llm.generate(["a b c", "d e f"], params)
    again = llm.generate(["a b c", "d e f"], params)
    assert [len(o.output_token_ids) for o in first] <= [3, 5]
    assert [o.output_token_ids for o in first] == [o.output_token_ids for o in again]


def test_bad_sampling_params_are_refused(llm: LLM) -> None:
    with pytest.raises(InvalidArgument, match="temperature"):
        llm.generate("hi", {"temperature": -1})
    with pytest.raises(InvalidArgument, match="sampling_params"):
        llm.generate("hi", {"no_such_param": 1})
    with pytest.raises(InvalidArgument, match="2 prompts"):
        llm.generate(["a", "b"], [{}])
    assert not llm.engine.has_work()


def test_n_and_best_of_offline(llm: LLM) -> None:
    params = {"max_new_tokens": 4, "temperature": 1.0, "seed": 11, "ignore_eos": True}
    every = llm.generate("a b c", {**params, "n": 3})[0]
    assert len(every.samples) == 3 and every.output_token_ids == every.samples[0].output_token_ids
    best = llm.generate("a b c", {**params, "n": 1, "best_of": 3})[0]
    assert len(best.samples) == 1
    assert best.output_token_ids == max(every.samples, key=lambda s: s.cumulative_logprob).output_token_ids
