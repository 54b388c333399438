"""OpenAI-compatible routes: `/v1/models`, `/v1/completions`, `/v1/chat/completions`."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway import convert, sse
from gateway.errors import HTTPError
from gateway.generation import Generation, Sample, unless_disconnected
from gateway.openai_format import Head, View, chat_body, chat_chunks, completion_body, completion_chunks
from gateway.prompts import look_up
from gateway.protocol import ChatCompletionRequest, CompletionRequest, OpenAIRequest
from gateway.router_client import router_of
from turnout.v1 import common_pb2, inference_pb2

router = APIRouter()

BodyBuilder = Callable[[Head, View, Sequence[Sample]], dict[str, Any]]
ChunkStream = Callable[[Head, View, Generation, bool], AsyncGenerator[dict[str, Any], None]]


def _model_card(info: common_pb2.ModelInfo, created: int) -> dict[str, Any]:
    return {
        "id": info.name,
        "object": "model",
        "created": created,
        "owned_by": "turnout",
        "root": info.path,
        "parent": None,
        "max_model_len": info.max_context_length,
    }


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    models = await router_of(request).list_models()
    created = request.app.state.created
    return {"object": "list", "data": [_model_card(m, created) for m in models]}


# `:path` because served names often contain a slash (org/model).
@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    for info in await router_of(request).list_models():
        if info.name == model_id:
            return _model_card(info, request.app.state.created)
    raise HTTPError(404, f"model '{model_id}' does not exist", param="model")


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    response_id = f"cmpl-{body.request_id or uuid.uuid4().hex}"
    messages = convert.completion_requests(body, response_id)
    view = View(
        logprobs=body.logprobs,
        as_token_ids=bool(body.return_tokens_as_token_ids),
        prompt_logprobs=body.prompt_logprobs,
    )
    return await _respond(
        request, body, response_id, messages, view, bool(body.echo), completion_body, completion_chunks
    )


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    response_id = f"chatcmpl-{body.request_id or uuid.uuid4().hex}"
    message = convert.chat_request(body, response_id)
    view = View(
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        as_token_ids=bool(body.return_tokens_as_token_ids),
        prompt_logprobs=body.prompt_logprobs,
        stream_reasoning=body.stream_reasoning is not False,
        named_tool=message.tool_calling.mode == common_pb2.ToolCalling.NAMED,
    )
    return await _respond(request, body, response_id, [message], view, False, chat_body, chat_chunks)


async def _respond(
    request: Request,
    body: OpenAIRequest,
    response_id: str,
    messages: Sequence[inference_pb2.GenerateRequest],
    view: View,
    echo: bool,
    build_body: BodyBuilder,
    stream_chunks: ChunkStream,
) -> Response:
    client = router_of(request)

    async def begin() -> tuple[str, View, Generation]:
        model = await client.model_name(body.model)
        shown = view
        if echo:
            # With logprobs the prompt is listed from its first token, which has no logprob.
            wants_first = view.logprobs is not None
            echoes = await asyncio.gather(
                *(look_up(client, m, text=True, first=wants_first, first_text=not view.as_token_ids) for m in messages)
            )
            shown = dataclasses.replace(view, echoes=echoes)
        return model, shown, await client.generate(messages)

    model, shown, generation = await unless_disconnected(request, begin())
    head = Head(id=response_id, created=int(time.time()), model=model)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = stream_chunks(head, shown, generation, include_usage)
        return sse.SSEResponse(sse.frames(chunks), on_close=generation.cancel)
    samples = await unless_disconnected(request, generation.collect())
    return JSONResponse(build_body(head, shown, samples))
