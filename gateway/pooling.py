"""Pooled prompts for the HTTP routes: one router Generate call with `pooling` per prompt, all at once.

The engine pools each prompt's final hidden states (services/engine/pooling.py) and answers one
GenerateComplete carrying the vector; nothing is generated. Score and rerank are built on it: for
the decoder models served here, the score of a pair is the cosine similarity of their pooled,
normalised vectors (vLLM does the same for embedding models).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from fastapi import Request

from gateway import request_id
from gateway.batch_limit import check_batch_size
from gateway.errors import invalid_request, unsupported
from gateway.generation import unless_disconnected
from gateway.pooling_protocol import PoolingFields
from gateway.router_client import router_of
from turnout.v1 import common_pb2, inference_pb2

_TYPES = {
    "last": common_pb2.PoolingParams.LAST,
    "mean": common_pb2.PoolingParams.MEAN,
    "cls": common_pb2.PoolingParams.FIRST,
    "first": common_pb2.PoolingParams.FIRST,
}
# embed_dtype -> the numpy type a base64 vector is written in (little-endian, as vLLM).
_EMBED_DTYPES = {"float32": "<f4", "float16": "<f2"}


@dataclass(frozen=True)
class Pooled:
    vectors: list[list[float]]
    # Prompt tokens of every input, summed (usage.prompt_tokens).
    prompt_tokens: int


def pooling_params(
    body: PoolingFields, *, dimensions: int | None = None, normalize: bool | None = None
) -> common_pb2.PoolingParams:
    params = common_pb2.PoolingParams()
    if body.pooling_type is not None:
        kind = _TYPES.get(body.pooling_type.lower())
        if kind is None:
            raise invalid_request(
                f"pooling_type must be one of LAST, MEAN, CLS, got {body.pooling_type!r}", "pooling_type"
            )
        params.type = kind
    if dimensions is not None:
        params.dimensions = dimensions
    if normalize is not None:
        params.normalize = normalize
    return params


def check_prompts(prompts: Sequence[object], param: str) -> None:
    """400 naming `param` for no prompt or an empty one."""
    if not prompts:
        raise invalid_request(f"'{param}' must not be empty", param)
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise invalid_request(f"'{param}[{i}]' must not be empty", param)


async def pool(
    request: Request,
    body: PoolingFields,
    prompts: Sequence[str | Sequence[int]],
    params: common_pb2.PoolingParams,
    param: str,
) -> Pooled:
    """Pool every prompt (text or token ids) with `params`; vectors in prompt order."""
    check_prompts(prompts, param)
    check_batch_size(request, len(prompts), param)
    chosen = request_id.begin(request, body, body.request_id)
    client = router_of(request)
    sampling = common_pb2.SamplingParams(max_new_tokens=0)
    if body.truncate_prompt_tokens is not None:
        keep = body.truncate_prompt_tokens
        if keep == 0 or keep < -1:
            raise invalid_request(
                f"truncate_prompt_tokens must be -1 or at least 1, got {keep}", "truncate_prompt_tokens"
            )
        if keep > 0:
            sampling.truncate_prompt_tokens = keep
        else:  # -1: keep as many as the context holds
            info = await client.model_info(body.model or "")
            sampling.truncate_prompt_tokens = info.max_context_length
    messages = []
    for i, prompt in enumerate(prompts):
        message = inference_pb2.GenerateRequest(
            request_id=f"{chosen}-{i}" if len(prompts) > 1 else chosen,
            model=client.router_model(body.model),
            sampling_params=sampling,
            pooling=params,
        )
        if isinstance(prompt, str):
            message.text = prompt
        else:
            message.input_ids.ids.extend(prompt)
        if body.add_special_tokens is not None:
            message.add_special_tokens = body.add_special_tokens
        if body.priority is not None:
            message.priority = body.priority
        messages.append(message)
    generation = await unless_disconnected(request, client.generate(messages))
    samples = await unless_disconnected(request, generation.collect())
    return Pooled([s.embedding for s in samples], sum(s.prompt_tokens for s in samples))


def encode_vector(vector: list[float], encoding_format: str, embed_dtype: str | None) -> list[float] | str:
    """The vector as JSON numbers, or base64 of its little-endian bytes (float32 unless embed_dtype)."""
    dtype = _EMBED_DTYPES[embed_dtype or "float32"]
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype=dtype).tobytes()).decode("ascii")
    if embed_dtype not in (None, "float32"):
        return np.asarray(vector, dtype=dtype).astype(float).tolist()  # type: ignore[no-any-return]
    return vector


def check_embed_dtype(embed_dtype: str | None) -> None:
    if embed_dtype is not None and embed_dtype not in _EMBED_DTYPES:
        raise unsupported("embed_dtype", f"must be one of {', '.join(_EMBED_DTYPES)}, got {embed_dtype!r}")


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity; 0 when either vector is zero."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norms if norms > 0 else 0.0
