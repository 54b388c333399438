"""`/score`, `/v1/score` (vLLM) and `/rerank`, `/v1/rerank`, `/v2/rerank` (Jina / Cohere shapes).

The models served are decoder LMs, not cross-encoders: a pair's score is the cosine similarity of the
two texts' pooled, normalised vectors (as vLLM scores with an embedding model), in [-1, 1]. Rerank is
score with the query as text_1 and each document as text_2, sorted best first.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request

from gateway.errors import invalid_request
from gateway.pooling import cosine, pool, pooling_params
from gateway.pooling_protocol import PoolingFields, RerankRequest, ScoreRequest
from gateway.router_client import router_of

router = APIRouter()


def _pairs(text_1: str | list[str], text_2: str | list[str]) -> tuple[list[str], list[str]]:
    """vLLM's pairing: one text_1 (a string or a list of one) against every text_2, else zip."""
    left = [text_1] if isinstance(text_1, str) else text_1
    right = [text_2] if isinstance(text_2, str) else text_2
    if not left:
        raise invalid_request("'text_1' must not be empty", "text_1")
    if not right:
        raise invalid_request("'text_2' must not be empty", "text_2")
    for name, texts in (("text_1", left), ("text_2", right)):
        for i, text in enumerate(texts):
            if not text:
                raise invalid_request(f"'{name}[{i}]' must not be empty", name)
    if len(left) == 1:
        return left * len(right), right
    if len(left) != len(right):
        raise invalid_request(
            f"'text_1' has {len(left)} entries and 'text_2' {len(right)}: give one text_1, or as many as text_2",
            "text_2",
        )
    return left, right


async def _scores(request: Request, body: PoolingFields, left: list[str], right: list[str]) -> tuple[list[float], int]:
    """Cosine similarity of each pair, and the prompt tokens pooled; each distinct text is pooled once."""
    texts = list(dict.fromkeys([*left, *right]))
    pooled = await pool(request, body, texts, pooling_params(body), "text_1")
    vector = dict(zip(texts, pooled.vectors, strict=True))
    return [cosine(vector[a], vector[b]) for a, b in zip(left, right, strict=True)], pooled.prompt_tokens


@router.post("/score")
@router.post("/v1/score")
async def create_score(body: ScoreRequest, request: Request) -> dict[str, Any]:
    left, right = _pairs(body.text_1, body.text_2)
    scores, tokens = await _scores(request, body, left, right)
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": await router_of(request).model_name(body.model),
        "data": [{"index": i, "object": "score", "score": score} for i, score in enumerate(scores)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


@router.post("/rerank")
@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def create_rerank(body: RerankRequest, request: Request) -> dict[str, Any]:
    if not body.query:
        raise invalid_request("'query' must not be empty", "query")
    if not body.documents:
        raise invalid_request("'documents' must not be empty", "documents")
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    for i, text in enumerate(texts):
        if not text:
            raise invalid_request(f"'documents[{i}]' must not be empty", "documents")
    scores, tokens = await _scores(request, body, [body.query] * len(texts), texts)
    order = sorted(range(len(texts)), key=lambda i: (-scores[i], i))
    if body.top_n:
        order = order[: body.top_n]
    keep_text = body.return_documents is not False
    results = [
        {"index": i, **({"document": {"text": texts[i]}} if keep_text else {}), "relevance_score": scores[i]}
        for i in order
    ]
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": await router_of(request).model_name(body.model),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }
