from __future__ import annotations

import pytest
import torch

from services.engine.sampling import SamplingSettings, resolve, sample_token
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2


def settings(**overrides: object) -> SamplingSettings:
    params = common_pb2.SamplingParams(**overrides)  # type: ignore[arg-type]
    return resolve(params, common_pb2.SamplingParams(), prompt_len=10, max_model_len=100)


def test_unset_fields_take_generation_config_then_documented_defaults() -> None:
    defaults = common_pb2.SamplingParams(temperature=0.6, top_p=0.9)
    got = resolve(common_pb2.SamplingParams(top_p=0.5), defaults, prompt_len=10, max_model_len=100)
    assert (got.temperature, got.top_p, got.top_k, got.min_p) == (pytest.approx(0.6), 0.5, 0, 0.0)
    assert got.max_new_tokens == 90  # the rest of the context


def test_zero_temperature_is_greedy_not_unset() -> None:
    defaults = common_pb2.SamplingParams(temperature=0.7)
    got = resolve(common_pb2.SamplingParams(temperature=0.0), defaults, prompt_len=1, max_model_len=10)
    assert got.greedy


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 91}, "maximum context length"),
        ({"min_new_tokens": 50, "max_new_tokens": 10}, "min_new_tokens"),
        ({"n": 2}, "n=2"),
        ({"repetition_penalty": 1.1}, "repetition_penalty"),
        ({"json_schema": "{}"}, "constraint"),
        ({"stop_regex": ["a+"]}, "stop_regex"),
        ({"logit_bias": {5: 1.0}}, "logit_bias"),
    ],
)
def test_bad_or_unsupported_values_are_refused_with_their_name(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        settings(**overrides)


def test_prompt_filling_the_context_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="maximum context length"):
        resolve(common_pb2.SamplingParams(), common_pb2.SamplingParams(), prompt_len=100, max_model_len=100)


def test_truncation_samplers_keep_the_right_tokens() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    for _ in range(20):
        assert sample_token(logits, settings(temperature=1.0, top_k=1), None) == 0
        assert sample_token(logits, settings(temperature=1.0, top_p=0.5), None) == 0
        assert sample_token(logits, settings(temperature=1.0, top_p=0.8), None) in (0, 1)
        assert sample_token(logits, settings(temperature=1.0, min_p=0.5), None) in (0, 1)
        assert sample_token(logits, settings(temperature=1.0, top_k=3), None) != 3
    assert sample_token(logits, settings(temperature=0.0), None, banned=[0]) == 1


def test_same_seed_same_draws() -> None:
    logits = torch.zeros(1000)
    s = settings(temperature=1.0)
    first = [sample_token(logits, s, torch.Generator().manual_seed(7)) for _ in range(3)]
    again = [sample_token(logits, s, torch.Generator().manual_seed(7)) for _ in range(3)]
    assert first == again
