"""Sampling settings of one request, resolved against defaults and validated, and
the per-request sampler of the skeleton engine.

Resolution order for every field: the request's value, else the model's
generation_config.json value, else the documented default. Parameters this
engine cannot honour yet are refused, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2

# Fields the skeleton engine does not implement; the full sampler comes later.
_UNSUPPORTED = (
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop_regex",
    "logit_bias",
    "constraint",
    "custom_params",
)


@dataclass(frozen=True)
class SamplingSettings:
    max_new_tokens: int
    min_new_tokens: int
    temperature: float
    top_p: float
    top_k: int  # 0: off
    min_p: float
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    seed: int | None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _pick(request: common_pb2.SamplingParams, defaults: common_pb2.SamplingParams, name: str, fallback: float) -> float:
    if request.HasField(name):
        return float(getattr(request, name))
    if defaults.HasField(name):
        return float(getattr(defaults, name))
    return fallback


def resolve(
    params: common_pb2.SamplingParams,
    defaults: common_pb2.SamplingParams,
    *,
    prompt_len: int,
    max_model_len: int,
) -> SamplingSettings:
    """Apply defaults and check every value; raise InvalidArgument naming the problem."""
    for name in _UNSUPPORTED:
        present = params.WhichOneof(name) is not None if name == "constraint" else _is_set(params, name)
        if present:
            raise InvalidArgument(f"sampling parameter '{name}' is not supported by this engine yet")
    if params.HasField("n") and params.n != 1:
        raise InvalidArgument(f"n={params.n} is not supported by this engine yet (only n=1)")

    room = max_model_len - prompt_len
    if room <= 0:
        raise InvalidArgument(
            f"this model's maximum context length is {max_model_len} tokens, but the prompt has {prompt_len} tokens"
        )
    max_new = int(_pick(params, defaults, "max_new_tokens", room))
    if max_new < 1:
        raise InvalidArgument(f"max_new_tokens must be at least 1, got {max_new}")
    if max_new > room:
        raise InvalidArgument(
            f"this model's maximum context length is {max_model_len} tokens; the prompt has {prompt_len} "
            f"and {max_new} new tokens were requested ({prompt_len + max_new} in all)"
        )
    min_new = int(_pick(params, defaults, "min_new_tokens", 0))
    if min_new > max_new:
        raise InvalidArgument(f"min_new_tokens ({min_new}) must not exceed max_new_tokens ({max_new})")

    temperature = _pick(params, defaults, "temperature", 1.0)
    top_p = _pick(params, defaults, "top_p", 1.0)
    top_k = int(_pick(params, defaults, "top_k", -1))
    min_p = _pick(params, defaults, "min_p", 0.0)
    if not temperature >= 0.0:
        raise InvalidArgument(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise InvalidArgument(f"top_p must be in (0, 1], got {top_p}")
    if top_k < -1:
        raise InvalidArgument(f"top_k must be -1 (off), 0 (off) or positive, got {top_k}")
    if not 0.0 <= min_p <= 1.0:
        raise InvalidArgument(f"min_p must be in [0, 1], got {min_p}")

    return SamplingSettings(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        min_p=min_p,
        stop_token_ids=frozenset(params.stop_token_ids),
        ignore_eos=params.ignore_eos if params.HasField("ignore_eos") else False,
        seed=params.seed if params.HasField("seed") else None,
    )


def _is_set(params: common_pb2.SamplingParams, name: str) -> bool:
    value = getattr(params, name)
    if name in ("stop_regex", "logit_bias"):
        return len(value) > 0
    if name == "custom_params":
        return params.HasField(name) and len(value.fields) > 0
    return params.HasField(name)


def sample_token(
    logits: torch.Tensor,  # (V,) float32
    settings: SamplingSettings,
    generator: torch.Generator | None,
    banned: Sequence[int] = (),
) -> int:
    """Pick the next token: banned ids out, then temperature, top-k, top-p, min-p, draw."""
    if banned:
        logits = logits.clone()
        logits[list(banned)] = float("-inf")
    if settings.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / settings.temperature, dim=-1)
    if settings.top_k:
        kth = torch.topk(probs, min(settings.top_k, probs.numel())).values[-1]
        probs = torch.where(probs < kth, 0.0, probs)
    if settings.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Drop a token when the mass before it already reaches top_p; the top token always stays.
        drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= settings.top_p * sorted_probs.sum()
        probs = probs.scatter(0, order, sorted_probs.masked_fill(drop, 0.0))
    if settings.min_p > 0.0:
        probs = torch.where(probs < settings.min_p * probs.max(), 0.0, probs)
    return int(torch.multinomial(probs, 1, generator=generator))
