"""Custom logits processors (SGLang's interface): serialized ones behind a flag, built-ins by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from services.engine.processors.catalog import DISABLED_MESSAGE
from turnout import LLM
from turnout.custom_logit_processor import CustomLogitProcessor
from turnout.errors import InvalidArgument

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


class ForceToken(CustomLogitProcessor):
    """Samples custom_params["token_id"] + the number of tokens generated so far (reads `__req__`)."""

    def __call__(self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]]) -> torch.Tensor:
        for row, params in enumerate(custom_param_list):
            req = params["__req__"]
            assert req.origin_input_ids, "the processor sees its prompt"
            token = int(params["token_id"]) + len(req.output_ids)
            logits[row, :] = float("-inf")
            logits[row, token] = 0.0
        return logits


class Explodes(CustomLogitProcessor):
    def __call__(self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]]) -> torch.Tensor:
        raise RuntimeError("boom from the client's processor")


@pytest.fixture(scope="module")
def trusted(tiny_model_dir: Path) -> LLM:
    return LLM(tiny_model_dir, num_kv_blocks=256, enable_custom_logit_processor=True)


@pytest.fixture(scope="module")
def default(tiny_model_dir: Path) -> LLM:
    return LLM(tiny_model_dir, num_kv_blocks=256)


def test_serialized_processor_is_refused_without_the_flag(default: LLM) -> None:
    with pytest.raises(InvalidArgument) as refused:
        default.generate("hi", {**GREEDY, "custom_logit_processor": ForceToken().to_str()})
    assert str(refused.value) == DISABLED_MESSAGE
    assert "--enable-custom-logit-processor" in DISABLED_MESSAGE
    assert not default.engine.has_work()


def test_serialized_processor_runs_with_the_flag(trusted: LLM) -> None:
    text = ForceToken().to_str()
    assert CustomLogitProcessor.from_str(text) is CustomLogitProcessor.from_str(text)  # cached by text
    out = trusted.generate(
        "hi", {**GREEDY, "custom_logit_processor": text, "custom_params": {"token_id": 300}, "n": 2, "temperature": 1}
    )[0]
    for sample in out.samples:
        assert sample.output_token_ids == [300, 301, 302, 303, 304, 305]


def test_builtins_by_name_need_no_flag(default: LLM) -> None:
    forced = default.generate(
        "hi", {**GREEDY, "custom_logit_processor": "deterministic_token", "custom_params": {"token_id": 42}}
    )
    assert forced[0].output_token_ids == [42] * 6
    free = default.generate("hi", GREEDY)[0].output_token_ids
    banned = sorted(set(free))
    other = default.generate(
        "hi", {**GREEDY, "custom_logit_processor": "disallowed_tokens", "custom_params": {"token_ids": banned}}
    )[0].output_token_ids
    assert len(other) == 6 and not set(other) & set(banned)


def test_a_raising_processor_aborts_only_its_request(trusted: LLM) -> None:
    alone = trusted.generate("other prompt", GREEDY)[0].output_token_ids
    broken, fine, forced = trusted.generate(
        ["hi", "other prompt", "hi"],
        [
            {**GREEDY, "custom_logit_processor": Explodes().to_str()},
            GREEDY,
            {**GREEDY, "custom_logit_processor": ForceToken().to_str(), "custom_params": {"token_id": 7}},
        ],
    )
    assert broken.finish.kind == "abort"
    assert "RuntimeError: boom from the client's processor" in broken.finish.message
    assert broken.output_token_ids == []
    assert fine.output_token_ids == alone
    assert forced.output_token_ids == [7, 8, 9, 10, 11, 12]


def test_one_bad_row_of_a_shared_processor_fails_alone(trusted: LLM) -> None:
    vocab = trusted.engine.loaded.vocab_size
    good, bad = trusted.generate(
        ["a", "b"],
        [
            {**GREEDY, "custom_logit_processor": ForceToken().to_str(), "custom_params": {"token_id": 9}},
            {**GREEDY, "custom_logit_processor": ForceToken().to_str(), "custom_params": {"token_id": vocab + 5}},
        ],
    )
    assert good.output_token_ids == [9, 10, 11, 12, 13, 14]
    assert bad.finish.kind == "abort" and "IndexError" in bad.finish.message


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"custom_logit_processor": '{"callable": "zz"}'}, "neither a built-in .* nor a processor serialized"),
        ({"custom_logit_processor": "no_such_processor"}, "neither a built-in"),
        ({"custom_logit_processor": "deterministic_token"}, "custom_params.token_id must be a token id"),
        (
            {"custom_logit_processor": "deterministic_token", "custom_params": {"token_id": 10**9}},
            "token id 1000000000 is out of range",
        ),
        ({"custom_logit_processor": "disallowed_tokens", "custom_params": {"token_ids": 3}}, "must be a list"),
        ({"custom_params": {"token_id": 3}}, "custom_params is set but custom_logit_processor is not"),
    ],
)
def test_bad_processors_are_refused(trusted: LLM, params: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        trusted.generate("hi", {**GREEDY, **params})
    assert not trusted.engine.has_work()


def test_processor_runs_after_the_grammar_mask(trusted: LLM) -> None:
    # The processor forces a token the grammar forbids: the request ends with an abort naming it.
    digit_free = trusted.tokenizer.encode("a", add_special_tokens=False)[0]
    out = trusted.generate(
        "hi",
        {
            **GREEDY,
            "regex": "[0-9]+",
            "custom_logit_processor": "deterministic_token",
            "custom_params": {"token_id": digit_free},
        },
    )[0]
    assert out.finish.kind == "abort" and "does not match the regex constraint" in out.finish.message
