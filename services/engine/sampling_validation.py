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
from dataclasses import dataclass, field
from typing import Any

from services.engine.config import EngineConfig
from services.engine.grammar.constraint import Constraint
from services.engine.grammar.constraint_limits import ConstraintLimits, check_constraint
from services.engine.processors.catalog import ProcessorCall, ProcessorCatalog
from services.engine.processors.thinking_budget import ThinkingBudget
from services.engine.sampling_params import BeamSettings, LogprobSettings, SamplingSettings
from turnout.errors import InvalidArgument
from turnout.struct_values import struct_to_dict
from turnout.v1 import common_pb2


@dataclass(frozen=True)
class Limits:
    """What the engine serving the request allows."""

    prompt_len: int
    max_model_len: int
    vocab_size: int
    max_logprobs: int = 20
    # Longest whitespace run a JSON constraint allows between tokens (--grammar-max-whitespace).
    grammar_max_whitespace: int | None = 4
    # Built-in and custom logits processors; None: the engine offers none.
    processors: ProcessorCatalog | None = None
    # Work one request may cause (EngineConfig's per-request limits, named by their flags in errors).
    max_n: int = EngineConfig.max_n
    max_stop_sequences: int = EngineConfig.max_stop_sequences
    max_stop_sequence_length: int = EngineConfig.max_stop_sequence_length
    grammar: ConstraintLimits = field(default_factory=ConstraintLimits)

    @classmethod
    def of_engine(
        cls,
        config: EngineConfig,
        *,
        prompt_len: int,
        max_model_len: int,
        vocab_size: int,
        processors: ProcessorCatalog | None,
    ) -> Limits:
        return cls(
            prompt_len=prompt_len,
            max_model_len=max_model_len,
            vocab_size=vocab_size,
            max_logprobs=config.max_logprobs,
            grammar_max_whitespace=config.grammar_max_whitespace,
            processors=processors,
            max_n=config.max_n,
            max_stop_sequences=config.max_stop_sequences,
            max_stop_sequence_length=config.max_stop_sequence_length,
            grammar=ConstraintLimits(max_bytes=config.max_grammar_bytes, max_depth=config.max_grammar_depth),
        )


class _Fields:
    """Reads one field: the request's value, else the default's, else the fallback.

    Every field read here has presence (`optional`), so the fields a message lists (ListFields: the
    set ones) are those whose HasField is true; listing both messages once costs less than the two
    HasField calls per field otherwise made for each of the ~30 fields read per request."""

    def __init__(self, request: common_pb2.SamplingParams, defaults: common_pb2.SamplingParams) -> None:
        self.request = request
        self.defaults = defaults
        # Name -> value of every field set in either message, the request's winning.
        self._set: dict[str, Any] = {field.name: value for field, value in defaults.ListFields()}
        self._set.update((field.name, value) for field, value in request.ListFields())

    def none_of(self, names: frozenset[str]) -> bool:
        """Whether neither message sets any of `names` (every get() of them gives its fallback)."""
        return names.isdisjoint(self._set)

    def get(self, name: str, fallback: float) -> float:
        value = self._set.get(name)
        if value is None:
            return fallback
        value = float(value)
        if not math.isfinite(value):
            raise InvalidArgument(f"{name} must be a finite number, got {value}")
        return value


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
    beam_search = params.HasField("use_beam_search") and params.use_beam_search
    if beam_search:
        # Beam search is greedy: the model's sampling defaults (temperature, top_p, ...) do not apply.
        greedy_defaults = common_pb2.SamplingParams()
        greedy_defaults.CopyFrom(defaults)
        for name in _SAMPLING_ONLY:
            greedy_defaults.ClearField(name)
        defaults = greedy_defaults
    f = _Fields(params, defaults)
    # First what bounds the request's size: nothing below allocates per sample or compiles anything.
    n, best_of = _samples(f, limits)
    if not beam_search:
        _check_no_beam(params)
    beam = _beam(params, f, best_of) if beam_search else None
    _check_stops(params, limits)
    constraint = _constraint(params, limits)
    processors, thinking_budget = _processors(params, limits)
    if constraint is not None and thinking_budget is not None:
        raise InvalidArgument(
            f"thinking_budget cannot be combined with a structured-output constraint ({constraint.kind}) yet: "
            "the constraint would apply to the thinking block too"
        )
    max_new, min_new = _lengths(f, limits)
    if max_new == 0 and best_of > 1:
        raise InvalidArgument(f"n and best_of must be 1 when max_new_tokens is 0 (prefill only), got {best_of}")

    temperature = 0.0 if beam is not None else f.get("temperature", 1.0)
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
        beam=beam,
        logprobs=_logprobs(logprob_options or common_pb2.LogprobOptions(), limits),
        constraint=constraint,
        logit_processors=processors,
        thinking_budget=thinking_budget,
    )
    return settings


