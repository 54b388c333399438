"""`POST /tokenize` and `POST /detokenize`, as vLLM and SGLang serve them.

`/tokenize` takes a text `prompt` (vLLM; a list of texts is a batch, as in
SGLang) or chat `messages` (vLLM: encoded as the chat template renders them,
with a generation prompt and without added special tokens by default) and
answers `{"count", "max_model_len", "tokens", "token_strs"}`; for a batch,
`count` and `tokens` are lists with one entry per text. `token_strs` is each
token decoded alone (vLLM shows raw vocabulary pieces instead, like `Ġhi`).
`/detokenize` answers the text under both peers' names: `prompt` (vLLM) and
`text` (SGLang). `GET /tokenizer_info` is vLLM's: the tokenizer's class and its
tokenizer_config.json settings, with the chat template it renders chats with.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import Field

from gateway import convert
from gateway.batch_limit import check_batch_size, gather_bounded
from gateway.errors import invalid_request
from gateway.protocol import U32, ChatMessageIn, ToolDefinition, _Body
from gateway.request_id import begin
from gateway.router_client import router_of
from turnout.v1 import inference_pb2

router = APIRouter()


class TokenizeRequest(_Body):
    """Exactly one of `prompt` and `messages`."""

    model: str | None = None
    prompt: str | list[str] | None = None
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)] | None = None
    # Default: true for a prompt, false for messages (the chat template adds its own).
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = False
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Rendered by the chat template, as in a chat request (vLLM's /tokenize takes them too).
    tools: list[ToolDefinition] | None = None


class DetokenizeRequest(_Body):
    model: str | None = None
    # One sequence of ids, or a batch of them (SGLang).
    tokens: list[U32] | list[list[U32]]
    skip_special_tokens: bool | None = None


def _tokenize_request(body: TokenizeRequest, text: str | None) -> inference_pb2.TokenizeRequest:
    request = inference_pb2.TokenizeRequest(model=body.model or "", return_token_strs=bool(body.return_token_strs))
    if text is not None:
        request.text = text
        if body.add_special_tokens is not None:
            request.add_special_tokens = body.add_special_tokens
        return request
    assert body.messages is not None
    convert.fill_chat_input(request.chat, body.messages, body)
    if not request.chat.options.HasField("add_generation_prompt"):
        request.chat.options.add_generation_prompt = True  # vLLM's /tokenize default, stated on the wire
    for tool in body.tools or []:
        request.chat.options.tools.add().update(tool.model_dump(exclude_none=True))
    request.add_special_tokens = bool(body.add_special_tokens)
    return request


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    begin(request, body)
    if (body.prompt is None) == (body.messages is None):
        raise invalid_request("exactly one of 'prompt' and 'messages' must be given", "prompt")
    client = router_of(request)
    if isinstance(body.prompt, list):
        if not body.prompt:
            raise invalid_request("'prompt' must not be an empty list", "prompt")
        check_batch_size(request, len(body.prompt), "prompt")
        replies = await gather_bounded(client.tokenize_request(_tokenize_request(body, p)) for p in body.prompt)
        return {
            "count": [len(r.input_ids) for r in replies],
            "max_model_len": replies[0].max_model_len,
            "tokens": [list(r.input_ids) for r in replies],
            "token_strs": [list(r.token_strs) for r in replies] if body.return_token_strs else None,
        }
    reply = await client.tokenize_request(_tokenize_request(body, body.prompt))
    return {
        "count": len(reply.input_ids),
        "max_model_len": reply.max_model_len,
        "tokens": list(reply.input_ids),
        "token_strs": list(reply.token_strs) if body.return_token_strs else None,
    }


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request, model: str | None = None) -> dict[str, Any]:
    """vLLM's shape: `tokenizer_class` and the settings beside it (`?model=` picks a served model)."""
    info = await router_of(request).tokenizer_info(model)
    return {"tokenizer_class": info.tokenizer_class, **json.loads(info.config_json or "{}")}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    begin(request, body)
    client = router_of(request)
    model = client.router_model(body.model)
    if body.tokens and isinstance(body.tokens[0], list):
        batch: list[list[int]] = body.tokens  # type: ignore[assignment]
        check_batch_size(request, len(batch), "tokens")
        texts = await gather_bounded(client.detokenize(model, ids, body.skip_special_tokens) for ids in batch)
        return {"prompt": list(texts), "text": list(texts)}
    text = await client.detokenize(model, body.tokens, body.skip_special_tokens)  # type: ignore[arg-type]
    return {"prompt": text, "text": text}
