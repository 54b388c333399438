"""The one place sampling parameters are checked: every bad value is refused with a message naming it."""

from __future__ import annotations

import math

import pytest

from services.engine.sampling_params import LogprobSettings, SamplingSettings
from services.engine.sampling_validation import Limits, resolve
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2

LIMITS = Limits(prompt_len=10, max_model_len=100, vocab_size=50, max_logprobs=5)


def settings(logprobs: common_pb2.LogprobOptions | None = None, **overrides: object) -> SamplingSettings:
    params = common_pb2.SamplingParams(**overrides)  # type: ignore[arg-type]
    return resolve(params, common_pb2.SamplingParams(), LIMITS, logprobs)


def test_unset_fields_take_generation_config_then_documented_defaults() -> None:
    defaults = common_pb2.SamplingParams(temperature=0.6, top_p=0.9, repetition_penalty=1.1)
    got = resolve(common_pb2.SamplingParams(top_p=0.5), defaults, LIMITS)
    assert (got.temperature, got.top_p, got.top_k, got.min_p) == (pytest.approx(0.6), 0.5, 0, 0.0)
    assert got.repetition_penalty == pytest.approx(1.1)
    assert got.max_new_tokens == 90  # the rest of the context
    assert (got.typical_p, got.tfs, got.top_a, got.xtc_probability, got.dry_multiplier) == (1.0, 1.0, 0.0, 0.0, 0.0)


def test_extra_samplers_take_the_request_then_the_defaults_and_are_checked_either_way() -> None:
    """Aphrodite's samplers read as every field does, whether one or none of them is set (the common
    case of none set skips reading them one by one: the same values)."""
    none_set = resolve(common_pb2.SamplingParams(), common_pb2.SamplingParams(), LIMITS)
    assert (none_set.typical_p, none_set.dry_base, none_set.xtc_threshold) == (1.0, 1.75, pytest.approx(0.1))
    assert (none_set.dry_allowed_length, none_set.no_repeat_ngram_size) == (2, 0)
    defaults = common_pb2.SamplingParams(typical_p=0.9, dry_allowed_length=3)
    got = resolve(common_pb2.SamplingParams(dry_base=2.0), defaults, LIMITS)
    assert (got.typical_p, got.dry_base, got.dry_allowed_length) == (pytest.approx(0.9), 2.0, 3)
    assert (got.tfs, got.no_repeat_ngram_size) == (1.0, 0)
    with pytest.raises(InvalidArgument, match=r"typical_p must be in \(0, 1\]"):
        resolve(common_pb2.SamplingParams(), common_pb2.SamplingParams(typical_p=1.5), LIMITS)
    with pytest.raises(InvalidArgument, match="nsigma must be a finite number"):
        resolve(common_pb2.SamplingParams(), common_pb2.SamplingParams(nsigma=math.inf), LIMITS)


def test_unset_logprob_options_ask_for_nothing() -> None:
    assert settings().logprobs == settings(common_pb2.LogprobOptions()).logprobs == LogprobSettings()
    assert not settings().logprobs.any_output


def test_zero_values_are_values_not_unset() -> None:
    defaults = common_pb2.SamplingParams(temperature=0.7, top_k=20, repetition_penalty=1.3)
    got = resolve(common_pb2.SamplingParams(temperature=0.0, top_k=0, repetition_penalty=1.0), defaults, LIMITS)
    assert got.greedy and got.top_k == 0 and got.repetition_penalty == 1.0


def test_top_k_minus_one_and_zero_both_turn_it_off() -> None:
    assert settings(top_k=-1).top_k == 0 and settings(top_k=0).top_k == 0 and settings(top_k=7).top_k == 7


def test_every_list_and_map_field_is_carried() -> None:
    got = settings(
        logit_bias={3: 2.5},
        allowed_token_ids=[1, 2, 3],
        bad_words_ids=[common_pb2.TokenIds(ids=[4, 5])],
        dry_sequence_breaker_ids=[9],
        stop_token_ids=[7],
        n=2,
        best_of=3,
        seed=11,
    )
    assert got.logit_bias == ((3, 2.5),)
    assert got.allowed_token_ids == frozenset({1, 2, 3})
    assert got.bad_words_ids == ((4, 5),)
    assert got.dry_sequence_breaker_ids == frozenset({9})
    assert (got.stop_token_ids, got.n, got.best_of, got.seed) == (frozenset({7}), 2, 3, 11)


