"""OpenAI-compatible routes: `/v1/models`, `/v1/completions`, `/v1/chat/completions`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway import convert, request_id, sse
from gateway.batch_limit import check_batch_size, gather_bounded
from gateway.errors import HTTPError
from gateway.generation import Generation, Sample, unless_disconnected
from gateway.openai_format import Head, View, chat_body, chat_chunks, completion_body, completion_chunks
from gateway.prompts import Prompt, look_up
from gateway.protocol import ChatCompletionRequest, CompletionRequest, OpenAIRequest
from gateway.router_client import router_of
from gateway.sampling import logprob_count
from turnout.v1 import common_pb2, inference_pb2

router = APIRouter()

BodyBuilder = Callable[[Head, View, Sequence[Sample]], dict[str, Any]]
# A stream's chunks: objects, or their JSON text (gateway/chunk_json.py).
ChunkStream = Callable[[Head, View, Generation, bool], AsyncGenerator[dict[str, Any] | str, None]]


def _model_card(info: common_pb2.ModelInfo, created: int) -> dict[str, Any]:
    return {
        "id": info.name,
        "object": "model",
        "created": created,
        "owned_by": "turnout",
        "root": info.path,
        # vLLM: a LoRA adapter's card names its base model (root: the adapter's own path).
        "parent": info.parent or None,
        "max_model_len": info.max_context_length,
    }


async def _model_cards(request: Request) -> list[dict[str, Any]]:
    """The router's models; with --served-model-name, the default one listed once per name."""
    client = router_of(request)
    models = await client.list_models()
    # The listing's time, as vLLM and SGLang report it: the contract keeps no creation time, and a time
    # of this process's own would differ between the gateways of one server (--api-server-count).
    created = int(time.time())
    if not client.aliases:
        return [_model_card(m, created) for m in models]
    default = await client.model_info("")
    named = []
    for name in client.aliases:
        alias = common_pb2.ModelInfo(name=name, path=default.path, max_context_length=default.max_context_length)
        named.append(_model_card(alias, created))
    return named + [_model_card(m, created) for m in models if m.name != default.name]


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": await _model_cards(request)}


# `:path` because served names often contain a slash (org/model).
@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    for card in await _model_cards(request):
        if card["id"] == model_id:
            return card
    raise HTTPError(404, f"model '{model_id}' does not exist", param="model")


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    chosen = request_id.begin(request, body, body.request_id)
    _server_defaults(body, request)
    messages = convert.completion_requests(body, chosen)
    check_batch_size(request, len(messages), "prompt")
    view = View(
        logprobs=logprob_count(body.logprobs),
        as_token_ids=bool(body.return_tokens_as_token_ids),
        token_ids=bool(body.return_token_ids),
        prompt_logprobs=logprob_count(body.prompt_logprobs),
        continuous_usage=_continuous_usage(body),
        hidden_states=bool(body.return_hidden_states),
    )
    return await _respond(
        request, body, f"cmpl-{chosen}", messages, view, bool(body.echo), completion_body, completion_chunks
    )


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    chosen = request_id.begin(request, body, body.request_id)
    _server_defaults(body, request)
    message = convert.chat_request(body, chosen)
    echo = convert.chat_echo(body)
    view = View(
        logprobs=(logprob_count(body.top_logprobs) or 0) if body.logprobs else None,
        as_token_ids=bool(body.return_tokens_as_token_ids),
        token_ids=bool(body.return_token_ids),
        prompt_logprobs=logprob_count(body.prompt_logprobs),
        stream_reasoning=body.stream_reasoning is not False,
        named_tool=message.tool_calling.mode == common_pb2.ToolCalling.NAMED,
        echoes=[Prompt(text=echo)] if echo else (),
        continuous_usage=_continuous_usage(body),
        role=request.app.state.config.response_role,
        hidden_states=bool(body.return_hidden_states),
    )
    return await _respond(request, body, f"chatcmpl-{chosen}", [message], view, False, chat_body, chat_chunks)


def _server_defaults(body: OpenAIRequest, request: Request) -> None:
    """Request fields the server sets a default for (vLLM's --return-tokens-as-token-ids)."""
    if body.return_tokens_as_token_ids is None:
        body.return_tokens_as_token_ids = request.app.state.config.return_tokens_as_token_ids


def _continuous_usage(body: OpenAIRequest) -> bool:
    # As in vLLM, continuous_usage_stats only adds to include_usage.
    options = body.stream_options
    return bool(body.stream and options and options.include_usage and options.continuous_usage_stats)


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
    for message in messages:
        message.model = client.router_model(message.model)

    async def begin() -> tuple[str, View, Generation]:
        model = await client.model_name(body.model)
        shown = view
        if echo:
            # With logprobs the prompt is listed from its first token, which has no logprob.
            wants_first = view.logprobs is not None
            echoes = await gather_bounded(
                look_up(client, m, text=True, first=wants_first, first_text=not view.as_token_ids) for m in messages
            )
            shown = dataclasses.replace(view, echoes=echoes)
        return model, shown, await client.generate(messages)

    model, shown, generation = await unless_disconnected(request, begin())
    head = Head(id=response_id, created=int(time.time()), model=model)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = stream_chunks(head, shown, generation, include_usage)
        return sse.SSEResponse(sse.frames(chunks, generation.ready), on_close=generation.cancel)
    samples = await unless_disconnected(request, generation.collect())
    return JSONResponse(build_body(head, shown, samples))
