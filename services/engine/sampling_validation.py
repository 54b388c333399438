"""The one place sampling parameters are checked: proto SamplingParams + LogprobOptions -> SamplingSettings.

Every endpoint (OpenAI, SGLang `/generate`, raw gRPC) reaches the engine with
the same protobuf, so these checks and their messages are shared by all of
them. Each message names the parameter (with its OpenAI alias where the name
differs) and the allowed range, and is raised as InvalidArgument (gRPC
INVALID_ARGUMENT, HTTP 400).

Resolution order for every field: the request's value, else the model's
generation_config.json value (unless the engine runs with
`--sampling-defaults openai`), else the documented default (docs/sampling.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from services.engine.sampling_params import LogprobSettings, SamplingSettings
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2

# Parameters of later issues: refused, never silently ignored.
_NOT_YET = {
    "constraint": "structured outputs (json_schema / regex / ebnf / structural_tag) are not supported yet",
    "custom_params": "custom_params are not supported yet",
}


@dataclass(frozen=True)
class Limits:
    """What the engine serving the request allows."""

    prompt_len: int
    max_model_len: int
    vocab_size: int
    max_logprobs: int = 20


class _Fields:
    """Reads one field: the request's value, else the default's, else the fallback."""

    def __init__(self, request: common_pb2.SamplingParams, defaults: common_pb2.SamplingParams) -> None:
        self.request = request
        self.defaults = defaults

    def get(self, name: str, fallback: float) -> float:
        for source in (self.request, self.defaults):
            if source.HasField(name):
                value = float(getattr(source, name))
                if not math.isfinite(value):
                    raise InvalidArgument(f"{name} must be a finite number, got {value}")
                return value
        return fallback


def _in_range(name: str, value: float, low: float, high: float, *, low_open: bool = False, alias: str = "") -> None:
    ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        label = f"{name} ({alias})" if alias else name
        bracket = "(" if low_open else "["
        upper = "inf)" if math.isinf(high) else f"{_fmt(high)}]"
        raise InvalidArgument(f"{label} must be in {bracket}{_fmt(low)}, {upper}, got {_fmt(value)}")


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _check_ids(name: str, ids: Iterable[int], vocab_size: int) -> None:
    for token_id in ids:
        if not 0 <= token_id < vocab_size:
            raise InvalidArgument(f"{name}: token id {token_id} is out of range for a vocabulary of {vocab_size}")


def resolve(
    params: common_pb2.SamplingParams,
    defaults: common_pb2.SamplingParams,
    limits: Limits,
    logprob_options: common_pb2.LogprobOptions | None = None,
) -> SamplingSettings:
    """Apply defaults and check every value; raise InvalidArgument naming the problem."""
    if params.WhichOneof("constraint") is not None:
        raise InvalidArgument(_NOT_YET["constraint"])
    if params.HasField("custom_params") and params.custom_params.fields:
        raise InvalidArgument(_NOT_YET["custom_params"])
    f = _Fields(params, defaults)
    max_new, min_new = _lengths(f, limits)

    temperature = f.get("temperature", 1.0)
    if temperature < 0.0:
        raise InvalidArgument(f"temperature must be a non-negative finite number, got {_fmt(temperature)}")
    top_p = f.get("top_p", 1.0)
    _in_range("top_p", top_p, 0.0, 1.0, low_open=True)
    top_k = f.get("top_k", -1)
    if top_k < -1 or not float(top_k).is_integer():
        raise InvalidArgument(f"top_k must be -1 or 0 (disable) or at least 1, got {_fmt(top_k)}")
    min_p = f.get("min_p", 0.0)
    _in_range("min_p", min_p, 0.0, 1.0)
    frequency_penalty = f.get("frequency_penalty", 0.0)
    _in_range("frequency_penalty", frequency_penalty, -2.0, 2.0)
    presence_penalty = f.get("presence_penalty", 0.0)
    _in_range("presence_penalty", presence_penalty, -2.0, 2.0)
    repetition_penalty = f.get("repetition_penalty", 1.0)
    _in_range("repetition_penalty", repetition_penalty, 0.0, 2.0, low_open=True)

    vocab = limits.vocab_size
    _check_ids("stop_token_ids", params.stop_token_ids, vocab)
    _check_ids("logit_bias", params.logit_bias.keys(), vocab)
    for token_id, bias in params.logit_bias.items():
        if not -100.0 <= bias <= 100.0:
            raise InvalidArgument(f"logit_bias for token {token_id} must be in [-100, 100], got {_fmt(bias)}")
    _check_ids("allowed_token_ids", params.allowed_token_ids, vocab)
    bad_words = tuple(tuple(words.ids) for words in params.bad_words_ids)
    for ids in bad_words:
        if not ids:
            raise InvalidArgument("bad_words: a bad word encodes to no tokens")
        _check_ids("bad_words", ids, vocab)
    _check_ids("dry_sequence_breakers", params.dry_sequence_breaker_ids, vocab)

    n = int(f.get("n", 1))
    if n < 1:
        raise InvalidArgument(f"n must be at least 1, got {n}")
    best_of = int(f.get("best_of", n))
    if best_of < n:
        raise InvalidArgument(f"best_of must be at least n ({n}), got {best_of}")

    settings = SamplingSettings(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        temperature=temperature,
        top_p=top_p,
        top_k=max(int(top_k), 0),
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        repetition_penalty=repetition_penalty,
        logit_bias=tuple(sorted(params.logit_bias.items())),
        allowed_token_ids=frozenset(params.allowed_token_ids) or None,
        bad_words_ids=bad_words,
        **_extra_samplers(f),
        dry_sequence_breaker_ids=frozenset(params.dry_sequence_breaker_ids),
        stop_token_ids=frozenset(params.stop_token_ids),
        ignore_eos=params.ignore_eos if params.HasField("ignore_eos") else False,
        seed=params.seed if params.HasField("seed") else None,
        n=n,
        best_of=best_of,
        logprobs=_logprobs(logprob_options or common_pb2.LogprobOptions(), limits),
    )
    return settings


def _lengths(f: _Fields, limits: Limits) -> tuple[int, int]:
    context, prompt = limits.max_model_len, limits.prompt_len
    room = context - prompt
    if room <= 0:
        raise InvalidArgument(
            f"This model's maximum context length is {context} tokens. However, your request has {prompt} "
            "input tokens, which leaves no room for output. Please shorten the input."
        )
    max_new = f.get("max_new_tokens", room)
    if max_new < 1:
        raise InvalidArgument(f"max_new_tokens (max_tokens) must be at least 1, got {_fmt(max_new)}")
    if max_new > room:
        raise InvalidArgument(
            f"This model's maximum context length is {context} tokens. However, your request has {prompt} "
            f"input tokens and asks for {_fmt(max_new)} output tokens ({prompt + int(max_new)} in all). "
            "Please shorten the input or lower max_new_tokens (max_tokens)."
        )
    min_new = f.get("min_new_tokens", 0)
    if min_new > max_new:
        raise InvalidArgument(
            f"min_new_tokens (min_tokens) must not exceed max_new_tokens (max_tokens): "
            f"{_fmt(min_new)} > {_fmt(max_new)}"
        )
    return int(max_new), int(min_new)


def _extra_samplers(f: _Fields) -> dict[str, Any]:
    """Aphrodite's samplers, each with its range; the defaults leave them off."""
    values: dict[str, Any] = {}
    ranges: tuple[tuple[str, float, float, float, bool], ...] = (
        # name, default, low, high, low open
        ("typical_p", 1.0, 0.0, 1.0, True),
        ("tfs", 1.0, 0.0, 1.0, True),
        ("top_a", 0.0, 0.0, 1.0, False),
        ("eta_cutoff", 0.0, 0.0, math.inf, False),
        ("epsilon_cutoff", 0.0, 0.0, 1000.0, False),
        ("smoothing_factor", 0.0, 0.0, math.inf, False),
        ("smoothing_curve", 1.0, 1.0, math.inf, False),
        ("dynatemp_min", 0.0, 0.0, math.inf, False),
        ("dynatemp_max", 0.0, 0.0, math.inf, False),
        ("dynatemp_exponent", 1.0, 0.0, math.inf, True),
        ("xtc_threshold", 0.1, 0.0, 1.0, False),
        ("xtc_probability", 0.0, 0.0, 1.0, False),
        ("dry_multiplier", 0.0, 0.0, math.inf, False),
        ("dry_base", 1.75, 1.0, math.inf, True),
        ("nsigma", 0.0, 0.0, math.inf, False),
    )
    for name, default, low, high, low_open in ranges:
        values[name] = f.get(name, default)
        _in_range(name, values[name], low, high, low_open=low_open)
    if values["dynatemp_max"] < values["dynatemp_min"]:
        raise InvalidArgument(
            f"dynatemp_max ({_fmt(values['dynatemp_max'])}) must not be below dynatemp_min "
            f"({_fmt(values['dynatemp_min'])})"
        )
    values["dry_allowed_length"] = int(f.get("dry_allowed_length", 2))
    values["no_repeat_ngram_size"] = int(f.get("no_repeat_ngram_size", 0))
    return values


def _logprobs(options: common_pb2.LogprobOptions, limits: Limits) -> LogprobSettings:
    top_n = options.top_logprobs_num
    prompt_top_n = options.input_top_logprobs_num if options.HasField("input_top_logprobs_num") else top_n
    for name, value in (("top_logprobs_num (logprobs / top_logprobs)", top_n), ("prompt_logprobs", prompt_top_n)):
        if value > limits.max_logprobs:
            raise InvalidArgument(
                f"{name} must be at most {limits.max_logprobs} (the server's --max-logprobs), got {value}"
            )
    _check_ids("token_ids_logprob", options.token_ids_logprob, limits.vocab_size)
    start: int | None = None
    if options.HasField("logprob_start_len") and options.logprob_start_len >= 0:
        start = options.logprob_start_len
        if start >= limits.prompt_len:
            raise InvalidArgument(
                f"logprob_start_len must be below the prompt length ({limits.prompt_len}), got {start}"
            )
    return LogprobSettings(
        sampled=options.return_logprob or top_n > 0 or len(options.token_ids_logprob) > 0,
        top_n=top_n,
        token_ids=tuple(options.token_ids_logprob),
        prompt_start=start,
        prompt_top_n=prompt_top_n if start is not None else 0,
    )