def test_logprob_options_resolve() -> None:
    options = common_pb2.LogprobOptions(
        return_logprob=True, top_logprobs_num=3, token_ids_logprob=[4], logprob_start_len=2, input_top_logprobs_num=1
    )
    got = settings(options).logprobs
    assert (got.sampled, got.top_n, got.token_ids, got.prompt_start, got.prompt_top_n) == (True, 3, (4,), 2, 1)
    assert settings(common_pb2.LogprobOptions(logprob_start_len=-1)).logprobs.prompt_start is None


def test_an_explicit_zero_max_new_tokens_is_prefill_only_even_for_a_full_context() -> None:
    assert settings(max_new_tokens=0).max_new_tokens == 0
    full = Limits(prompt_len=100, max_model_len=100, vocab_size=50, max_logprobs=5)
    assert resolve(common_pb2.SamplingParams(max_new_tokens=0), common_pb2.SamplingParams(), full).max_new_tokens == 0
    over = Limits(prompt_len=101, max_model_len=100, vocab_size=50, max_logprobs=5)
    with pytest.raises(InvalidArgument, match="maximum context length is 100 tokens"):
        resolve(common_pb2.SamplingParams(max_new_tokens=0), common_pb2.SamplingParams(), over)
    with pytest.raises(InvalidArgument, match="leaves no room for output"):  # unset: it generates
        resolve(common_pb2.SamplingParams(), common_pb2.SamplingParams(), full)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"temperature": -1.0}, "temperature must be a non-negative finite number, got -1"),
        ({"temperature": math.inf}, "temperature must be a finite number"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_k": -2}, r"top_k must be -1 or 0 \(disable\) or at least 1, got -2"),
        ({"min_p": 2.0}, r"min_p must be in \[0, 1\], got 2"),
        ({"frequency_penalty": 2.5}, r"frequency_penalty must be in \[-2, 2\], got 2.5"),
        ({"presence_penalty": -3.0}, r"presence_penalty must be in \[-2, 2\], got -3"),
        ({"repetition_penalty": 0.0}, r"repetition_penalty must be in \(0, 2\], got 0"),
        ({"repetition_penalty": 2.5}, r"repetition_penalty must be in \(0, 2\]"),
        ({"max_new_tokens": 0, "n": 2}, "n and best_of must be 1 when max_new_tokens is 0"),
        ({"max_new_tokens": 0, "min_new_tokens": 1}, r"min_new_tokens \(min_tokens\) must be 0 when"),
        ({"max_new_tokens": 91}, "maximum context length is 100 tokens. However, your request has 10 input tokens"),
        ({"min_new_tokens": 50, "max_new_tokens": 10}, r"min_new_tokens \(min_tokens\) must not exceed"),
        ({"n": 0}, "n must be at least 1, got 0"),
        ({"n": 3, "best_of": 2}, r"best_of must be at least n \(3\), got 2"),
        ({"stop_token_ids": [50]}, "stop_token_ids: token id 50 is out of range for a vocabulary of 50"),
        ({"logit_bias": {99: 1.0}}, "logit_bias: token id 99 is out of range"),
        ({"logit_bias": {1: 101.0}}, r"logit_bias for token 1 must be in \[-100, 100\]"),
        ({"allowed_token_ids": [1, 60]}, "allowed_token_ids: token id 60"),
        ({"bad_words_ids": [common_pb2.TokenIds(ids=[70])]}, "bad_words: token id 70"),
        ({"bad_words_ids": [common_pb2.TokenIds()]}, "bad_words: a bad word encodes to no tokens"),
        ({"dry_sequence_breaker_ids": [50]}, "dry_sequence_breakers: token id 50"),
        ({"typical_p": 0.0}, r"typical_p must be in \(0, 1\]"),
        ({"tfs": 1.5}, r"tfs must be in \(0, 1\]"),
        ({"top_a": -0.1}, r"top_a must be in \[0, 1\]"),
        ({"eta_cutoff": -1.0}, r"eta_cutoff must be in \[0, inf\)"),
        ({"epsilon_cutoff": 2000.0}, r"epsilon_cutoff must be in \[0, 1000\]"),
        ({"smoothing_factor": -1.0}, "smoothing_factor"),
        ({"smoothing_curve": 0.5}, r"smoothing_curve must be in \[1, inf\)"),
        ({"dynatemp_min": 2.0, "dynatemp_max": 1.0}, r"dynatemp_max \(1\) must not be below dynatemp_min \(2\)"),
        ({"dynatemp_exponent": 0.0}, "dynatemp_exponent"),
        ({"xtc_threshold": 1.5}, "xtc_threshold"),
        ({"xtc_probability": -0.5}, "xtc_probability"),
        ({"dry_multiplier": -1.0}, "dry_multiplier"),
        ({"dry_base": 1.0}, r"dry_base must be in \(1, inf\)"),
        ({"nsigma": -1.0}, "nsigma"),
        ({"regex": ""}, "regex must not be empty"),
        ({"json_schema": " "}, "json_schema must not be empty"),
        ({"choice": common_pb2.StringList()}, "choice: the list of choices must not be empty"),
        ({"thinking_budget": 4}, "offers no logits processors"),
    ],
)
def test_bad_values_are_refused_with_their_name_and_range(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        settings(**overrides)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (common_pb2.LogprobOptions(top_logprobs_num=6), r"must be at most 5 \(the server's --max-logprobs\), got 6"),
        (common_pb2.LogprobOptions(logprob_start_len=0, input_top_logprobs_num=9), "prompt_logprobs must be at most 5"),
        (common_pb2.LogprobOptions(token_ids_logprob=[55]), "token_ids_logprob: token id 55"),
        (common_pb2.LogprobOptions(logprob_start_len=10), r"logprob_start_len must be below the prompt length \(10\)"),
    ],
)
def test_bad_logprob_options_are_refused(options: common_pb2.LogprobOptions, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        settings(options)


def test_prompt_filling_the_context_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"maximum context length is 100 tokens.*100 input tokens"):
        resolve(common_pb2.SamplingParams(), common_pb2.SamplingParams(), Limits(100, 100, 50))