# Parameters that only shape how a token is drawn: beam search refuses them (it never draws), and the
# model's generation_config values for them do not apply to it. Each with the value that leaves it off.
_SAMPLING_ONLY: dict[str, float] = {
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "typical_p": 1.0,
    "tfs": 1.0,
    "top_a": 0.0,
    "eta_cutoff": 0.0,
    "epsilon_cutoff": 0.0,
    "smoothing_factor": 0.0,
    "smoothing_curve": 1.0,
    "dynatemp_min": 0.0,
    "dynatemp_max": 0.0,
    "xtc_probability": 0.0,
    "nsigma": 0.0,
}
_EARLY_STOPPING: dict[str, bool | str] = {"true": True, "false": False, "never": "never"}


def _beam(params: common_pb2.SamplingParams, f: _Fields, width: int) -> BeamSettings:
    """The beam search settings, refusing what it cannot honour (vLLM's messages where it has them)."""
    for name, off in _SAMPLING_ONLY.items():
        value = f.get(name, off)
        if value != off and not (name == "top_k" and value == 0):
            shown = "-1" if name == "top_k" else _fmt(off)
            raise InvalidArgument(f"{name} must be {shown} when using beam search, got {_fmt(value)}")
    if params.stop or params.stop_regex:
        name = "stop" if params.stop else "stop_regex"
        raise InvalidArgument(
            f"{name} cannot be used with beam search: beams end on token ids only (use stop_token_ids)"
        )
    constraint = params.WhichOneof("constraint")
    if constraint is not None and not (constraint == "json_object" and not params.json_object):
        raise InvalidArgument(f"{constraint} (structured output) cannot be used with beam search")
    for name in ("custom_logit_processor", "thinking_budget"):
        if params.HasField(name):
            raise InvalidArgument(f"{name} cannot be used with beam search")
    if 0 < len(set(params.allowed_token_ids)) < width:
        # Fewer possible tokens than beams: the search could not keep `width` beams of finite probability.
        raise InvalidArgument(
            f"allowed_token_ids must hold at least best_of ({width}) ids when using beam search, "
            f"got {len(set(params.allowed_token_ids))}"
        )
    length_penalty = params.length_penalty if params.HasField("length_penalty") else 1.0
    if not math.isfinite(length_penalty):
        raise InvalidArgument(f"length_penalty must be a finite number, got {length_penalty}")
    early_stopping = params.early_stopping if params.HasField("early_stopping") else "false"
    if early_stopping not in _EARLY_STOPPING:
        raise InvalidArgument(f"early_stopping must be True, False, or 'never', got {early_stopping!r}")
    return BeamSettings(width, length_penalty, _EARLY_STOPPING[early_stopping])  # type: ignore[arg-type]


def _check_no_beam(params: common_pb2.SamplingParams) -> None:
    """Without beam search its knobs must keep their defaults (as vLLM)."""
    if params.HasField("early_stopping") and params.early_stopping != "false":
        raise InvalidArgument("early_stopping is not effective and must be False when not using beam search")
    if params.HasField("length_penalty") and params.length_penalty != 1.0:
        raise InvalidArgument(
            "length_penalty is not effective and must be the default value of 1.0 when not using beam search"
        )


