"""`POST /invocations`: SageMaker's one inference route, dispatched by the body's shape as vLLM does.

The first key of `ROUTES` the JSON body has decides which endpoint serves it;
the body is then validated and answered exactly as that endpoint would (its
400s, its stream). A body with none of the keys is a 400 naming them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from gateway import embeddings_api, native_api, openai_api
from gateway.errors import invalid_request
from gateway.pooling_protocol import EmbeddingRequest
from gateway.protocol import ChatCompletionRequest, CompletionRequest, NativeGenerateRequest

router = APIRouter()

Handler = Callable[[Any, Request], Awaitable[Any]]

# Body key -> (the endpoint's request model, its handler), tried in this order: chat bodies have
# `messages`, completions `prompt`, SGLang's /generate `text` or `input_ids`, embeddings `input`.
ROUTES: tuple[tuple[str, type[BaseModel], Handler], ...] = (
    ("messages", ChatCompletionRequest, openai_api.create_chat_completion),
    ("prompt", CompletionRequest, openai_api.create_completion),
    ("text", NativeGenerateRequest, native_api.generate),
    ("input_ids", NativeGenerateRequest, native_api.generate),
    ("input", EmbeddingRequest, embeddings_api.create_embeddings),
)


@router.post("/invocations")
async def invocations(request: Request) -> Response:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise invalid_request(
            "the request body must be a JSON object, sent as Content-Type: application/json"
        ) from None
    if not isinstance(body, dict):
        raise invalid_request("the request body must be a JSON object, sent as Content-Type: application/json")
    for key, model, handler in ROUTES:
        if key in body:
            try:
                parsed = model.model_validate(body)
            except ValidationError as exc:
                # The endpoint's own 400 (gateway.errors names the field).
                raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
            answer = await handler(parsed, request)
            return answer if isinstance(answer, Response) else JSONResponse(answer)
    keys = ", ".join(f"'{key}'" for key, _, _ in ROUTES)
    raise invalid_request(f"/invocations could not tell the endpoint: the body has none of {keys}")
