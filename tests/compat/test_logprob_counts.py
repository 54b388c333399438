"""vLLM's `-1` logprob count (the whole vocabulary) as the engine reads it: every token when the
vocabulary fits within --max-logprobs, else a 400 naming the limit."""

from __future__ import annotations

import pytest

from services.engine.sampling_validation import Limits, resolve
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2

ALL = 2**32 - 1  # the wire's -1


def _resolve(options: common_pb2.LogprobOptions, max_logprobs: int) -> object:
    limits = Limits(prompt_len=4, max_model_len=64, vocab_size=32, max_logprobs=max_logprobs)
    return resolve(common_pb2.SamplingParams(max_new_tokens=2), common_pb2.SamplingParams(), limits, options)


def test_minus_one_is_the_whole_vocabulary_within_max_logprobs() -> None:
    options = common_pb2.LogprobOptions(
        return_logprob=True, top_logprobs_num=ALL, logprob_start_len=0, input_top_logprobs_num=ALL
    )
    settings = _resolve(options, max_logprobs=32).logprobs  # type: ignore[attr-defined]
    assert settings.top_n == 32 and settings.prompt_top_n == 32


@pytest.mark.parametrize("field", ["top_logprobs_num", "input_top_logprobs_num"])
def test_minus_one_beyond_max_logprobs_names_the_limit(field: str) -> None:
    options = common_pb2.LogprobOptions(return_logprob=True, logprob_start_len=0, **{field: ALL})
    with pytest.raises(
        InvalidArgument, match=r"whole vocabulary \(32 tokens\), more than the server's --max-logprobs \(20\)"
    ):
        _resolve(options, max_logprobs=20)