def _samples(f: _Fields, limits: Limits) -> tuple[int, int]:
    """n and best_of: best_of samples are generated, so both are bounded by --max-n."""
    n = int(f.get("n", 1))
    if n < 1:
        raise InvalidArgument(f"n must be at least 1, got {n}")
    best_of = int(f.get("best_of", n))
    for name, value in (("n", n), ("best_of", best_of)):
        if value > limits.max_n:
            raise InvalidArgument(f"{name} must be at most {limits.max_n} (the server's --max-n), got {value}")
    if best_of < n:
        raise InvalidArgument(f"best_of must be at least n ({n}), got {best_of}")
    return n, best_of


def _check_stops(params: common_pb2.SamplingParams, limits: Limits) -> None:
    """Stop strings and regexes: none empty (it would match before any output), bounded count and length.
    Checked here, where every path (HTTP, the router's gRPC, the engine's) passes, before the router
    opens the tokenizer's Detokenize streams that match them."""
    count = len(params.stop) + len(params.stop_regex)
    if count > limits.max_stop_sequences:
        raise InvalidArgument(
            f"stop and stop_regex hold {count} entries together; at most {limits.max_stop_sequences} are allowed "
            "(the server's --max-stop-sequences)"
        )
    for name, values in (("stop", params.stop), ("stop_regex", params.stop_regex)):
        for i, value in enumerate(values):
            if not value:
                raise InvalidArgument(f"{name}[{i}] is empty: an empty {name} would end every output at once")
            if len(value) > limits.max_stop_sequence_length:
                raise InvalidArgument(
                    f"{name}[{i}] is {len(value)} characters long; at most {limits.max_stop_sequence_length} are "
                    "allowed (the server's --max-stop-sequence-length)"
                )


def _constraint(params: common_pb2.SamplingParams, limits: Limits) -> Constraint | None:
    """The structured-output constraint; its compile errors come from grammar/compiler.py."""
    kind = params.WhichOneof("constraint")
    if kind is None or (kind == "json_object" and not params.json_object):
        return None
    compact = params.disable_any_whitespace if params.HasField("disable_any_whitespace") else False
    if kind == "json_object":
        return Constraint("json_object", compact=compact, max_whitespace=limits.grammar_max_whitespace)
    if kind == "choice":
        values = tuple(dict.fromkeys(params.choice.values))  # distinct, in order
        if not values:
            raise InvalidArgument("choice: the list of choices must not be empty")
        if any(not v for v in values):
            raise InvalidArgument("choice: every choice must be a non-empty string")
        return Constraint("choice", choices=values)
    text = getattr(params, kind)
    if not text.strip():
        raise InvalidArgument(f"{kind} must not be empty")
    if kind == "json_schema":
        constraint = Constraint("json_schema", text, compact=compact, max_whitespace=limits.grammar_max_whitespace)
    else:
        constraint = Constraint(kind, text)
    check_constraint(constraint, limits.grammar)
    return constraint


def _processors(params: common_pb2.SamplingParams, limits: Limits) -> tuple[tuple[ProcessorCall, ...], int | None]:
    """The request's logits processors in the order they run, and its thinking budget.

    `thinking_budget` may also come SGLang-style as custom_logit_processor="thinking_budget" with
    custom_params {"thinking_budget": N}; the field wins when both are set."""
    custom = params.custom_logit_processor if params.HasField("custom_logit_processor") else None
    custom_params: dict[str, Any] = struct_to_dict(params.custom_params) if params.HasField("custom_params") else {}
    budget = int(params.thinking_budget) if params.HasField("thinking_budget") else None
    if custom_params and custom is None:
        raise InvalidArgument("custom_params is set but custom_logit_processor is not")
    if custom is None and budget is None:
        return (), None
    catalog = limits.processors
    if catalog is None:
        raise InvalidArgument("this engine offers no logits processors (custom_logit_processor / thinking_budget)")
    calls: list[ProcessorCall] = []
    if custom == ThinkingBudget.name and budget is None:
        budget = int(catalog.custom(custom, custom_params).params["thinking_budget"])
    elif custom is not None and custom != ThinkingBudget.name:
        calls.append(catalog.custom(custom, custom_params))
    if budget is not None:
        calls.append(catalog.thinking_budget(budget))
    return tuple(calls), budget


