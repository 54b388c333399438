"""`/v1/embeddings` (OpenAI, with vLLM's extras) and `/pooling` (vLLM): pooled prompts as vectors."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request

from gateway.errors import unsupported
from gateway.pooling import Pooled, check_embed_dtype, encode_vector, pool, pooling_params
from gateway.pooling_protocol import EmbeddingRequest
from gateway.router_client import router_of

router = APIRouter()


def _prompts(body: EmbeddingRequest) -> list[str | list[int]]:
    """`input` as a list of prompts: a string or one token id list is one prompt."""
    value = body.input
    if isinstance(value, str):
        return [value]
    if value and all(isinstance(item, int) for item in value):
        return [[int(item) for item in value]]  # type: ignore[arg-type]
    return [item if isinstance(item, str) else list(item) for item in value]  # type: ignore[arg-type]


async def _embed(body: EmbeddingRequest, request: Request) -> Pooled:
    if body.messages is not None:
        raise unsupported("messages", "is not supported: give the text in 'input'")
    for name in ("chat_template", "chat_template_kwargs"):
        if getattr(body, name) is not None:
            raise unsupported(name, "applies to chat-style 'messages' input, which is not supported")
    check_embed_dtype(body.embed_dtype)
    params = pooling_params(body, dimensions=body.dimensions, normalize=body.normalize)
    return await pool(request, body, _prompts(body), params, "input")


def _usage(pooled: Pooled) -> dict[str, int]:
    return {"prompt_tokens": pooled.prompt_tokens, "total_tokens": pooled.prompt_tokens}


def _items(vectors: Sequence[list[float]], body: EmbeddingRequest, kind: str, key: str) -> list[dict[str, Any]]:
    return [
        {"object": kind, "index": i, key: encode_vector(vector, body.encoding_format, body.embed_dtype)}
        for i, vector in enumerate(vectors)
    ]


@router.post("/v1/embeddings")
async def create_embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
    pooled = await _embed(body, request)
    return {
        "id": f"embd-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": await router_of(request).model_name(body.model),
        "data": _items(pooled.vectors, body, "embedding", "embedding"),
        "usage": _usage(pooled),
    }


@router.post("/pooling")
async def create_pooling(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
    """vLLM's Pooling API: the same pooled vector as /v1/embeddings, under `data`."""
    pooled = await _embed(body, request)
    return {
        "id": f"pool-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": await router_of(request).model_name(body.model),
        "data": _items(pooled.vectors, body, "pooling", "data"),
        "usage": _usage(pooled),
    }