def test_beam_search_resolves_greedy_with_width_best_of_else_n() -> None:
    from services.engine.sampling_params import BeamSettings

    # The model's sampling defaults do not apply to a beam search.
    defaults = common_pb2.SamplingParams(temperature=0.7, top_p=0.8, top_k=20, min_p=0.1)
    got = resolve(common_pb2.SamplingParams(use_beam_search=True, n=2, best_of=4), defaults, LIMITS)
    assert got.beam == BeamSettings(width=4, length_penalty=1.0, early_stopping=False)
    assert got.greedy and (got.top_p, got.top_k, got.min_p) == (1.0, 0, 0.0)
    assert settings(use_beam_search=True, n=3).beam == BeamSettings(width=3)
    never = settings(use_beam_search=True, length_penalty=0.5, early_stopping="never").beam
    assert never == BeamSettings(width=1, length_penalty=0.5, early_stopping="never")
    assert settings(use_beam_search=True, early_stopping="true").beam.early_stopping is True  # type: ignore[union-attr]
    assert settings(use_beam_search=False, length_penalty=1.0, early_stopping="false").beam is None
    # Explicit "off" values of the sampling-only parameters pass.
    assert settings(use_beam_search=True, temperature=0.0, top_p=1.0, top_k=-1, min_p=0.0).beam is not None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"temperature": 0.8}, r"^temperature must be 0 when using beam search, got 0.8"),
        ({"top_p": 0.9}, r"^top_p must be 1 when using beam search"),
        ({"top_k": 5}, r"^top_k must be -1 when using beam search"),
        ({"min_p": 0.1}, r"^min_p must be 0 when using beam search"),
        ({"typical_p": 0.5}, r"^typical_p must be 1 when using beam search"),
        ({"n": 3, "best_of": 2}, r"^best_of must be at least n \(3\), got 2"),
        ({"early_stopping": "always"}, r"^early_stopping must be True, False, or 'never', got 'always'"),
        ({"length_penalty": math.inf}, r"^length_penalty must be a finite number"),
        ({"stop": ["x"]}, r"^stop cannot be used with beam search"),
        ({"stop_regex": ["x+"]}, r"^stop_regex cannot be used with beam search"),
        ({"regex": "a+"}, r"^regex \(structured output\) cannot be used with beam search"),
        ({"json_object": True}, r"^json_object \(structured output\) cannot be used with beam search"),
        ({"thinking_budget": 4}, r"^thinking_budget cannot be used with beam search"),
        ({"best_of": 3, "allowed_token_ids": [1, 2]}, r"^allowed_token_ids must hold at least best_of \(3\) ids"),
    ],
)
def test_beam_search_refuses_what_it_cannot_honour(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        settings(use_beam_search=True, **overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"length_penalty": 0.5}, r"^length_penalty is not effective and must be the default value of 1.0"),
        ({"early_stopping": "true"}, r"^early_stopping is not effective and must be False"),
        ({"use_beam_search": False, "early_stopping": "never"}, r"^early_stopping is not effective"),
    ],
)
def test_beam_knobs_without_beam_search_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        settings(**overrides)
