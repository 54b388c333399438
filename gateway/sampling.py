"""Body sampling and logprob fields -> `common_pb2.SamplingParams` / `LogprobOptions`.

Only what the client set (a non-null value) is set on the proto: every proto
field is `optional`, and unset means the model's default. Values are not
checked here (the engine does that; see `protocol`). Refused are only what the
proto cannot express (a `logit_bias` key that is not a token id) and what has
no meaning at all (an empty stop string).
"""

from __future__ import annotations

from typing import Any

from gateway.errors import invalid_request
from gateway.protocol import SamplingFields
from turnout.v1 import common_pb2

# Spelled the same in the bodies and in SamplingParams, and taken as they are.
_SCALARS = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "ignore_eos",
    "no_stop_trim",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "typical_p",
    "tfs",
    "top_a",
    "eta_cutoff",
    "epsilon_cutoff",
    "smoothing_factor",
    "smoothing_curve",
    "dynatemp_min",
    "dynatemp_max",
    "dynatemp_exponent",
    "xtc_threshold",
    "xtc_probability",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "no_repeat_ngram_size",
    "nsigma",
)
_LISTS = ("stop_token_ids", "allowed_token_ids", "bad_words", "dry_sequence_breakers")


def sampling_params(body: SamplingFields, prefix: str = "", **renamed: Any) -> common_pb2.SamplingParams:
    """The fields of `body` the client set.

    `renamed` holds the fields each API spells its own way, by proto name
    (`max_new_tokens=body.max_tokens`); a None value leaves the field unset.
    `prefix` is put before parameter names in errors ("sampling_params.").
    """
    values = {name: getattr(body, name) for name in _SCALARS}
    values.update(renamed)
    sp = common_pb2.SamplingParams(**{name: value for name, value in values.items() if value is not None})
    for name in _LISTS:
        getattr(sp, name).extend(getattr(body, name) or ())
    if body.stop is not None:
        sp.stop.extend(_strings(body.stop, f"{prefix}stop"))
    if body.stop_regex is not None:
        sp.stop_regex.extend(_strings(body.stop_regex, f"{prefix}stop_regex"))
    for key, bias in (body.logit_bias or {}).items():
        sp.logit_bias[_token_id_key(key, f"{prefix}logit_bias")] = bias
    return sp


# The wire's (and the engine's) spelling of vLLM's -1: as many alternatives as the vocabulary has.
ALL_LOGPROBS = 2**32 - 1


def logprob_count(value: int | None) -> int | None:
    """A body's alternatives count as the proto and the formatters take it: -1 is `ALL_LOGPROBS`."""
    return ALL_LOGPROBS if value == -1 else value


def openai_logprobs(
    *, sampled: bool, top_n: int | None, prompt_top_n: int | None, echo: bool, as_token_ids: bool
) -> common_pb2.LogprobOptions:
    """Logprob options of an OpenAI body.

    `sampled`: the sampled tokens' logprobs were asked for (completions
    `logprobs: N`, chat `logprobs: true`), with `top_n` alternatives. `echo`
    with them adds the prompt's positions; vLLM's `prompt_logprobs` asks for
    the prompt's positions with `prompt_top_n` alternatives. Token text is
    asked for whenever the response shows it.
    """
    options = common_pb2.LogprobOptions()
    if sampled:
        options.return_logprob = True
        if top_n is not None:
            options.top_logprobs_num = top_n
        if echo:
            options.logprob_start_len = 0
    if prompt_top_n is not None:
        options.logprob_start_len = 0
        options.input_top_logprobs_num = prompt_top_n
    if (sampled and not as_token_ids) or prompt_top_n is not None:
        options.return_text_in_logprobs = True
    return options


def native_logprobs(
    return_logprob: bool | None,
    start: int | None,
    top_n: int | None,
    token_ids: list[int] | None,
    return_text: bool | None,
) -> common_pb2.LogprobOptions:
    """Logprob options of one `/generate` prompt; SGLang ignores the others unless `return_logprob`."""
    options = common_pb2.LogprobOptions()
    if return_logprob is not None:
        options.return_logprob = return_logprob
    if not return_logprob:
        return options
    if start is not None:
        options.logprob_start_len = start
    if top_n is not None:
        options.top_logprobs_num = top_n
    options.token_ids_logprob.extend(token_ids or ())
    if return_text is not None:
        options.return_text_in_logprobs = return_text
    return options


def _token_id_key(key: str, param: str) -> int:
    try:
        token_id = int(key)
    except ValueError:
        raise invalid_request(f"'{param}' keys must be token ids, got {key!r}", param) from None
    if not 0 <= token_id < 2**32:
        raise invalid_request(f"'{param}' key {token_id} is not a token id", param)
    return token_id


def _strings(value: str | list[str], name: str) -> list[str]:
    values = [value] if isinstance(value, str) else value
    if any(not v for v in values):
        raise invalid_request(f"'{name}' must not contain empty strings", name)
    return values
