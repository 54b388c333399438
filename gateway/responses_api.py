"""OpenAI's Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`.

A response is one chat completion underneath: `responses_input` turns the
body into the chat request it means and `convert.chat_request` into the
router's `GenerateRequest`, so the template, tools, structured outputs and
sampling are chat's. `responses_output` shapes what comes back. Streams are
OpenAI's typed events, each framed `event: {type}` + `data: {json}`, with no
`[DONE]` (OpenAI sends none). Stored responses (`store`, default true) live in
the gateway's bounded store (`responses_store.py`: in memory, or in an SQLite file that
several gateway processes share).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway import convert, request_id, sse
from gateway.errors import HTTPError, invalid_request, to_http_error
from gateway.generation import Generation, unless_disconnected
from gateway.protocol import ChatMessageIn
from gateway.responses_input import chat_completion, input_messages, output_messages
from gateway.responses_output import ResponseBuilder, new_id
from gateway.responses_protocol import ResponsesRequest
from gateway.responses_store import ResponseStoreLike
from gateway.router_client import router_of

router = APIRouter()


def store_of(request: Request) -> ResponseStoreLike:
    store: ResponseStoreLike = request.app.state.responses
    return store


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    chosen = request_id.begin(request, body, body.request_id)
    store = store_of(request)
    history: Sequence[ChatMessageIn] = ()
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id)
        if previous is None:
            raise invalid_request(
                f"'previous_response_id': response '{body.previous_response_id}' is not found (never stored, "
                "deleted, or evicted from the --responses-store-size most recent)",
                "previous_response_id",
            )
        history = previous.conversation
    message = convert.chat_request(chat_completion(body, history), chosen)
    client = router_of(request)
    message.model = client.router_model(message.model)

    async def begin() -> tuple[str, Generation]:
        return await client.model_name(body.model), await client.generate([message])

    model, generation = await unless_disconnected(request, begin())
    builder = ResponseBuilder(_base(body, model))
    stored = body.store is not False
    conversation = [*history, *input_messages(body)]

    def keep() -> None:
        if stored:
            store.put(builder.response(), [*conversation, *output_messages(*builder.output())])

    if body.stream:
        events = _events(builder, generation, keep)
        return sse.SSEResponse(sse.typed_frames(events), on_close=generation.cancel)
    await unless_disconnected(request, _run(builder, generation))
    builder.finish()
    keep()
    return JSONResponse(builder.response())


async def _run(builder: ResponseBuilder, generation: Generation) -> None:
    async with contextlib.aclosing(generation.events()) as events:
        async for event in events:
            builder.feed(event)


async def _events(
    builder: ResponseBuilder, generation: Generation, keep: Callable[[], None]
) -> AsyncGenerator[dict[str, Any], None]:
    for event in builder.start():
        yield event
    try:
        async with contextlib.aclosing(generation.events()) as events:
            async for sample_event in events:
                for event in builder.feed(sample_event):
                    yield event
    except Exception as exc:
        # The stream is 200 by now: the failure is OpenAI's `error` event, and the response is not stored.
        yield builder.error(to_http_error(exc))
        return
    finished = builder.finish()
    keep()
    for event in finished:
        yield event


def _base(body: ResponsesRequest, model: str) -> dict[str, Any]:
    """The Response fields the request decides, as OpenAI echoes them."""
    text_format = body.text.format if body.text is not None and body.text.format is not None else {"type": "text"}
    return {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "background": False,
        "error": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": None,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        "store": body.store is not False,
        "temperature": body.temperature,
        "text": {"format": text_format, "verbosity": "medium"},
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": body.tools or [],
        "top_logprobs": 0,
        "top_p": body.top_p,
        "truncation": "disabled",
        "user": body.user,
    }


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    entry = store_of(request).get(response_id)
    if entry is None:
        raise HTTPError(404, f"response '{response_id}' is not found", param="response_id")
    return entry.response


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    if not store_of(request).delete(response_id):
        raise HTTPError(404, f"response '{response_id}' is not found", param="response_id")
    return {"id": response_id, "object": "response.deleted", "deleted": True}