def _lengths(f: _Fields, limits: Limits) -> tuple[int, int]:
    context, prompt = limits.max_model_len, limits.prompt_len
    room = context - prompt
    if f.request.HasField("max_new_tokens") and f.request.max_new_tokens == 0:
        # Prefill only (pooling, SGLang's prompt scoring): the prompt may fill the whole context.
        if room < 0:
            raise InvalidArgument(
                f"This model's maximum context length is {context} tokens. However, your request has {prompt} "
                "input tokens. Please shorten the input."
            )
        if f.get("min_new_tokens", 0) > 0:
            raise InvalidArgument("min_new_tokens (min_tokens) must be 0 when max_new_tokens (max_tokens) is 0")
        return 0, 0
    if room <= 0:
        raise InvalidArgument(
            f"This model's maximum context length is {context} tokens. However, your request has {prompt} "
            "input tokens, which leaves no room for output. Please shorten the input."
        )
    max_new = f.get("max_new_tokens", room)
    if max_new < 1:  # a default of 0 (generation_config): only an explicit 0 asks for prefill only
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


# Aphrodite's samplers: name, default, low, high, low open.
_EXTRA_SAMPLER_RANGES: tuple[tuple[str, float, float, float, bool], ...] = (
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
_EXTRA_INTS: dict[str, int] = {"dry_allowed_length": 2, "no_repeat_ngram_size": 0}
_EXTRA_NAMES = frozenset(name for name, *_ in _EXTRA_SAMPLER_RANGES) | _EXTRA_INTS.keys()
# What _extra_samplers gives when neither the request nor the defaults set any of them (most requests).
_EXTRA_DEFAULTS: dict[str, Any] = {name: default for name, default, *_ in _EXTRA_SAMPLER_RANGES} | _EXTRA_INTS


def _extra_samplers(f: _Fields) -> dict[str, Any]:
    """Aphrodite's samplers, each with its range; the defaults leave them off."""
    if f.none_of(_EXTRA_NAMES):
        return dict(_EXTRA_DEFAULTS)
    values: dict[str, Any] = {}
    for name, default, low, high, low_open in _EXTRA_SAMPLER_RANGES:
        values[name] = f.get(name, default)
        _in_range(name, values[name], low, high, low_open=low_open)
    if values["dynatemp_max"] < values["dynatemp_min"]:
        raise InvalidArgument(
            f"dynatemp_max ({_fmt(values['dynatemp_max'])}) must not be below dynatemp_min "
            f"({_fmt(values['dynatemp_min'])})"
        )
    for name, default in _EXTRA_INTS.items():
        values[name] = int(f.get(name, default))
    return values


_NO_LOGPROBS = LogprobSettings()
# A logprob count of 2^32 - 1 (vLLM's -1) asks for every token of the vocabulary.
ALL_LOGPROBS = 2**32 - 1


def _logprobs(options: common_pb2.LogprobOptions, limits: Limits) -> LogprobSettings:
    if not options.ListFields():  # nothing asked for (most requests): all off, nothing to check
        return _NO_LOGPROBS
    top_n = options.top_logprobs_num
    prompt_top_n = options.input_top_logprobs_num if options.HasField("input_top_logprobs_num") else top_n
    names = ("top_logprobs_num (logprobs / top_logprobs)", "prompt_logprobs")
    counts = []
    for name, value in zip(names, (top_n, prompt_top_n), strict=True):
        if value == ALL_LOGPROBS:
            value = limits.vocab_size
            if value > limits.max_logprobs:
                raise InvalidArgument(
                    f"{name} -1 asks for the whole vocabulary ({value} tokens), more than the server's "
                    f"--max-logprobs ({limits.max_logprobs})"
                )
        elif value > limits.max_logprobs:
            raise InvalidArgument(
                f"{name} must be at most {limits.max_logprobs} (the server's --max-logprobs), got {value}"
            )
        counts.append(value)
    top_n, prompt_top_n = counts
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
